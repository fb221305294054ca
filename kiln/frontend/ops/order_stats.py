"""Order statistics and value-dependent results: ``median``, ``kthvalue``, ``quantile``, ``mode``,
``cummax``/``cummin``, ``unique``, ``bincount``, ``histc``, ``searchsorted``, ``bucketize``.

``median``, ``nanmedian``, ``kthvalue``, ``quantile``, ``nanquantile`` and ``msort`` pick ranks of
the ``argsort`` primitive's order with tensor ops (the ranks themselves may depend on how many nan
a row holds), so they compile: the sort runs as an extern node at every call; ``cummax`` and
``cummin`` are a scan over primitives when traced (numpy's accumulate eagerly), and a traced ``searchsorted``/``bucketize`` counts the
entries before each value with comparisons, so they compile too. The others read the
values with numpy to decide which elements (or how many) they return; under ``kiln.compile`` that
stops the trace with a reason naming the op and the call finishes eagerly. Returned values are
gathered from the input at the chosen positions, so they carry the gradient to the selected
elements, as PyTorch's do; integer results (indices, counts) carry none.
"""

from __future__ import annotations

import math
from collections import namedtuple
from typing import Literal

import numpy as np

from ...ir import dtypes as dt
from ...ir.shapes import normalize_axis
from ..jit import state as _jit
from ..tensor import Tensor, method
from ._util import cast
from .checks import check
from .compat import argsort, sort
from .copies import cat, constant
from .creation import arange, full, zeros
from .elementwise import (
    add,
    ceil,
    clamp,
    eq,
    floor,
    floor_divide,
    ge,
    gt,
    isnan,
    le,
    logical_and,
    logical_not,
    logical_or,
    lt,
    mul,
    round,
    sub,
    where,
)
from .indexing import gather
from .reductions import sum
from .shape import expand, movedim, narrow, reshape, squeeze, unsqueeze

__all__ = [
    "median", "nanmedian", "kthvalue", "mode", "msort", "quantile", "nanquantile", "cummax", "cummin", "unique",
    "unique_consecutive", "bincount", "histc", "searchsorted", "bucketize",
]  # fmt: skip

MedianResult = namedtuple("median", ["values", "indices"])  # type: ignore[name-match]  # torch.return_types names
NanmedianResult = namedtuple("nanmedian", ["values", "indices"])  # type: ignore[name-match]
KthvalueResult = namedtuple("kthvalue", ["values", "indices"])  # type: ignore[name-match]
ModeResult = namedtuple("mode", ["values", "indices"])  # type: ignore[name-match]
CummaxResult = namedtuple("cummax", ["values", "indices"])  # type: ignore[name-match]
CumminResult = namedtuple("cummin", ["values", "indices"])  # type: ignore[name-match]


def _values_of(input: Tensor, op: str) -> np.ndarray:
    """The input's values for numpy; under tracing the trace stops here, with a reason naming ``op``."""
    if _jit.tracing:
        _jit.unsafe(f"{op} has no compiled form (which elements it returns depends on the values)")
    return input.detach()._host()


def _rows(input: Tensor, dim: int, op: str) -> tuple[np.ndarray, int]:
    """The values with ``dim`` moved last, and ``dim`` made non-negative (0-d counts as 1-d)."""
    values = _values_of(input, op)
    if values.ndim == 0:
        return values.reshape(1), 0
    dim = normalize_axis(dim, values.ndim)
    return np.moveaxis(values, dim, -1), dim


def _select(input: Tensor, dim: int, index: np.ndarray, keepdim: bool, result):
    """``result(values, indices)`` of the entries at ``index`` (one per row along ``dim``)."""
    if input.ndim == 0:
        return result(input.clone(), constant(np.asarray(index.reshape(()), dtype=np.int64), input.device))
    index_t = constant(np.ascontiguousarray(np.expand_dims(index.astype(np.int64), dim)), input.device)
    values = gather(input, dim, index_t)
    if not keepdim:
        values, index_t = squeeze(values, dim), squeeze(index_t, dim)
    return result(values, index_t)


