"""Reductions: sum, mean, prod, max/min, var/std, logsumexp, softmax, cumsum, all/any...

Composites here are Python over the reduction primitives. The stable forms (logsumexp,
softmax, log_softmax) subtract a *detached* row maximum: the function's value does not depend
on it, so its gradient would cancel anyway, and detaching keeps the backward graph small.
"""

from __future__ import annotations

import functools
from collections import namedtuple

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.shapes import normalize_axes, normalize_axis, reduced_shape
from ...ir.types import CPU
from .. import dispatch
from ..autocast import FLOAT32, autocast_op
from ..autograd import grad_mode
from ..autograd.checked import check_output
from ..dispatch import apply
from ..eager_composites import compiled_composite
from ..jit.regions import composite
from ..opmath import in_float32
from ..tensor import Tensor, make_tensor, method
from ._util import cast, plain_arrays
from .elementwise import add, div, eq, exp, isinf, isnan, log, logical_not, maximum, minimum, mul, ne, sqrt, sub, where
from .inplace import commit_inplace
from .softmax_arrays import softmax_eager

__all__ = [
    "sum", "nansum", "mean", "nanmean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "all", "any", "count_nonzero",
    "cumsum", "var", "std", "logsumexp", "softmax", "log_softmax",
]  # fmt: skip

_reduce_sum, _reduce_max = P["reduce_sum"], P["reduce_max"]
_reduce_min, _reduce_prod = P["reduce_min"], P["reduce_prod"]

# torch.return_types.max / .min: a named tuple (values, indices).
_MaxResult = namedtuple("max", ("values", "indices"))  # type: ignore[name-match]  # PyTorch's type name (torch.return_types)
_MinResult = namedtuple("min", ("values", "indices"))  # type: ignore[name-match]

_TORCH_TYPE_NAMES = {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}


def _type_name(dtype: dt.DType) -> str:
    return _TORCH_TYPE_NAMES.get(dtype.name, dtype.name)


def _count(shape, axes) -> int:
    n = 1
    for a in axes:
        n *= shape[a]
    return n


def _require_float(input: Tensor, message: str) -> None:
    if not input._dtype.is_floating_point:
        raise RuntimeError(message.format(type=_type_name(input._dtype)))


# ----------------------------------------------------------------------------- sum, mean, prod
def _accumulating(input: Tensor, dtype) -> Tensor:
    """``input`` in the dtype sum and prod accumulate in: ``dtype`` if given, int64 for ints and bools."""
    if dtype is not None:
        return cast(input, dt.as_dtype(dtype))
    return input if input._dtype.is_floating_point else cast(input, dt.int64)


@method("sum")
def sum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Sum over ``dim`` (all dims when None); bool and integer inputs sum in int64, as in PyTorch."""
    input = _accumulating(input, dtype)
    axes = normalize_axes(dim, input.ndim)
    return apply(_reduce_sum, input, axes=axes, keepdim=keepdim)


@method("mean")
@in_float32
def mean(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The mean over ``dim``; integer inputs need ``dtype=`` (as in PyTorch). Empty: nan.

    >>> import kiln
    >>> kiln.tensor([[1.0, 2.0], [3.0, 5.0]]).mean(1)
    tensor([1.5000, 4.0000])
    """
    if dtype is not None:
        input = cast(input, dt.as_dtype(dtype))
    _require_float(input, "mean(): could not infer output dtype. Input dtype must be either a floating point or "
                          "complex dtype. Got: {type}")  # fmt: skip
    axes = normalize_axes(dim, input.ndim)
    total = apply(_reduce_sum, input, axes=axes, keepdim=keepdim)
    return div(total, _count(input._data.shape, axes))


@method("nansum")
def nansum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """``sum`` with nan counted as zero, as ``torch.nansum``; the gradient is 0 where the input is nan.

    >>> import kiln
    >>> kiln.tensor([1.0, float("nan"), 2.0]).nansum()
    tensor(3.)
    """
    if input._dtype.is_floating_point:
        input = where(isnan(input), 0, input)
    return sum(input, dim, keepdim, dtype=dtype)


