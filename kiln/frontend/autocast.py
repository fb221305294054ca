"""Autocast's state and the op decorator that reads it (the public side is ``kiln.amp.autocast``).

An op decorated with ``autocast_op(LOWER)`` (matmul, linear, conv...) runs, inside an enabled autocast
region for its inputs' device type, on copies of its floating-point tensor arguments cast to the
region's low dtype (bfloat16 on the CPU by default); ``autocast_op(FLOAT32)`` (losses, prod) casts them
to float32. Other ops run on what they are given, so a layer_norm or softmax of a bfloat16 activation
stays bfloat16, exactly as PyTorch's CPU autocast lists have it. float64 tensors are never cast
(PyTorch's rule too). The casts are ordinary differentiable ops: a float32 parameter used under
autocast gets a float32 gradient.

When no region is enabled the decorated op pays one attribute test. The state is per thread, as in
PyTorch.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..ir import dtypes as dt
from .ops._util import cast
from .tensor import Tensor

__all__ = ["FLOAT32", "LOWER", "autocast_op", "key", "state"]

LOWER, FLOAT32 = "lower", "float32"
F = TypeVar("F", bound=Callable)


class _State(threading.local):
    def __init__(self) -> None:
        self.any = False  # some device type has autocast enabled: the one test an op pays when off
        self.enabled = {"cpu": False, "cuda": False}
        self.dtype: dict[str, Any] = {"cpu": None, "cuda": dt.float16}  # cpu: bfloat16, made when first needed

    def refresh(self) -> None:
        self.any = any(self.enabled.values())


state = _State()


def key() -> tuple | None:
    """What a compiled function's guard records of autocast: None when off, else each enabled region's
    dtype by name (the CPU's bfloat16 is made when an op first needs it: None until then, which
    ``set_autocast_enabled("cpu", True)`` alone leaves)."""
    if not state.any:
        return None
    return tuple((device, _LOW_NAMES.get(device, "?") if state.dtype[device] is None else state.dtype[device].name)
                 for device, on in state.enabled.items() if on)  # fmt: skip


_LOW_NAMES = {"cpu": "bfloat16"}  # what ``low_dtype`` makes of a region's dtype left None


def low_dtype(device_type: str) -> dt.DType:
    if state.dtype[device_type] is None:
        state.dtype[device_type] = dt.bfloat16_dtype()
    return state.dtype[device_type]


def autocast_op(policy: str) -> Callable[[F], F]:
    """Decorate an op so that autocast regions cast its floating-point tensor arguments (see module docs)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def op(*args, **kwargs):
            if not state.any:
                return fn(*args, **kwargs)
            return _autocast_call(fn, policy, args, kwargs)

        return op  # type: ignore[return-value]

    return decorate


def _autocast_call(fn: Callable, policy: str, args: tuple, kwargs: dict):
    device_type = next((a._device.type for a in _tensors(args, kwargs)), None)
    if device_type is None or not state.enabled.get(device_type, False):
        return fn(*args, **kwargs)
    target = low_dtype(device_type) if policy == LOWER else dt.float32
    convert = functools.partial(_cast_arg, target=target)
    return fn(*map(convert, args), **{k: convert(v) for k, v in kwargs.items()})


def _tensors(args: tuple, kwargs: dict):
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, list | tuple):
            yield from (t for t in a if isinstance(t, Tensor))


def _cast_arg(a: Any, target: dt.DType) -> Any:
    if isinstance(a, Tensor):
        eligible = a._dtype.is_floating_point and a._dtype is not dt.float64 and a._dtype is not target
        return cast(a, target) if eligible else a
    if isinstance(a, list | tuple) and any(isinstance(t, Tensor) for t in a):
        return type(a)(_cast_arg(t, target) for t in a)
    return a
