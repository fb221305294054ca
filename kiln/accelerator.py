"""``kiln.accelerator``: the current accelerator, as ``torch.accelerator`` (CUDA when kiln can use it)."""

from __future__ import annotations

from . import cuda
from .ir.types import device as _device

__all__ = ["is_available", "current_accelerator", "device_count", "current_device_index", "synchronize"]


def is_available() -> bool:
    return cuda.is_available()


def current_accelerator(check_available: bool = False):
    """``kiln.device("cuda")`` when a GPU is usable, else None (kiln knows no other accelerator)."""
    return _device("cuda") if cuda.is_available() else None


def device_count() -> int:
    return cuda.device_count()


def current_device_index() -> int:
    return 0 if cuda.is_available() else -1


def synchronize(device=None) -> None:
    if cuda.is_available():
        cuda.synchronize()