@method("nanmean")
def nanmean(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The mean of the elements that are not nan (nan where all are), as ``torch.nanmean``:
    floating inputs only (``dtype`` converts one, it does not admit integers)."""
    _require_float(input, "nanmean(): expected input to have floating point or complex dtype but got {type}")
    if dtype is not None:
        input = cast(input, dt.as_dtype(dtype))
    present = logical_not(isnan(input))
    return div(nansum(input, dim, keepdim), sum(present, dim, keepdim))


@method("prod")
@autocast_op(FLOAT32)
def prod(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The product over ``dim`` (an int; kiln also takes a tuple); ints and bools multiply in int64."""
    input = _accumulating(input, dtype)
    return apply(_reduce_prod, input, axes=normalize_axes(dim, input.ndim), keepdim=keepdim)


# ----------------------------------------------------------------------------- max, min, amax, amin
def _extremum(input: Tensor, dim, keepdim: bool, name: str):
    if isinstance(dim, Tensor):  # max(a, b): the elementwise form
        return (maximum if name == "max" else minimum)(input, dim)
    if dim is None:
        if input._data.size == 0:
            raise RuntimeError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                "Specify the reduction dim with the 'dim' argument."
            )
        return apply(_reduce_max if name == "max" else _reduce_min, input, axes=tuple(range(input.ndim)), keepdim=False)
    axis = normalize_axis(dim, input.ndim)
    result = _MaxResult if name == "max" else _MinResult
    arg = P["argmax" if name == "max" else "argmin"]
    if input._data.ndim and input._data.size and _without_history(input):  # no dispatch, where the ops make 4
        x = input._data
        at = (dispatch._compiled_routes.get(arg) or arg.eager)(np, x, axis=axis, keepdim=True)
        picked = np.take_along_axis(x, at, axis=axis)
        if not keepdim:
            picked, at = picked.squeeze(axis), at.squeeze(axis)
        return result(make_tensor(picked, CPU, input._dtype), make_tensor(at, CPU, dt.int64))
    indices = apply(arg, input, axis=axis, keepdim=True)
    if input.ndim == 0:
        from .creation import clone  # noqa: PLC0415

        return result(clone(input), indices)
    # Values are gathered at the returned index, so the gradient flows to that element only
    # (PyTorch's rule for max/min with a dim), unlike amax which splits it among ties.
    from .indexing import gather  # noqa: PLC0415 - indexing is a sibling written against these ops

    values = gather(input, axis, indices)
    if not keepdim:
        shape = reduced_shape(input._data.shape, (axis,), False)
        values, indices = apply(P["reshape"], values, shape=shape), apply(P["reshape"], indices, shape=shape)
    return result(values, indices)


def _without_history(input: Tensor) -> bool:
    """Whether an op on ``input`` may run on its array: an eager CPU tensor outside traces and profiles
    (``plain_arrays``) whose result records no gradient."""
    return plain_arrays(input) and not (input._requires_grad and grad_mode.state.grad_enabled)


@method("max")
def max(input: Tensor, dim=None, keepdim: bool = False):
    """``max(x)``: the largest value; ``max(x, dim)``: ``(values, indices)``; ``max(x, other)``: maximum.

    >>> import kiln
    >>> kiln.tensor([[1.0, 5.0], [7.0, 2.0]]).max(1).indices
    tensor([1, 0])
    """
    return _extremum(input, dim, keepdim, "max")


@method("min")
def min(input: Tensor, dim=None, keepdim: bool = False):
    """``min(x)``, ``min(x, dim)`` -> ``(values, indices)``, or ``min(x, other)`` = minimum."""
    return _extremum(input, dim, keepdim, "min")


def _all_axes(dim, ndim: int) -> tuple[int, ...]:
    return normalize_axes(None if dim == () else dim, ndim)


