"""``kiln.utils``: PyTorch's ``torch.utils`` paths -- ``data`` (the same package as ``kiln.data``),
``checkpoint`` (activation checkpointing) and ``tensorboard`` (imported by its path: it needs the
``tensorboard`` package)."""

from . import checkpoint, data

__all__ = ["checkpoint", "data"]
