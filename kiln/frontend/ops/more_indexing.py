"""More of PyTorch's indexing names over ``index_put``, ``gather`` and ``scatter_add``:
``index_copy``, ``index_fill``, ``masked_scatter``, ``select_scatter``, ``slice_scatter``,
``scatter_reduce``, ``index_reduce``, ``unravel_index``, ``pdist``; integer names without a primitive (``gcd``,
``lcm``, ``frexp``); and small Tensor predicates.

The integer ops kiln has no primitive for run numpy's kernel on the values: under
``kiln.compile`` that stops the trace with a reason naming the op (the call finishes eagerly).
(The ``bitwise_*`` ops have primitives: ``bitwise.py``.)
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import dtypes as dt
from ...ir.shapes import normalize_axis
from ..autograd.grad_mode import is_grad_enabled
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor, method
from ._util import cast
from .checks import check_range
from .copies import constant
from .creation import ones_like, zeros_like
from .elementwise import div, eq, floor_divide, lt, remainder, where
from .indexing import gather, index_put, index_select, nonzero, scatter_add
from .more_linalg import cdist
from .reductions import cumsum
from .shape import expand, movedim, reshape

__all__ = [
    "index_copy", "index_fill", "masked_scatter", "select_scatter", "slice_scatter", "scatter_reduce", "index_reduce",
    "unravel_index", "argwhere", "pdist", "gcd", "lcm", "frexp",
    "angle",
]  # fmt: skip


# ----------------------------------------------------------------------------- copies into slices
@method("index_copy")
def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """A copy of ``input`` whose slices ``index`` along ``dim`` are ``source``'s (in order)."""
    if input.ndim == 0:
        return index_put(input.reshape(1), (index.reshape(-1),), source.reshape(-1)).reshape(())
    if index.ndim > 1:
        raise IndexError(f"index_copy_(): Index should have dimension 1 or 0 (got {index.ndim})")
    if source.dtype is not input.dtype:
        raise RuntimeError(
            f"index_copy_(): self and source expected to have the same dtype, but got (self) "
            f"{input.dtype.name} and (source) {source.dtype.name}"
        )
    dim = normalize_axis(dim, input.ndim)
    moved = movedim(input, dim, 0)
    values = movedim(source, dim, 0) if source.ndim == input.ndim else source
    return movedim(index_put(moved, (reshape(index, (-1,)),), values), 0, dim)


@method("index_fill")
def index_fill(input: Tensor, dim: int, index: Tensor, value) -> Tensor:
    """A copy of ``input`` with the slices ``index`` along ``dim`` set to ``value`` (a number or a 0-d tensor)."""
    if isinstance(value, Tensor) and value.ndim != 0:
        raise RuntimeError(
            f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with {value.ndim} dimension(s)."
        )
    if input.ndim == 0:
        return index_fill(input.reshape(1), 0, index, value).reshape(())
    dim = normalize_axis(dim, input.ndim)
    moved = movedim(input, dim, 0)
    fill = value.to(input.dtype) if isinstance(value, Tensor) else value
    return movedim(index_put(moved, (reshape(index, (-1,)),), fill), 0, dim)


@method("masked_scatter")
def masked_scatter(input: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """A copy of ``input`` whose elements where ``mask`` holds are ``source``'s first elements, in
    order. Traceable: the k-th True takes source[k] by a running count of the mask."""
    if mask.dtype is not dt.bool_:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype {mask.dtype.name}")
    if source.dtype is not input.dtype:
        raise RuntimeError(
            f"masked_scatter: expected self and source to have same dtypes but got {input.dtype.name} and {source.dtype.name}"
        )
    mask = expand(mask, tuple(input.shape)) if tuple(mask.shape) != tuple(input.shape) else mask
    flat_mask = reshape(mask, (-1,))
    if source.numel() == 0:
        return input.clone()  # nothing to take (torch then requires the mask to be all False)
    position = cumsum(cast(flat_mask, dt.int64), 0) - 1
    position = where(flat_mask, position, 0)
    picked = gather(reshape(source, (-1,)), 0, position)
    return where(mask, reshape(picked, tuple(input.shape)), input)


@method("select_scatter")
def select_scatter(input: Tensor, src: Tensor, dim: int, index: int) -> Tensor:
    """A copy of ``input`` with ``input.select(dim, index)`` replaced by ``src``."""
    dim = normalize_axis(dim, input.ndim)
    n = input.shape[dim]
    if not -n <= index < n:
        raise IndexError(
            f"select(): index {index} out of range for tensor of size {list(input.shape)} at dimension {dim}"
        )
    expected = tuple(input.shape[:dim] + input.shape[dim + 1 :])
    if tuple(src.shape) != expected:
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = {list(src.shape)}, "
                           f"slice size = {list(expected)}")  # fmt: skip
    idx = constant(np.asarray([index % n], dtype=np.int64), input.device)
    return index_copy(input, dim, idx, src.unsqueeze(dim))


