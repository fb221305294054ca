"""``kiln.cpu``: PyTorch's ``torch.cpu`` namespace, for code written against it (``torch.cpu.amp.autocast``)."""

from . import amp

__all__ = ["amp", "current_device", "device_count", "is_available", "synchronize"]


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> str:
    return "cpu"


def synchronize(device=None) -> None:
    """CPU work is done when its call returns: nothing to wait for."""
