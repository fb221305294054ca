"""Mixed precision: ``autocast`` regions and ``GradScaler``, as ``torch.amp``.

``kiln.autocast`` is ``kiln.amp.autocast``; ``kiln.cpu.amp.autocast`` is the CPU-only spelling PyTorch
also has.
"""

from .autocast_mode import autocast, get_autocast_dtype, is_autocast_enabled, set_autocast_dtype, set_autocast_enabled
from .grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast", "get_autocast_dtype", "is_autocast_enabled", "set_autocast_dtype",
           "set_autocast_enabled"]  # fmt: skip