@method("slice_scatter")
def slice_scatter(input: Tensor, src: Tensor, dim: int = 0, start=None, end=None, step: int = 1) -> Tensor:
    """A copy of ``input`` with the slice ``start:end:step`` along ``dim`` replaced by ``src``."""
    dim = normalize_axis(dim, input.ndim)
    positions = np.arange(input.shape[dim])[slice(start, end, step)].astype(np.int64)
    expected = list(input.shape)
    expected[dim] = len(positions)
    if list(src.shape) != expected:
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = {list(src.shape)}, "
                           f"slice size = {expected}")  # fmt: skip
    if len(positions) == 0:
        return input.clone()
    return index_copy(input, dim, constant(positions, input.device), src)


_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


@method("scatter_reduce")
def scatter_reduce(input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *, include_self: bool = True):
    """``src`` reduced into ``input`` at ``index`` along ``dim`` with sum, prod, mean, amax or amin
    (``include_self=False``: the scattered-to positions start from the first contribution).

    sum and mean compose ``scatter_add`` (gradients, compiled); prod, amax and amin run numpy's
    ``ufunc.at`` on the values (a trace stops there) and have no gradient in kiln yet."""
    if reduce not in _REDUCTIONS:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    dim = normalize_axis(dim, input.ndim)
    touched = scatter_add(zeros_like(input, dtype=dt.int64), dim, index, ones_like(index))
    base = input if include_self else where(eq(touched, 0), input, zeros_like(input))
    if reduce in ("sum", "mean"):
        total = scatter_add(base, dim, index, src)
        if reduce == "sum":
            return total
        count = touched + (1 if include_self else 0)
        count = where(eq(count, 0), 1, count)
        if input.dtype.is_floating_point:
            return div(total, cast(count, input.dtype))
        return floor_divide(total, cast(count, input.dtype))
    if is_grad_enabled() and (input.requires_grad or src.requires_grad):
        raise RuntimeError(f"scatter_reduce(reduce={reduce!r}) has no gradient in kiln yet (sum and mean have)")
    if _jit.tracing:
        _jit.unsafe(f"scatter_reduce(reduce={reduce!r}) has no compiled form")
    out = input.detach()._host().copy()
    idx, values, start = index._host(), src.detach()._host(), touched._host()
    ufunc = {"prod": np.multiply, "amax": np.maximum, "amin": np.minimum}[reduce]
    if not include_self:
        identity = {"prod": 1, "amax": -np.inf, "amin": np.inf}[reduce]
        if out.dtype.kind != "f" and reduce != "prod":
            info = np.iinfo(out.dtype) if out.dtype.kind in "iu" else None
            identity = (info.min if reduce == "amax" else info.max) if info is not None else identity
        out = np.where(start > 0, np.asarray(identity).astype(out.dtype), out)
    grid: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    grid[dim] = idx
    ufunc.at(out, tuple(grid), values[tuple(slice(0, s) for s in idx.shape)])
    return constant(out, input.device)


_INDEX_REDUCTIONS = ("prod", "mean", "amax", "amin")


@method("index_reduce")
def index_reduce(input: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *, include_self: bool = True):
    """``source``'s slices along ``dim`` reduced into ``input``'s slices ``index`` with prod, mean, amax
    or amin: ``scatter_reduce`` with the index spread over each slice (so mean has a gradient and
    compiles; prod, amax and amin run as ``scatter_reduce``'s do)."""
    if reduce not in _INDEX_REDUCTIONS:
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}.")
    if index.ndim > 1:
        raise IndexError(f"index_reduce_(): Index is supposed to be a vector, but got dim: {index.ndim}")
    if index.dtype not in (dt.int64, dt.int32):
        raise RuntimeError(f"index_reduce_(): Expected dtype int32/int64 for index but got {index.dtype.name}")
    if source.dtype is not input.dtype:
        raise RuntimeError(
            f"index_reduce_(): self ({input.dtype.name}) and source ({source.dtype.name}) must have the same scalar type"
        )
    if input.ndim == 0 or source.ndim != input.ndim:
        raise RuntimeError(
            f"index_reduce_(): source ({source.ndim}D) and self ({input.ndim}D) must have as many dims, at least one"
        )
    dim = normalize_axis(dim, input.ndim)
    count = source.shape[dim]
    if index.numel() != count:
        raise RuntimeError(
            f"index_reduce_(): Number of indices ({index.numel()}) should be equal to source.size(dim): ({count}), "
            f"for dim: {dim}"
        )
    check_range(index, 0, input.shape[dim], IndexError, "index out of range in self")
    spread = [1] * source.ndim
    spread[dim] = count
    positions = expand(reshape(cast(index, dt.int64), tuple(spread)), tuple(source.shape))
    return scatter_reduce(input, dim, positions, source, reduce, include_self=include_self)