def _nonempty(input: Tensor, dim: int, op: str) -> None:
    if input.ndim and input.shape[dim] == 0:
        raise IndexError(f"{op}(): Expected reduction dim {dim} to have non-zero size.")


def _by_rank(input: Tensor, dim: int, rank: Tensor, keepdim: bool, result):
    """``result(values, indices)`` of the elements of sorted rank ``rank`` (an int64 tensor shaped
    like ``input`` with ``dim`` of size 1) along ``dim``: the ``argsort`` primitive's order, so a
    compiled call runs the sort as an extern node, and the values gathered with their gradient."""
    index = gather(argsort(input, dim), dim, rank)
    values = gather(input, dim, index)
    if not keepdim:
        values, index = squeeze(values, dim), squeeze(index, dim)
    return result(values, index)


def _constant_rank(input: Tensor, dim: int, rank: int) -> Tensor:
    shape = list(input.shape)
    shape[dim] = 1
    return full(tuple(shape), rank, dtype=dt.int64, device=input.device)


def _no_bool(input: Tensor, kernel: str) -> None:
    if input.dtype is dt.bool_:
        raise NotImplementedError(f"\"{kernel}\" not implemented for 'Bool'")


def _median(input: Tensor, dim, keepdim: bool, ignore_nan: bool, result):
    op = "nanmedian" if ignore_nan else "median"
    _no_bool(input, "median_cpu" if dim is None else "median_out")
    if dim is None:
        flat = reshape(input, (-1,))
        if flat.shape[0] == 0:
            return full((), math.nan, dtype=input.dtype, device=input.device)
        return _median(flat, 0, False, ignore_nan, result).values
    if input.ndim == 0:
        normalize_axis(dim, 1)
        return result(input.clone(), zeros((), dtype=dt.int64, device=input.device))
    dim = normalize_axis(dim, input.ndim)
    _nonempty(input, dim, op)
    n = input.shape[dim]
    if not input.dtype.is_floating_point:
        return _by_rank(input, dim, _constant_rank(input, dim, (n - 1) // 2), keepdim, result)
    nans = sum(isnan(input), dim, keepdim=True)  # int64; nan sorts last
    if ignore_nan:  # the lower median of the n - nans numbers (rank 0, a nan, when all are nan)
        rank = clamp(floor_divide(sub(n - 1, nans), 2), min=0)
    else:  # a row with nan: its first nan, which sorts at rank n - nans
        rank = where(gt(nans, 0), sub(n, nans), (n - 1) // 2)
    return _by_rank(input, dim, rank, keepdim, result)


@method("median")
def median(input: Tensor, dim=None, keepdim: bool = False):
    """The lower median (of all elements, or ``(values, indices)`` along ``dim``); nan if a row has nan."""
    return _median(input, dim, keepdim, False, MedianResult)


@method("nanmedian")
def nanmedian(input: Tensor, dim=None, keepdim: bool = False):
    """The lower median of the non-nan elements (nan where all are nan)."""
    return _median(input, dim, keepdim, True, NanmedianResult)


@method("kthvalue")
def kthvalue(input: Tensor, k: int, dim: int = -1, keepdim: bool = False):
    """The k-th smallest element (1-based) along ``dim`` and its position; nan counts as the largest."""
    _no_bool(input, "kthvalue_cpu")
    if input.ndim == 0:
        normalize_axis(dim, 1)
        if k != 1:
            raise IndexError(f"kthvalue(): selected number k out of range for dimension 0 (k={k}, size 1)")
        return KthvalueResult(input.clone(), zeros((), dtype=dt.int64, device=input.device))
    dim = normalize_axis(dim, input.ndim)
    n = input.shape[dim]
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim} (k={k}, size {n})")
    return _by_rank(input, dim, _constant_rank(input, dim, k - 1), keepdim, KthvalueResult)


@method("mode")
def mode(input: Tensor, dim: int = -1, keepdim: bool = False):
    """The most frequent value along ``dim`` (the smallest of equally frequent ones) and the
    position of its last occurrence, as PyTorch's CPU kernel."""
    rows, dim = _rows(input, dim, "mode")
    _nonempty(input, dim, "mode")
    flat = rows.reshape(-1, rows.shape[-1])
    index = np.empty(flat.shape[0], dtype=np.int64)
    for r, row in enumerate(flat):
        values, counts = np.unique(row, return_counts=True)  # sorted: argmax picks the smallest of the ties
        best = values[np.argmax(counts)]
        same = np.isnan(row) if np.isnan(best) else row == best
        index[r] = row.shape[0] - 1 - np.argmax(same[::-1])
    return _select(input, dim, index.reshape(rows.shape[:-1]), keepdim, ModeResult)


@method("msort")
def msort(input: Tensor) -> Tensor:
    return sort(input, 0).values


def _cumulative(input: Tensor, dim: int, larger: bool, result):
    """A doubling scan (see ``more_reductions``) of (value, position) pairs that keeps the later pair
    unless the earlier one is strictly beyond it: the running extreme, ties going to the later
    position, and a nan, once met, kept (a later nan takes over, as in PyTorch). It is the
    lexicographic extreme of (value with nan beyond everything, position), so the scan is exact;
    it compiles, and the values are gathered at the positions so they carry the gradient."""
    if input.ndim == 0:
        normalize_axis(dim, 1)
        return result(input.clone(), zeros((), dtype=dt.int64, device=input.device))
    dim = normalize_axis(dim, input.ndim)
    if not _jit.tracing:  # eagerly numpy's accumulate finds the same positions in one pass (~10x faster)
        return _cumulative_numpy(input, dim, larger, result)
    n = input.shape[dim]
    values = input.detach()
    shape = [1] * input.ndim
    shape[dim] = n
    index = expand(reshape(arange(n, device=input.device), tuple(shape)), tuple(input.shape))
    beyond = gt if larger else lt
    shift = 1
    while shift < n:
        v0, i0 = narrow(values, dim, 0, n - shift), narrow(index, dim, 0, n - shift)
        v1, i1 = narrow(values, dim, shift, n - shift), narrow(index, dim, shift, n - shift)
        keep_earlier = beyond(v0, v1)
        if values.dtype.is_floating_point:
            keep_earlier = logical_or(
                logical_and(keep_earlier, logical_not(isnan(v1))), logical_and(isnan(v0), logical_not(isnan(v1)))
            )
        values = cat([narrow(values, dim, 0, shift), where(keep_earlier, v0, v1)], dim)
        index = cat([narrow(index, dim, 0, shift), where(keep_earlier, i0, i1)], dim)
        shift *= 2
    return result(gather(input, dim, index), index)


def _cumulative_numpy(input: Tensor, dim: int, larger: bool, result):
    rows = np.moveaxis(input.detach()._host(), dim, -1)
    pick = np.maximum if larger else np.minimum  # they propagate nan, as the scan's rule does
    running = pick.accumulate(rows, axis=-1) if rows.shape[-1] else rows
    # A position takes over when it equals the running extreme (ties: the later one) or is nan.
    takes_over = (rows == running) | (np.isnan(rows) if rows.dtype.kind == "f" else False)
    positions = np.where(takes_over, np.arange(rows.shape[-1]), 0)
    index = np.maximum.accumulate(positions, axis=-1) if rows.shape[-1] else positions
    index_t = constant(np.ascontiguousarray(np.moveaxis(index.astype(np.int64), -1, dim)), input.device)
    return result(gather(input, dim, index_t), index_t)


@method("cummax")
def cummax(input: Tensor, dim: int):
    """The running maximum along ``dim`` and where it was reached (the later of equal values)."""
    return _cumulative(input, dim, True, CummaxResult)


@method("cummin")
def cummin(input: Tensor, dim: int):
    return _cumulative(input, dim, False, CumminResult)


# ----------------------------------------------------------------------------- quantiles
_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(input: Tensor, q, dim, keepdim: bool, interpolation: str, ignore_nan: bool) -> Tensor:
    """Sorted along the reduced dim (the ``argsort`` primitive: it compiles), the values at the two
    ranks around q (count - 1) gathered (with their gradient) and interpolated, as PyTorch."""
    op = "nanquantile" if ignore_nan else "quantile"
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"{op}() input tensor must be either float or double dtype")
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(f"{op}() interpolation must be one of {', '.join(_INTERPOLATIONS)}. Got '{interpolation}'")
    scalar_q = not isinstance(q, Tensor) or q.ndim == 0
    if isinstance(q, Tensor):
        if q.dtype is not input.dtype:
            raise RuntimeError(f"{op}() q tensor must be same dtype as the input tensor")
        if q.ndim > 1:
            raise RuntimeError(f"{op}() q must be a scalar or 1D tensor")
        q = reshape(q, (-1,))
        check(logical_and(ge(q, 0.0), le(q, 1.0)), RuntimeError, f"{op}() q values must be in the range [0, 1]")
    else:
        if not 0 <= float(q) <= 1:
            raise RuntimeError(f"{op}() q values must be in the range [0, 1]")
        q = full((1,), float(q), dtype=input.dtype, device=input.device)
    if dim is None:
        x, axis = reshape(input, (-1,)), 0
    else:
        axis = normalize_axis(dim, max(input.ndim, 1))
        x = input if input.ndim else reshape(input, (1,))
    n = x.shape[axis]
    if n == 0:
        raise RuntimeError(f"{op}() input tensor must be non-empty")
    ordered = movedim(sort(x, axis).values, axis, -1)  # (..., n), nan last
    if ignore_nan:
        count = cast(sub(n, sum(isnan(ordered), -1, keepdim=True)), input.dtype)  # (..., 1)
        ranks = mul(q, clamp(sub(count, 1.0), min=0.0))  # (..., Q), in the input's dtype as PyTorch's
        invalid = eq(count, 0.0)  # all nan
    else:
        ranks = expand(mul(q, float(n - 1)), tuple(ordered.shape[:-1]) + (q.shape[0],))
        invalid = isnan(narrow(ordered, -1, n - 1, 1))  # a nan anywhere sorts last
    if interpolation == "nearest":
        ranks = round(ranks)  # half to even, as PyTorch's
    lo, hi = floor(ranks), ceil(ranks)
    low, high = gather(ordered, -1, cast(lo, dt.int64)), gather(ordered, -1, cast(hi, dt.int64))
    weight = {"lower": 0.0, "higher": 1.0, "midpoint": 0.5}.get(interpolation)
    out = add(low, mul(sub(high, low), sub(ranks, lo) if weight is None else weight))
    out = movedim(where(invalid, math.nan, out), -1, 0)  # (Q, ...)
    if keepdim:
        out = unsqueeze(out, axis + 1) if dim is not None else reshape(out, (out.shape[0],) + (1,) * input.ndim)
    return reshape(out, tuple(out.shape[1:])) if scalar_q else out


@method("quantile")
def quantile(input: Tensor, q, dim=None, keepdim: bool = False, *, interpolation: str = "linear") -> Tensor:
    """The q-th quantiles along ``dim`` (all elements when None): q's dims first, then the rest;
    nan where a row has nan. Interpolates between the two nearest ranks, as PyTorch."""
    return _quantile(input, q, dim, keepdim, interpolation, False)


@method("nanquantile")
def nanquantile(input: Tensor, q, dim=None, keepdim: bool = False, *, interpolation: str = "linear") -> Tensor:
    """quantile over the non-nan elements of each row (nan where all are nan)."""
    return _quantile(input, q, dim, keepdim, interpolation, True)


# ----------------------------------------------------------------------------- unique, counts
def _out(array: np.ndarray, like: Tensor, dtype=None) -> Tensor:
    return constant(np.array(array, dtype=dtype, order="C"), like.device)  # 0-d stays 0-d


@method("unique")
def unique(input: Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False, dim=None):  # noqa: A002
    """The distinct values (sorted), and optionally where each element went and how often each occurs."""
    values = _values_of(input, "unique")
    if dim is None:
        found = np.unique(values.reshape(-1), return_inverse=True, return_counts=True)
        inverse_shape = values.shape
    else:
        dim = normalize_axis(dim, values.ndim)
        found = np.unique(values, return_inverse=True, return_counts=True, axis=dim)
        inverse_shape = (values.shape[dim],)
    out = [_out(found[0], input)]
    if return_inverse:
        out.append(_out(found[1].reshape(inverse_shape), input, np.int64))
    if return_counts:
        out.append(_out(found[2], input, np.int64))
    return out[0] if len(out) == 1 else tuple(out)


@method("unique_consecutive")
def unique_consecutive(input: Tensor, return_inverse: bool = False, return_counts: bool = False, dim=None):
    """One element of each run of equal consecutive elements (or slices along ``dim``)."""
    values = _values_of(input, "unique_consecutive")
    if dim is None:
        rows, moved = values.reshape(-1, 1), None
    else:
        dim = normalize_axis(dim, values.ndim)
        moved = np.moveaxis(values, dim, 0)
        rows = moved.reshape(moved.shape[0], -1)
    starts = np.ones(rows.shape[0], dtype=bool)
    starts[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    first = np.flatnonzero(starts)
    kept = values.reshape(-1)[first] if moved is None else np.moveaxis(moved[first], 0, dim)
    out = [_out(kept, input)]
    if return_inverse:
        inverse = np.cumsum(starts) - 1
        out.append(_out(inverse.reshape(values.shape if dim is None else (-1,)), input, np.int64))
    if return_counts:
        out.append(_out(np.diff(np.append(first, rows.shape[0])), input, np.int64))
    return out[0] if len(out) == 1 else tuple(out)


@method("bincount")
def bincount(input: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """How often each non-negative integer occurs (int64), or the sum of its ``weights`` (a float
    dtype: float32 weights stay float32, others give float64, as PyTorch's)."""
    values = _values_of(input, "bincount")
    if values.ndim != 1 or input.dtype.category != dt.INTEGER or (values.size and values.min() < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is None:
        return _out(np.bincount(values, minlength=minlength), input, np.int64)
    if tuple(weights.shape) != tuple(input.shape):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    w = _values_of(weights, "bincount")
    dtype = np.float32 if weights.dtype is dt.float32 else np.float64
    return _out(np.bincount(values, w.astype(np.float64), minlength=minlength), input, dtype)


@method("histc")
def histc(input: Tensor, bins: int = 100, min=0, max=0) -> Tensor:  # noqa: A002 - PyTorch's names
    """A histogram of ``bins`` equal bins over [min, max] (the data's range when both are 0);
    elements outside are ignored, the last bin includes max."""
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"\"histogram_cpu\" not implemented for '{input.dtype.name.capitalize()}'")
    if bins <= 0:
        raise RuntimeError(f"torch.histc: bins must be > 0, but got {bins} for bins")
    values = _values_of(input, "histc").reshape(-1).astype(np.float64)
    lo, hi = float(min), float(max)
    if lo > hi:
        raise RuntimeError(f"torch.histc: max must be larger than min, but got min {lo} max {hi}")
    if lo == hi and values.size:
        lo, hi = float(values.min()), float(values.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise RuntimeError(f"torch.histc: range of [{lo}, {hi}] is not finite")
    inside = values[(values >= lo) & (values <= hi)]
    # PyTorch's bin: floor((x - min) * bins / (max - min)), the max itself in the last bin.
    which = np.minimum(((inside - lo) * bins / (hi - lo)).astype(np.int64), bins - 1)
    return _out(np.bincount(which, minlength=bins).astype(input.dtype.np), input)


@method("searchsorted")
def searchsorted(sorted_sequence: Tensor, input, *, out_int32: bool = False, right: bool = False, side=None,
                 sorter=None) -> Tensor:  # fmt: skip
    """Where each value would be inserted into the (last dim of the) sorted sequence to keep it
    sorted: before equal entries, or after them with ``right=True`` / ``side="right"``; nan is largest."""
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"side can only be 'left' or 'right' but got {side}")
        if right and side == "left":
            raise RuntimeError("side and right can't be set to opposites, got side of left while right was True")
        right = side == "right"
    if sorted_sequence.ndim > 1 and (
        not isinstance(input, Tensor) or tuple(input.shape[:-1]) != tuple(sorted_sequence.shape[:-1])
    ):
        raise RuntimeError(
            "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of "
            f"boundaries tensor and input value tensor must match, but we got boundaries tensor "
            f"{list(sorted_sequence.shape)} and input value tensor {list(getattr(input, 'shape', ()))}"
        )
    _no_bool(sorted_sequence, "searchsorted_out_cpu")
    dtype = np.int32 if out_int32 else np.int64
    if _jit.tracing:
        return _searchsorted_by_counting(sorted_sequence, input, right, sorter, dt.int32 if out_int32 else dt.int64)
    seq = _values_of(sorted_sequence, "searchsorted")
    values = np.asarray(input) if not isinstance(input, Tensor) else _values_of(input, "searchsorted")
    if sorter is not None:
        seq = np.take_along_axis(seq, _values_of(sorter, "searchsorted"), -1)
    how: Literal["left", "right"] = "right" if right else "left"
    if seq.ndim <= 1:
        found = np.searchsorted(seq.reshape(-1), values, side=how)
    else:
        flat_seq, flat_values = seq.reshape(-1, seq.shape[-1]), values.reshape(-1, values.shape[-1])
        found = np.stack([np.searchsorted(s, v, side=how) for s, v in zip(flat_seq, flat_values)]).reshape(values.shape)
    return _out(np.asarray(found), sorted_sequence, dtype)


def _before(a: Tensor, b: Tensor) -> Tensor:
    """a < b in the sorted order, where nan comes after every number (as numpy's and torch's sorts)."""
    if not (a.dtype.is_floating_point or b.dtype.is_floating_point):
        return lt(a, b)
    return logical_or(lt(a, b), logical_and(isnan(b), logical_not(isnan(a))))


def _searchsorted_by_counting(seq: Tensor, input, right: bool, sorter, dtype) -> Tensor:
    """searchsorted as a count of the sequence's entries before each value (left) or not after it
    (right): comparisons and a sum, which compile; the same integers as numpy's binary search, at
    the cost of a (values x sequence) comparison."""
    if sorter is not None:
        seq = gather(seq, -1, sorter)
    values = (
        input if isinstance(input, Tensor) else full((), input, dtype=dt.result_type(seq, input), device=seq.device)
    )
    if seq.ndim <= 1:
        s, v = reshape(seq, (-1,)), unsqueeze(values, -1)
    else:
        s, v = unsqueeze(seq, -2), unsqueeze(values, -1)
    n = seq.shape[-1] if seq.ndim else 1
    if right:
        found = sub(n, sum(_before(v, s), -1))
    else:
        found = sum(_before(s, v), -1)
    return cast(found, dtype)


@method("bucketize")
def bucketize(input, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:
    """The bucket of each value: i with boundaries[i-1] < x <= boundaries[i] (``right=True``:
    boundaries[i-1] <= x < boundaries[i])."""
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)