@method("amax")
def amax(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    """The maximum over ``dim`` (all dims when empty); nan propagates; ties share the gradient."""
    return apply(_reduce_max, input, axes=_all_axes(dim, input.ndim), keepdim=keepdim)


@method("amin")
def amin(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    """The minimum over ``dim`` (all dims when empty); nan propagates; ties share the gradient."""
    return apply(_reduce_min, input, axes=_all_axes(dim, input.ndim), keepdim=keepdim)


@method("argmax")
def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The int64 index of the first maximum along ``dim`` (of the flattened tensor when None)."""
    axis = None if dim is None else normalize_axis(dim, input.ndim)
    return apply(P["argmax"], input, axis=axis, keepdim=keepdim)


@method("argmin")
def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The int64 index of the first minimum along ``dim`` (of the flattened tensor when None)."""
    axis = None if dim is None else normalize_axis(dim, input.ndim)
    return apply(P["argmin"], input, axis=axis, keepdim=keepdim)


# ----------------------------------------------------------------------------- all, any, count_nonzero
def _logical_reduction(input: Tensor, dim, keepdim: bool, prim, empty_value: bool) -> Tensor:
    axes = normalize_axes(dim, input.ndim)
    shape = input._data.shape
    if _count(shape, axes) == 0:  # no identity in the kernel: all() of nothing is True, any() False
        from .creation import full  # noqa: PLC0415

        out = full(reduced_shape(shape, axes, keepdim), empty_value, dtype=dt.bool_, device=input._device)
    else:
        out = apply(prim, cast(input, dt.bool_), axes=axes, keepdim=keepdim)
    return cast(out, dt.uint8) if input._dtype is dt.uint8 else out  # PyTorch keeps uint8 for uint8


@method("all")
def all(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """True where every element along ``dim`` is nonzero (bool; uint8 for uint8 inputs)."""
    return _logical_reduction(input, dim, keepdim, _reduce_min, True)


@method("any")
def any(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """True where some element along ``dim`` is nonzero (bool; uint8 for uint8 inputs)."""
    return _logical_reduction(input, dim, keepdim, _reduce_max, False)


@method("count_nonzero")
def count_nonzero(input: Tensor, dim=None) -> Tensor:
    """The int64 number of nonzero elements along ``dim``."""
    return sum(ne(input, 0), dim)


# ----------------------------------------------------------------------------- cumsum
@method("cumsum")
def cumsum(input: Tensor, dim: int, *, dtype=None, reverse: bool = False) -> Tensor:
    """Running sum along ``dim``; ints and bools sum in int64. ``reverse=True`` (kiln's) sums from the end.

    >>> import kiln
    >>> kiln.tensor([1, 2, 3]).cumsum(0)
    tensor([1, 3, 6])
    """
    if dtype is not None:
        input = cast(input, dt.as_dtype(dtype))
    elif not input._dtype.is_floating_point:
        input = cast(input, dt.int64)
    return apply(P["cumsum"], input, axis=normalize_axis(dim, input.ndim), reverse=reverse)


@method("cumsum_")
def cumsum_(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    return commit_inplace(input, cumsum(input, dim, dtype=dtype), op="cumsum_")


# ----------------------------------------------------------------------------- var, std
def _correction(dim, unbiased, correction):
    if isinstance(dim, bool):  # var(x, False): the legacy positional `unbiased`
        dim, unbiased = None, dim
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    elif unbiased is not None:
        raise RuntimeError("var/std: cannot specify both 'unbiased' and 'correction'")
    return dim, correction


@method("var")
@in_float32
def var(input: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *, correction=None) -> Tensor:
    """Variance over ``dim``: sum((x - mean)^2) / max(0, N - correction); ``correction=1`` by default.

    >>> import kiln
    >>> kiln.tensor([1.0, 2.0, 3.0, 4.0]).var()
    tensor(1.6667)
    """
    dim, correction = _correction(dim, unbiased, correction)
    _require_float(input, "std and var only support floating point and complex dtypes (got {type})")
    axes = normalize_axes(dim, input.ndim)
    centered = sub(input, mean(input, axes, keepdim=True))
    squares = apply(_reduce_sum, mul(centered, centered), axes=axes, keepdim=keepdim)
    n = _count(input._data.shape, axes)
    # Dividing by 0 (N <= correction) gives inf, or nan for 0/0, as in PyTorch.
    return div(squares, n - correction if n > correction else 0)


@method("std")
@in_float32
def std(input: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *, correction=None) -> Tensor:
    """Standard deviation: sqrt(var); its gradient where the deviation is 0 is 0, as in PyTorch."""
    return _sqrt_zero_grad(var(input, dim, unbiased, keepdim, correction=correction))


def _sqrt_zero_grad(x: Tensor) -> Tensor:
    """sqrt(x) whose gradient at x == 0 is 0 rather than inf * 0 = nan (norms and std at zero)."""
    at_zero = eq(x, 0.0)
    return where(at_zero, 0.0, sqrt(where(at_zero, 1.0, x)))


# ----------------------------------------------------------------------------- logsumexp, softmax
def _detached_max(input: Tensor, axes) -> Tensor:
    return apply(_reduce_max, input.detach(), axes=axes, keepdim=True)


@method("logsumexp")
@in_float32
def logsumexp(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) over ``dim``, computed as m + log(sum(exp(x - m))) so it never overflows.

    Rows whose maximum is +-inf shift by 0 instead (inf - inf would be nan): a row of -inf gives
    -inf, a row holding +inf gives inf, as in PyTorch. Integer inputs compute in the default float.
    """
    if not input._dtype.is_floating_point:
        input = cast(input, dt.get_default_dtype())
    axes = normalize_axes(dim, input.ndim)
    if _count(input._data.shape, axes) == 0:
        return log(apply(_reduce_sum, exp(input), axes=axes, keepdim=keepdim))  # log(0) = -inf
    shift = _detached_max(input, axes)
    shift = where(isinf(shift), 0.0, shift)
    total = apply(_reduce_sum, exp(sub(input, shift)), axes=axes, keepdim=keepdim)
    if not keepdim:
        shift = apply(P["reshape"], shift, shape=reduced_shape(input._data.shape, axes, False))
    return add(log(total), shift)


def _softmax_input(input: Tensor, dtype, name: str) -> Tensor:
    if dtype is not None:
        return cast(input, dt.as_dtype(dtype))
    _require_float(input, f"\"{name}\" not implemented for '{{type}}'; pass dtype= or convert to a float dtype")
    return input


def _softmax_dim(dim) -> int:
    if dim is None:
        raise TypeError("softmax/log_softmax: dim is required (an int), got None")
    return dim


@method("softmax")
@in_float32
@compiled_composite("softmax")
@composite("softmax")
def softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    """exp(x) / sum(exp(x)) along ``dim``, shifted by the row maximum so exp never overflows.

    >>> import kiln
    >>> kiln.tensor([0.0, 0.0]).softmax(0)
    tensor([0.5000, 0.5000])
    """
    input = _softmax_input(input, dtype, "softmax")
    axes = normalize_axes(_softmax_dim(dim), input.ndim)
    if input._data.size == 0:
        return mul(input, 1.0)
    out = softmax_eager(input, axes, functools.partial(_softmax, axes=axes))  # (None: the ops run)
    return _softmax(input, axes) if out is None else out


def _softmax(input: Tensor, axes: tuple[int, ...]) -> Tensor:
    """softmax's formula with ops (``softmax_arrays`` computes the same on the arrays)."""
    e = exp(sub(input, _detached_max(input, axes)))
    # PyTorch's node (and ``softmax_arrays``') keeps the output: changing it in place before the
    # backward raises, compiled or not
    return check_output(div(e, apply(_reduce_sum, e, axes=axes, keepdim=True)), "SoftmaxBackward0")


@method("log_softmax")
@in_float32
@compiled_composite("log_softmax")
@composite("log_softmax")
def log_softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    """x - logsumexp(x) along ``dim``, shifted by the row maximum (stable for large |x|)."""
    input = _softmax_input(input, dtype, "log_softmax")
    axes = normalize_axes(_softmax_dim(dim), input.ndim)
    if input._data.size == 0:
        return mul(input, 1.0)
    shifted = sub(input, _detached_max(input, axes))
    return sub(shifted, log(apply(_reduce_sum, exp(shifted), axes=axes, keepdim=True)))
