"""``kiln.autocast`` / ``kiln.amp.autocast``: mixed precision regions, as ``torch.autocast``.

>>> import kiln
>>> layer = kiln.nn.Linear(4, 2)
>>> with kiln.autocast(device_type="cpu", dtype=kiln.bfloat16):
...     y = layer(kiln.randn(3, 4))
...     with kiln.autocast(device_type="cpu", enabled=False):
...         z = layer(kiln.randn(3, 4))
>>> y.dtype, z.dtype
(kiln.bfloat16, kiln.float32)

Inside a region, matmul, mm, bmm, einsum, linear, conv and scaled_dot_product_attention compute in the
low dtype; the losses (cross_entropy, nll_loss, mse_loss, l1_loss, binary_cross_entropy(_with_logits))
and prod compute in float32; every other op runs in the dtype of its inputs (``kiln.frontend.autocast``).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import kiln
from kiln.frontend.autocast import low_dtype, state

__all__ = ["autocast", "get_autocast_dtype", "is_autocast_enabled", "set_autocast_dtype", "set_autocast_enabled"]

_DEVICE_TYPES = ("cpu", "cuda")


def _check_device_type(device_type: str) -> str:
    if not isinstance(device_type, str) or device_type not in _DEVICE_TYPES:
        raise ValueError(f"autocast: device_type must be one of {', '.join(map(repr, _DEVICE_TYPES))}, "
                         f"got {device_type!r}")  # fmt: skip
    return device_type


class autocast:  # noqa: N801 - PyTorch's name
    """A context manager (and decorator) that runs the ops of its region in mixed precision.

    ``device_type``: "cpu" or "cuda"; ``dtype``: the low dtype (default bfloat16 on the CPU, float16 on
    CUDA); ``enabled=False`` turns autocast off inside an enclosing region. ``cache_enabled`` is accepted
    for PyTorch's signature (kiln casts a weight each time it is used)."""

    def __init__(self, device_type: str = "cuda", dtype: Any = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:  # fmt: skip
        self.device_type = _check_device_type(device_type)
        self.fast_dtype = low_dtype(device_type) if dtype is None else kiln.ir.dtypes.as_dtype(dtype)
        self._enabled = bool(enabled)
        supported = (kiln.float16, kiln.bfloat16)
        if self._enabled and self.fast_dtype not in supported:
            warnings.warn(f"In {device_type} autocast, but the target dtype {self.fast_dtype} is not supported "
                          "(expected kiln.bfloat16 or kiln.float16). Disabling autocast.", stacklevel=2)  # fmt: skip
            self._enabled = False
        self._saved: list[tuple[bool, Any]] = []

    def __enter__(self) -> autocast:
        device = self.device_type
        self._saved.append((state.enabled[device], state.dtype[device]))
        state.enabled[device] = self._enabled
        if self._enabled:
            state.dtype[device] = self.fast_dtype
        state.refresh()
        return self

    def __exit__(self, *exc_info) -> None:
        state.enabled[self.device_type], state.dtype[self.device_type] = self._saved.pop()
        state.refresh()

    def __call__(self, fn):
        @functools.wraps(fn)
        def autocast_region(*args, **kwargs):
            with autocast(self.device_type, self.fast_dtype, self._enabled):
                return fn(*args, **kwargs)

        return autocast_region


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    return state.enabled[_check_device_type(device_type)]


def set_autocast_enabled(device_type: str, enabled: bool) -> None:
    state.enabled[_check_device_type(device_type)] = bool(enabled)
    state.refresh()


def get_autocast_dtype(device_type: str):
    return low_dtype(_check_device_type(device_type))


def set_autocast_dtype(device_type: str, dtype) -> None:
    state.dtype[_check_device_type(device_type)] = kiln.ir.dtypes.as_dtype(dtype)
