"""``kiln.nn.attention``: PyTorch's ``SDPBackend`` and ``sdpa_kernel``.

PyTorch picks among fused attention kernels (flash, memory-efficient, cuDNN) and the plain math
one; kiln has one implementation of ``F.scaled_dot_product_attention`` (the math formula, fused by
the compiler), so choosing a backend is accepted and checked but changes nothing.

>>> import kiln
>>> with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
...     pass
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import IntEnum

__all__ = ["SDPBackend", "sdpa_kernel", "WARN_FOR_UNFUSED_KERNELS"]

WARN_FOR_UNFUSED_KERNELS = False

_current: list = []


class SDPBackend(IntEnum):
    """The attention kernels PyTorch can choose from (same names and values)."""

    ERROR = -1
    MATH = 0
    FLASH_ATTENTION = 1
    EFFICIENT_ATTENTION = 2
    CUDNN_ATTENTION = 3
    OVERRIDEABLE = 4


@contextlib.contextmanager
def sdpa_kernel(backends, set_priority: bool = False) -> Iterator[None]:
    """Limit ``scaled_dot_product_attention`` to ``backends`` within the block (accepted; no effect in kiln)."""
    chosen = [backends] if isinstance(backends, SDPBackend) else backends
    if not isinstance(chosen, list | tuple) or not all(isinstance(b, SDPBackend) for b in chosen):
        raise AssertionError("Backend must be an instance of SDPBackend or a list of SDPBackend instances")
    _current.append(list(chosen))
    try:
        yield
    finally:
        _current.pop()