def unravel_index(indices, shape) -> tuple[Tensor, ...]:
    """The coordinates of flat ``indices`` in an array of ``shape`` (row-major), one int64 tensor per dim."""
    if not isinstance(indices, Tensor):
        indices = make_tensor(np.asarray(indices, dtype=np.int64))
    if indices.dtype.category != dt.INTEGER:
        raise TypeError(f"expected 'indices' to be integer dtype, but got {indices.dtype.name}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(s < 0 for s in shape):
        raise RuntimeError("'shape' cannot have negative values, but got " + str(tuple(shape)))
    flat = cast(indices, dt.int64)
    out = []
    for size in reversed(shape):
        out.append(remainder(flat, size) if size else flat * 0)
        flat = floor_divide(flat, size) if size else flat
    return tuple(reversed(out))


@method("argwhere")
def argwhere(input: Tensor) -> Tensor:
    """The (count, ndim) int64 indices of the non-zero elements (a data-dependent shape: under
    ``kiln.compile`` the call runs eagerly, as ``nonzero``)."""
    if input.ndim == 0:
        input._value_access("kiln.argwhere() (a data-dependent shape)")
        return constant(np.zeros((int(bool(input.item())), 0), dtype=np.int64), input.device)
    return nonzero(input)


def pdist(input: Tensor, p: float = 2.0) -> Tensor:
    """The p-norm distances between every pair of rows i < j, in row-major order of the pairs."""
    if input.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {input.ndim}D")
    n = input.shape[0]
    rows, cols = np.triu_indices(n, 1)
    flat = constant((rows * n + cols).astype(np.int64), input.device)
    return index_select(reshape(cdist(input, input, p), (-1,)), 0, flat)


# ----------------------------------------------------------------------------- integer ops by numpy
def _numpy_op(name: str, fn, *tensors: Tensor) -> Tensor:
    if _jit.tracing:
        _jit.unsafe(f"{name} has no compiled form (kiln has no integer {name} primitive)")
    arrays = [t.detach()._host() if isinstance(t, Tensor) else t for t in tensors]
    device = next(t.device for t in tensors if isinstance(t, Tensor))
    return constant(np.asarray(fn(*arrays)), device)


def _integers(name: str, *xs) -> None:
    for x in xs:
        if isinstance(x, Tensor) and not (x.dtype.category == dt.INTEGER or x.dtype is dt.bool_):
            raise RuntimeError(f"\"{name}_cpu\" not implemented for '{x.dtype.name.capitalize()}'")


@method("gcd")
def gcd(input: Tensor, other: Tensor) -> Tensor:
    _integers("gcd", input, other)
    return _numpy_op("gcd", np.gcd, input, other)


@method("lcm")
def lcm(input: Tensor, other: Tensor) -> Tensor:
    _integers("lcm", input, other)
    return _numpy_op("lcm", np.lcm, input, other)


@method("frexp")
def frexp(input: Tensor):
    """(mantissa, exponent) with input = mantissa * 2^exponent and |mantissa| in [0.5, 1); exponent int32."""
    if not input.dtype.is_floating_point:
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    if _jit.tracing:
        _jit.unsafe("frexp has no compiled form")
    mantissa, exponent = np.frexp(input.detach()._host())
    return constant(np.asarray(mantissa), input.device), constant(np.asarray(exponent, dtype=np.int32), input.device)


@method("angle")
def angle(input: Tensor) -> Tensor:
    """The argument of a real number: pi for negatives, 0 otherwise, nan for nan; integers give floats."""
    x = input if input.dtype.is_floating_point else cast(input, dt.get_default_dtype())
    return where(lt(x, 0), math.pi, where(eq(x, x), 0.0, x))


# ----------------------------------------------------------------------------- predicates
@method("is_nonzero")
def is_nonzero(input: Tensor) -> bool:
    n = input.numel()
    if n == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if n > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(input.item() != 0)


@method("is_same_size")
def is_same_size(input: Tensor, other: Tensor) -> bool:
    return tuple(input.shape) == tuple(other.shape)


@method("is_signed")
def is_signed(input: Tensor) -> bool:
    return input.dtype not in (dt.uint8, dt.bool_)


@method("get_device")
def get_device(input: Tensor) -> int:
    """-1 on the CPU, the device index on a GPU."""
    device = input.device
    return -1 if device.type == "cpu" else (device.index or 0)


@method("new_empty_strided")
def new_empty_strided(input: Tensor, size, stride, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A new uninitialized tensor of ``size`` (kiln's new tensors are contiguous: ``stride`` is not kept)."""
    return input.new_empty(tuple(size), dtype=dtype, device=device, requires_grad=requires_grad)
