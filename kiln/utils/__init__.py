"""``kiln.utils``: PyTorch's ``torch.utils`` paths -- ``data`` (the same package as ``kiln.data``) and
``checkpoint`` (activation checkpointing)."""

from . import checkpoint, data

__all__ = ["checkpoint", "data"]
