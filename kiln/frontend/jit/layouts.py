"""Memory layouts of the arrays a trace and its specializations reason about: whether one array's
memory lies inside another's, whether an array is dense (C order or a permutation of it), and
copies laid out as eager's arrays were."""

from __future__ import annotations

import numpy as np


def dense_order(array: np.ndarray) -> list[int] | None:
    """The axes of ``array`` from the largest stride to the smallest when its elements fill its
    memory with no gaps (C order, or a permutation of it, as numpy's results keep their inputs'
    layouts), else None."""
    order = sorted(range(array.ndim), key=lambda d: -array.strides[d])
    step = array.itemsize
    for d in reversed(order):
        if array.shape[d] != 1 and array.strides[d] != step:
            return None
        step *= array.shape[d]
    return order


def in_layout(array: np.ndarray, strides: tuple) -> np.ndarray:
    """``array``, or a copy of it laid out with ``strides`` (those of a dense array of its shape)."""
    if array.strides == strides:
        return array
    order = sorted(range(array.ndim), key=lambda d: -strides[d])
    out = np.empty([array.shape[d] for d in order], array.dtype).transpose(np.argsort(order))
    out[...] = array
    return out


def is_identity(positions: np.ndarray, size: int) -> bool:
    """Whether ``positions`` (flat indices into an array of ``size`` elements) is every element in order."""
    return positions.size == size and bool((positions.reshape(-1) == np.arange(size)).all())


def contains(outer, inner) -> bool:
    """Whether array ``inner``'s memory lies within array ``outer``'s."""
    lo, hi = np.lib.array_utils.byte_bounds(outer)
    ilo, ihi = np.lib.array_utils.byte_bounds(inner)
    return lo <= ilo and ihi <= hi
