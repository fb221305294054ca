"""``kiln.cuda.amp``: ``autocast`` with ``device_type="cuda"`` (float16 by default) and ``GradScaler("cuda")``,
as ``torch.cuda.amp``. PyTorch deprecates these spellings for ``torch.amp``; ported programs still use them."""

from __future__ import annotations

from typing import Any

from ..amp import GradScaler as _GradScaler
from ..amp import autocast as _autocast

__all__ = ["GradScaler", "autocast"]


class autocast(_autocast):  # noqa: N801 - PyTorch's name
    def __init__(self, enabled: bool = True, dtype: Any = None, cache_enabled: bool | None = None) -> None:
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(_GradScaler):
    """``kiln.amp.GradScaler("cuda", ...)``."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:  # fmt: skip
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled)
