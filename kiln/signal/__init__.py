"""``kiln.signal``: PyTorch's ``torch.signal`` (the ``windows`` submodule)."""

from . import windows

__all__ = ["windows"]
