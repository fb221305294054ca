"""Constants whose size follows a dynamic size, rebuilt in the symbolic graph from their pattern.

A trace records what factories and index tables compute (``kiln.arange(T)``, the keep-mask that
``kiln.tril`` builds) as constants of the traced call's size. Two traces at two sizes hold two
different arrays; when both are the same pattern at their sizes, the symbolic graph computes the
pattern at every size (``dynamic.symbolize``):

- a range: ``start + step * i`` along its one dimension, ``start`` and ``step`` whole numbers;
- a triangle: ``(j - i) <= k`` (``tril``) or ``(j - i) >= k`` (``triu``) over the last two dims,
  the same for every leading index (a causal mask).

Indices come from ``cumsum`` over ones, exact in int64. Anything else stays a constant, and the
call stays static (``dynamic.NotDynamic`` says why).
"""

from __future__ import annotations

import numpy as np

from ...ir import dtypes as dt
from ...ir.graph import GraphBuilder, Value
from ...ir.types import Dim, TensorType

__all__ = ["pattern_constant"]


def pattern_constant(builder: GraphBuilder, a: np.ndarray, b: np.ndarray, out_type: TensorType, loc) -> Value | None:
    """The value of ``out_type`` (symbolic) that is ``a`` at the first traced size and ``b`` at the
    second, computed from its pattern; None when it has none of the module docstring's patterns."""
    if a.ndim != b.ndim or a.ndim != out_type.ndim or not a.size or not b.size:
        return None
    step = _range_step(a, b)
    if step is not None:
        index = _index(builder, out_type.shape[0], 0, 1, out_type.device, loc)
        values = _affine(builder, index, int(a[0]), step, loc)
        return _as(builder, values, out_type, loc)
    triangle = _triangle(a, b)
    if triangle is not None:
        return _triangle_mask(builder, *triangle, out_type, loc)
    return None


def _range_step(a: np.ndarray, b: np.ndarray) -> int | None:
    """The step of ``a`` and ``b`` when both are ``start + step * i`` with whole ``start`` and ``step``."""
    if a.ndim != 1 or a.dtype.kind not in "iuf" or a.dtype != b.dtype or len(a) < 2 or len(b) < 2:
        return None
    start, step = a[0], a[1] - a[0]
    if start != int(start) or step != int(step) or b[0] != start or b[1] - b[0] != step:
        return None
    for array in (a, b):
        if not np.array_equal(array, start + step * np.arange(len(array), dtype=np.int64)):
            return None
    return int(step)


def _triangle(a: np.ndarray, b: np.ndarray) -> tuple[int, bool] | None:
    """``(k, lower)`` when ``a`` and ``b`` are booleans ``(j - i) <= k`` (``lower``) or ``>= k`` over
    their last two dims, alike for every leading index."""
    if a.dtype != np.bool_ or b.dtype != np.bool_ or a.ndim < 2:
        return None
    found = None
    for k in range(-1, 2):  # the diagonals tril/triu take in a mask: -1, 0 and 1
        for lower in (True, False):
            if all(np.array_equal(array, _triangle_array(array.shape, k, lower)) for array in (a, b)):
                found = (k, lower)
    return found


def _triangle_array(shape: tuple[int, ...], k: int, lower: bool) -> np.ndarray:
    rows, cols = shape[-2:]
    offsets = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    return np.broadcast_to(offsets <= k if lower else offsets >= k, shape)


def _index(builder: GraphBuilder, n: Dim, axis: int, ndim: int, device, loc) -> Value:
    """int64 ``0, 1, ..., n - 1`` along ``axis`` of a value with ``ndim`` dims (size 1 elsewhere)."""
    shape = tuple(n if d == axis else 1 for d in range(ndim))
    one = builder.constant(np.ones((1,) * ndim, np.int64), TensorType((1,) * ndim, dt.int64, device), loc)
    ones = builder.node("expand", [one], {"shape": shape}, loc=loc)
    counts = builder.node("cumsum", [ones], {"axis": axis, "reverse": False}, loc=loc)
    return _affine(builder, counts, -1, 1, loc)


def _affine(builder: GraphBuilder, x: Value, start: int, step: int, loc) -> Value:
    """``start + step * x`` (int64)."""
    scalar = TensorType((), dt.int64, x.type.device)
    if step != 1:
        x = builder.node("mul", [x, builder.constant(np.array(step, np.int64), scalar, loc)], loc=loc)
    if start:
        x = builder.node("add", [x, builder.constant(np.array(start, np.int64), scalar, loc)], loc=loc)
    return x


def _as(builder: GraphBuilder, x: Value, out_type: TensorType, loc) -> Value:
    return x if x.type.dtype is out_type.dtype else builder.node("cast", [x], {"dtype": out_type.dtype}, loc=loc)


def _triangle_mask(builder: GraphBuilder, k: int, lower: bool, out_type: TensorType, loc) -> Value:
    """The boolean triangle of ``out_type``'s last two dims, expanded to its shape."""
    rows, cols = out_type.shape[-2:]
    i = _index(builder, rows, 0, 2, out_type.device, loc)
    j = _index(builder, cols, 1, 2, out_type.device, loc)
    offsets = builder.node("sub", [j, i], loc=loc)
    diagonal = builder.constant(np.array(k, np.int64), TensorType((), dt.int64, out_type.device), loc)
    keep = builder.node("le" if lower else "ge", [offsets, diagonal], loc=loc)
    if keep.type.shape == out_type.shape:
        return keep
    return builder.node("expand", [keep], {"shape": out_type.shape}, loc=loc)
