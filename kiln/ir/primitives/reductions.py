"""Reduction primitives: sum, max, min, prod and arg-reductions over axes, and cumulative sums.

``axes`` is a sorted tuple of non-negative axes (the frontend normalizes ``dim``); ``keepdim``
keeps reduced axes with size 1. Composite reductions (mean, var, logsumexp, softmax, norm)
are Python over these in ``kiln.frontend.ops.reductions``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import dtypes as dt
from ..shapes import normalize_axes, reduced_shape
from ..types import Dim, TensorType
from . import NO_COMBINE, NOT_DIFFERENTIABLE, Kind, Primitive, Sample, register


def _reduce_infer(name: str, needs_elements: bool = False):
    def infer(x: TensorType, *, axes: tuple[int, ...], keepdim: bool) -> TensorType:
        normalize_axes(axes, x.ndim)  # raises for out-of-range axes
        if needs_elements:
            _check_nonempty(name, x, axes)
        return TensorType(reduced_shape(x.shape, axes, keepdim), x.dtype, x.device)

    return infer


def _check_nonempty(name: str, x: TensorType, axes) -> None:
    """max/min/argmax have no identity: reducing over a size-0 dim is an error, as in PyTorch."""
    for a in axes:
        if x.shape[a] == 0:
            raise IndexError(
                f"{name}(): Expected reduction dim {a} to have non-zero size (input shape {list(x.shape)})."
            )


def _reduce_kernel(ufunc: str, function: str, typed: bool):
    """``xp.<function>(x, axis, keepdims)``; on numpy the ufunc's ``reduce`` directly, so that
    numpy's warnings about inf - inf or nan are raised from kiln's frame, where the dispatcher's
    filter silences them (PyTorch treats those as values, not warnings)."""

    def eager(xp, x, *, axes, keepdim):
        fn = getattr(np, ufunc).reduce if xp is np else getattr(xp, function)
        if typed:
            return fn(x, axis=axes, keepdims=keepdim, dtype=x.dtype)
        return fn(x, axis=axes, keepdims=keepdim)

    return eager


def _keepdim_grad(ops, c, g):
    """The incoming gradient with the reduced axes kept (size 1), so it broadcasts to the input."""
    if c.attrs["keepdim"]:
        return g
    return ops.reshape(g, reduced_shape(c.input_types[0].shape, c.attrs["axes"], True))


# ----------------------------------------------------------------------------- reduce_sum
_add_reduce = _reduce_kernel("add", "sum", typed=True)


def _rows(x, axes) -> int | None:
    """The number of rows when ``x`` (float32/float64, C order, on numpy) is summed over leading
    axes into the trailing ones (a bias gradient): a column sum; None otherwise."""
    if (
        x.__class__ is not np.ndarray
        or x.dtype.char not in "fd"
        or not 0 < len(axes) < x.ndim
        or axes != tuple(range(len(axes)))
        or not x.flags.c_contiguous
    ):
        return None
    return math.prod(x.shape[: len(axes)])  # (numpy.prod of a tuple costs ~1.5 us)


_CACHED_ONES = 1 << 16  # longer vectors of ones are made per call (the cache holds 16 at most)


@functools.lru_cache(maxsize=16)
def _cached_ones(rows: int, char: str) -> np.ndarray:
    ones = np.ones(rows, char)
    ones.flags.writeable = False
    return ones


def _ones(rows: int, char: str) -> np.ndarray:
    return _cached_ones(rows, char) if rows <= _CACHED_ONES else np.ones(rows, char)


def _column_sum(x, rows: int, out):
    """``ones(rows) @ x`` as a (rows, columns) matrix: one BLAS matrix-vector product. OpenBLAS on
    2 threads against numpy's add.reduce over axis 0: (1024, 256) 35 -> 14 us, (1024, 1024) 88 ->
    40 us, (128, 512) 8.7 -> 3.4 us; closer to the float64 sum, too (its max error 2.3e-4 against
    5.6e-4 for 1024 rows of [0, 1) values). A column of -0.0 sums to +0.0, as in PyTorch."""
    return np.matmul(_ones(rows, x.dtype.char), x.reshape(rows, x.size // rows), out=out)


def _sum_eager(xp, x, *, axes, keepdim):
    rows = _rows(x, axes) if xp is np else None
    if rows is None or rows == 0:
        return _add_reduce(xp, x, axes=axes, keepdim=keepdim)
    return _column_sum(x, rows, None).reshape(reduced_shape(x.shape, axes, keepdim))


def _sum_into(xp, x, *, axes, keepdim, out):
    rows = _rows(x, axes) if xp is np else None
    if rows is None or rows == 0 or not out.flags.c_contiguous:
        reduce = np.add.reduce if xp is np else xp.sum
        return reduce(x, axis=axes, keepdims=keepdim, dtype=x.dtype, out=out)
    _column_sum(x, rows, out.reshape(-1))
    return out


def _sum_vjp(ops, c, g):
    (t,) = c.input_types
    if not c.attrs["keepdim"]:
        g = ops.reshape(g, reduced_shape(t.shape, c.attrs["axes"], True))
    return (ops.expand(g, t.shape),)


def _sum_samples(rng):
    x = rng.normal(size=(2, 3, 4))
    return [
        Sample((x,), {"axes": (1,), "keepdim": False}),
        Sample((x,), {"axes": (0, 2), "keepdim": True}),
        Sample((x,), {"axes": (0, 1, 2), "keepdim": False}),
        Sample((rng.normal(size=()),), {"axes": (), "keepdim": False}),
        Sample((rng.normal(size=(0, 3)),), {"axes": (0,), "keepdim": False}),
        Sample((x,), {"axes": (0, 1), "keepdim": False}),  # leading axes: a column sum
        Sample((x,), {"axes": (0,), "keepdim": True}),
    ]


reduce_sum = register(Primitive(
    "reduce_sum", Kind.REDUCE, _reduce_infer("reduce_sum"),
    _sum_eager, _sum_vjp, combine="add", identity=lambda dtype: 0, eager_into=_sum_into,
    reference=lambda torch, x, *, axes, keepdim: torch.sum(x, dim=axes, keepdim=keepdim), samples=_sum_samples,
))  # fmt: skip


# ----------------------------------------------------------------------------- reduce_max, reduce_min
def _extremum_vjp(ops, c, g):
    # PyTorch's amax rule: the gradient is shared evenly among the elements equal to the result.
    # A nan result counts the nan elements as equal (as torch.max() does), so the gradient
    # flows to the element that decided the result; torch.amax would give nan everywhere there.
    (x,) = c.inputs
    out = c.output
    g = _keepdim_grad(ops, c, g)
    if not c.attrs["keepdim"]:
        out = ops.reshape(out, g.shape)
    hit = ops.logical_or(ops.eq(x, out), ops.logical_and(ops.isnan(x), ops.isnan(out)))
    mask = ops.cast(hit, x.dtype)
    count = ops.sum(mask, c.attrs["axes"], keepdim=True)
    return (ops.mul(ops.div(g, count), mask),)


def _extremum_samples(rng):
    x = rng.normal(size=(2, 3, 4))
    ties = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, -1.0]])
    special = np.array([[1.0, np.nan, 3.0], [np.inf, -np.inf, 0.0], [-np.inf, -np.inf, -np.inf]])
    return [
        Sample((x,), {"axes": (1,), "keepdim": False}),
        Sample((x,), {"axes": (0, 2), "keepdim": True}),
        Sample((x,), {"axes": (0, 1, 2), "keepdim": False}),
        Sample((rng.normal(size=()),), {"axes": (), "keepdim": False}),
        Sample((rng.normal(size=(0, 3)),), {"axes": (1,), "keepdim": False}),
        Sample((ties,), {"axes": (1,), "keepdim": False}, gradcheck=False),
        Sample((special,), {"axes": (1,), "keepdim": True}, gradcheck=False),
    ]


def _lowest(dtype: dt.DType) -> object:
    """The identity of max: below every value of ``dtype`` (max/min never see an empty row: infer rejects it)."""
    if dtype.is_floating_point:
        return float("-inf")
    return False if dtype is dt.bool_ else int(np.iinfo(dtype.np).min)


def _highest(dtype: dt.DType) -> object:
    if dtype.is_floating_point:
        return float("inf")
    return True if dtype is dt.bool_ else int(np.iinfo(dtype.np).max)


def _extremum(name: str, ufunc: str, function: str, torch_name: str, combine: str, identity):
    return register(Primitive(
        name, Kind.REDUCE, _reduce_infer(torch_name, needs_elements=True),
        _reduce_kernel(ufunc, function, typed=False), _extremum_vjp, save_inputs=True, save_output=True,
        combine=combine, identity=identity,
        reference=lambda torch, x, *, axes, keepdim: getattr(torch, torch_name)(x, dim=axes, keepdim=keepdim),
        samples=_extremum_samples, doc=f"{torch_name}: nan propagates; the gradient is split evenly among ties.",
    ))  # fmt: skip


reduce_max = _extremum("reduce_max", "maximum", "max", "amax", "max", _lowest)
reduce_min = _extremum("reduce_min", "minimum", "min", "amin", "min", _highest)


# ----------------------------------------------------------------------------- reduce_prod
def _prod_vjp(ops, c, g):
    # d prod / d x_i is the product of the other elements. Dividing the product by x_i is exact
    # only without zeros, so count zeros per slice: none -> prod / x_i; exactly one -> the
    # product of the nonzero others at the zero, 0 elsewhere; two or more -> 0 everywhere.
    # (PyTorch multiplies the others out with cumprods, so a slice holding both a zero and
    # inf/nan gets nan where kiln says 0; kiln has no cumprod primitive for that corner.)
    (x,) = c.inputs
    axes = c.attrs["axes"]
    g = _keepdim_grad(ops, c, g)
    is_zero = ops.eq(x, 0.0)
    zeros = ops.sum(is_zero, axes, keepdim=True)
    safe = ops.where(is_zero, 1.0, x)
    nonzero_prod = ops.prod(safe, axes, keepdim=True)
    one_zero = ops.where(ops.logical_and(is_zero, ops.eq(zeros, 1)), nonzero_prod, 0.0)
    others = ops.where(ops.eq(zeros, 0), ops.div(nonzero_prod, safe), one_zero)
    return (ops.mul(g, others),)


def _prod_samples(rng):
    x = rng.uniform(0.5, 1.5, size=(2, 3, 4)) * rng.choice([-1, 1], size=(2, 3, 4))
    zeros = np.array([[1.5, 0.0, 2.0], [0.0, 0.0, 3.0], [1.0, 2.0, -3.0]])
    return [
        Sample((x,), {"axes": (1,), "keepdim": False}),
        Sample((x,), {"axes": (0, 2), "keepdim": True}),
        Sample((x,), {"axes": (0, 1, 2), "keepdim": False}),
        Sample((zeros,), {"axes": (1,), "keepdim": False}),
        Sample((zeros,), {"axes": (0, 1), "keepdim": False}),
        Sample((rng.normal(size=()),), {"axes": (), "keepdim": False}),
        Sample((rng.normal(size=(0, 3)),), {"axes": (0,), "keepdim": False}),
    ]


reduce_prod = register(Primitive(
    "reduce_prod", Kind.REDUCE, _reduce_infer("prod"),
    _reduce_kernel("multiply", "prod", typed=True), _prod_vjp, save_inputs=True, combine="mul",
    identity=lambda dtype: 1,
    reference=lambda torch, x, *, axes, keepdim: _torch_prod(torch, x, axes, keepdim),
    samples=_prod_samples, doc="Product over axes; the gradient is exact where the slice holds zeros.",
))  # fmt: skip


def _torch_prod(torch, x, axes, keepdim):
    # torch.prod takes one dim at a time; reduce from the last axis so the others keep their place.
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, dim=a, keepdim=keepdim)
    return x


# ----------------------------------------------------------------------------- argmax, argmin
def _arg_infer(name: str):
    def infer(x: TensorType, *, axis: int | None, keepdim: bool) -> TensorType:
        if axis is None:
            if x.is_static and x.numel == 0:  # a symbolic size may be 0: the eager kernel raises then
                raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
            shape: tuple[Dim, ...] = (1,) * x.ndim if keepdim else ()
        else:
            axes = normalize_axes(axis, x.ndim)
            _check_nonempty(name, x, axes)
            shape = reduced_shape(x.shape, axes, keepdim)
        return TensorType(shape, dt.int64, x.device)

    return infer


def _arg_eager(fn: str):
    def eager(xp, x, *, axis, keepdim):
        if x.ndim == 0:  # numpy has no axis 0 on a 0-d array; PyTorch's answer is index 0
            return xp.zeros((), dtype=xp.int64)
        return getattr(xp, fn)(x, axis=axis, keepdims=keepdim).astype(xp.int64, copy=False)

    return eager


def _arg_samples(rng):
    x = rng.normal(size=(3, 4))
    ties = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 2.0, np.nan, 5.0], [-np.inf, -np.inf, 1.0, np.inf]])
    return [
        Sample((x,), {"axis": 1, "keepdim": False}, gradcheck=False),
        Sample((x,), {"axis": 0, "keepdim": True}, gradcheck=False),
        Sample((x,), {"axis": None, "keepdim": False}, gradcheck=False),
        Sample((ties,), {"axis": 1, "keepdim": False}, gradcheck=False),
        Sample((rng.normal(size=()),), {"axis": 0, "keepdim": False}, gradcheck=False),
        Sample((rng.normal(size=(0, 3)),), {"axis": 1, "keepdim": False}, gradcheck=False),
    ]


def _arg(name: str, fn: str):
    return register(Primitive(
        name, Kind.REDUCE, _arg_infer(name), _arg_eager(fn), NOT_DIFFERENTIABLE, combine=NO_COMBINE,
        reference=lambda torch, x, *, axis, keepdim: getattr(torch, name)(x, dim=axis, keepdim=keepdim),
        samples=_arg_samples, doc=f"The int64 index of the first {name[3:]} (nan counts as the extreme), "
                                  "over `axis` or the flattened tensor when None.",
    ))  # fmt: skip


argmax = _arg("argmax", "argmax")
argmin = _arg("argmin", "argmin")


# ----------------------------------------------------------------------------- cumsum
def _cumsum_infer(x: TensorType, *, axis: int, reverse: bool) -> TensorType:
    normalize_axes(axis, x.ndim)
    return TensorType(x.shape, x.dtype, x.device)


def _cumsum_eager(xp, x, *, axis, reverse):
    if x.ndim == 0:
        return xp.array(x, copy=True)
    scan = np.add.accumulate if xp is np else xp.cumsum  # numpy: warnings from kiln's frame (see above)
    if not reverse:
        return scan(x, axis=axis, dtype=x.dtype)
    return xp.ascontiguousarray(xp.flip(scan(xp.flip(x, axis), axis=axis, dtype=x.dtype), axis))


def _cumsum_samples(rng):
    x = rng.normal(size=(3, 4))
    return [
        Sample((x,), {"axis": 1, "reverse": False}),
        Sample((x,), {"axis": 0, "reverse": True}),
        Sample((rng.normal(size=()),), {"axis": 0, "reverse": False}),
        Sample((rng.normal(size=(0, 3)),), {"axis": 0, "reverse": False}),
    ]


def _cumsum_reference(torch, x, *, axis, reverse):
    if not reverse:
        return torch.cumsum(x, dim=axis)
    return torch.flip(torch.cumsum(torch.flip(x, (axis,)), dim=axis), (axis,))


cumsum = register(Primitive(
    "cumsum", Kind.SCAN, _cumsum_infer, _cumsum_eager,
    lambda ops, c, g: (ops.cumsum(g, c.attrs["axis"], reverse=not c.attrs["reverse"]),),
    reference=_cumsum_reference, samples=_cumsum_samples,
    doc="Running sum along `axis`; `reverse` sums from the end (the VJP of a forward cumsum).",
))  # fmt: skip
