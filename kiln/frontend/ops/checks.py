"""Checks on values (index ranges, class targets, integer division by zero) that raise.

Eagerly a check raises at once and leaves no trace. While a call is traced it also records a
``check`` node (``kiln.ir.primitives.checks``) at the user's line, so that every compiled call of
that trace raises what the eager call raises: the check is part of the program, not of the
traced call (DESIGN.md, "The compile pipeline": checks are nodes of the graph).

- ``check(ok, error, message, shown=None)``: raise ``error(message)`` unless every element of
  the bool tensor ``ok`` holds; ``{value}`` in ``message`` is the element of ``shown`` at the
  first position where ``ok`` does not hold.
- ``check_range(index, low, high, error, message)``: every element of an integer tensor in
  ``[low, high)``; ``check_nonzero(divisor, error, message)``: no element is zero. Eagerly these
  read the array directly (no kiln ops: they sit on the hot paths of indexing and division);
  traced, the comparisons are recorded (they fuse into one kernel) and a check reads them.

>>> import kiln
>>> check_range(kiln.tensor([0, 3]), 0, 3, IndexError, "index {value} is out of bounds")
Traceback (most recent call last):
  ...
IndexError: index 3 is out of bounds
"""

from __future__ import annotations

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.primitives.checks import ERRORS, check_failure
from ...runtime.devices import array_namespace
from ..dispatch import apply
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor
from ._util import scalar_tensor

__all__ = ["check", "check_range", "check_nonzero"]

_check, _ge, _lt, _ne, _and = P["check"], P["ge"], P["lt"], P["ne"], P["logical_and"]


def _error_name(error: type[Exception]) -> str:
    name = getattr(error, "__name__", None)
    if ERRORS.get(name) is not error:  # type: ignore[arg-type]
        raise ValueError(f"check: error must be one of {', '.join(ERRORS)}, got {error!r}")
    return name  # type: ignore[return-value]


def _tracing():
    return _jit.current.get() if _jit.tracing else None


def check(ok: Tensor, error: type[Exception], message: str, shown: Tensor | None = None) -> None:
    """Raise ``error(message)`` unless all of the bool tensor ``ok`` holds, now and, when traced, on
    every compiled call (``{value}`` in ``message``: ``shown`` where ``ok`` first fails)."""
    attrs = {"error": _error_name(error), "message": message}
    if not isinstance(ok, Tensor) or ok._dtype is not dt.bool_:
        raise TypeError(f"check: expected a bool tensor of conditions, got {getattr(ok, 'dtype', type(ok).__name__)}")
    if shown is not None and (not isinstance(shown, Tensor) or shown._data.shape != ok._data.shape):
        raise ValueError(f"check: expected the shown values as a tensor of the conditions' shape {list(ok.shape)}, "
                         f"got {getattr(shown, 'shape', type(shown).__name__)}")  # fmt: skip
    inputs = (ok,) if shown is None else (ok, shown)
    xp = np if ok._device.type == "cpu" else array_namespace(ok._device)
    result = _check.eager(xp, *(t._data for t in inputs), **attrs)  # raises
    trace = _tracing()
    if trace is not None:
        trace.record(_check, inputs, attrs, make_tensor(result, ok._device))


def check_range(index: Tensor, low: int | None, high: int | None, error: type[Exception], message: str) -> None:
    """Raise unless every element of the integer tensor ``index`` is in ``[low, high)`` (None: no bound)."""
    if _tracing() is not None:
        device, dtype = index._device, index._dtype
        bounds = [apply(_ge, index, scalar_tensor(low, dtype, device))] if low is not None else []
        if high is not None:
            bounds.append(apply(_lt, index, scalar_tensor(high, dtype, device)))
        check(apply(_and, *bounds) if len(bounds) == 2 else bounds[0], error, message, index)
        return
    data = index._data
    if data.size and not _within(data, low, high):
        xp = np if index._device.type == "cpu" else array_namespace(index._device)
        ok = xp.ones(data.shape, dtype=bool)
        if low is not None:
            ok &= data >= low
        if high is not None:
            ok &= data < high
        raise check_failure(xp, ok, (data,), _error_name(error), message)


def _within(data, low: int | None, high: int | None) -> bool:
    """Whether every element of the non-empty integer array ``data`` is in ``[low, high)``."""
    if low == 0 and high is not None and data.dtype.kind == "i":
        # read as unsigned, a negative is larger than any bound: one pass where min and max made two
        # (1.1 us against 1.8 for an LSTM LM's (16, 35) token ids)
        return bool(data.view(data.dtype.str.replace("i", "u")).max() < high)
    return not ((low is not None and data.min() < low) or (high is not None and data.max() >= high))


def check_nonzero(divisor: Tensor, error: type[Exception], message: str) -> None:
    """Raise ``error(message)`` if any element of ``divisor`` is zero."""
    if _tracing() is not None:
        check(apply(_ne, divisor, scalar_tensor(0, divisor._dtype, divisor._device)), error, message)
    elif not divisor._data.all():
        raise error(message)
