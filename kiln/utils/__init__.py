"""``kiln.utils``: PyTorch's ``torch.utils`` paths -- ``data`` (the same package as ``kiln.data``),
``checkpoint`` (activation checkpointing), ``hooks`` (the handle a hook registration returns) and
``tensorboard`` (imported by its path: it needs the ``tensorboard`` package)."""

from . import checkpoint, data, hooks

__all__ = ["checkpoint", "data", "hooks"]
