"""Index primitives: gather/scatter along one axis, and advanced (integer-array) indexing.

- ``gather(x, index, axis)``, ``scatter(x, index, src, axis)`` and ``scatter_add`` follow
  ``torch.gather``/``torch.scatter``: ``index`` has ``x``'s number of dims and may be smaller than
  ``x`` (and than ``src``) along every dim; only the part of ``src`` that ``index`` covers is read.
- ``take(x, *indices)`` is numpy's ``x[i0, i1, ...]`` over the leading dims: the int64 index
  tensors broadcast together, and the result is ``broadcast shape + x.shape[len(indices):]``.
  ``index_put(x, values, *indices, accumulate)`` is its adjoint: a copy of ``x`` with
  ``values`` written (or added, with repeats summing) at those positions.

Index tensors are int64 inputs, never attributes, and carry no gradient. The VJPs read only the
saved index tensors, never the saved ``x``/``values``/``src`` (so a later in-place change of those
does not stop backward, as in PyTorch). The frontend checks index bounds, with PyTorch's
messages (``check`` nodes when traced); the kernels trust them, and so do the VJPs, which apply
the primitives on the index the forward checked directly rather than through checking frontend ops.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..shapes import broadcast_shapes
from ..types import Dim, TensorType
from . import Kind, Primitive, Sample, register


def _check_index(name: str, index: TensorType) -> None:
    if index.dtype is not dt.int64:
        raise TypeError(f"{name}(): expected dtype int64 for index, got {index.dtype.name}")


def _check_axis_index(name: str, x: TensorType, index: TensorType, axis: int, src: TensorType | None = None) -> None:
    _check_index(name, index)
    if index.ndim != x.ndim:
        raise RuntimeError(
            f"{name}(): index tensor must have the same number of dimensions as the input tensor, got index "
            f"shape {list(index.shape)} and input shape {list(x.shape)}"
        )
    if not 0 <= axis < max(x.ndim, 1):
        raise IndexError(f"{name}(): axis {axis} is out of range for an input of shape {list(x.shape)}")
    for d, (i, n) in enumerate(zip(index.shape, x.shape, strict=True)):
        if d != axis and _exceeds(i, n):
            raise RuntimeError(
                f"{name}(): size of index {list(index.shape)} must not exceed the input's {list(x.shape)} at "
                f"dimension {d} (except the dimension {axis} indexed)"
            )
    if src is not None:
        if src.dtype is not x.dtype:
            raise TypeError(f"{name}(): expected src of dtype {x.dtype.name} like self, got {src.dtype.name}")
        if src.ndim != index.ndim or any(_exceeds(i, s) for i, s in zip(index.shape, src.shape, strict=True)):
            raise RuntimeError(
                f"{name}(): index shape {list(index.shape)} must not exceed the src shape {list(src.shape)} "
                "at any dimension"
            )


def _exceeds(i: Dim, n: Dim) -> bool:
    """Whether size ``i`` may exceed ``n``: a symbol is within only itself (its size is not known)."""
    if isinstance(i, int) and isinstance(n, int):
        return i > n
    return i != n


def _grids(xp, index, axis: int) -> tuple:
    """The full index tuple of ``torch.scatter``: ``index`` along ``axis``, aranges elsewhere."""
    nd = index.ndim
    grids = []
    for d, n in enumerate(index.shape):
        if d == axis:
            grids.append(index)
        else:
            shape = [1] * nd
            shape[d] = n
            grids.append(xp.arange(n).reshape(shape))
    return tuple(grids)


def _cut(x, shape, skip: int | None = None):
    """``x`` cut down to ``shape`` along every dim but ``skip`` (a view)."""
    return x[tuple(slice(None) if d == skip else slice(0, n) for d, n in enumerate(shape))]


def _src_grad(ops, g, c, axis: int):
    """The VJP to ``src`` of scatter/scatter_add: the gathered gradient, zero where unread."""
    index = c.inputs[1]
    src = c.input_types[2]
    part = ops.apply(gather, g, index, axis=axis)
    high = tuple(s - i for s, i in zip(src.shape, index.shape, strict=True))
    if any(high):
        part = ops.strided_pad(part, (0,) * len(high), high, (0,) * len(high))
    return part


# ----------------------------------------------------------------------------- gather
def _gather_infer(x: TensorType, index: TensorType, *, axis: int) -> TensorType:
    _check_axis_index("gather", x, index, axis)
    return TensorType(index.shape, x.dtype, x.device)


def _gather_eager(xp, x, index, *, axis):
    if x.ndim == 0:
        return x.reshape(1)[index.reshape(1)].reshape(())
    if x.ndim == 2:  # the index grid take_along_axis builds, built directly: 2 us where it took 4 (64x10)
        if axis % 2:
            return x[xp.arange(index.shape[0]).reshape(-1, 1), index]
        return x[index, xp.arange(index.shape[1])]
    return xp.take_along_axis(_cut(x, index.shape, axis), index, axis=axis)


def _zeros_like_input(ops, x: TensorType, g):
    """Zeros of ``x``'s shape and ``g``'s dtype for a gradient to be scattered into: a scalar broadcast,
    so that a trace records a 0-d constant and an ``expand`` rather than the whole zero array (the
    cross-entropy's gradient of an LSTM LM's (B T, V) logits: an 11 MiB constant at T=350, copied,
    hashed and read by every call); eagerly the scatter's own copy of it is the same fresh zeros."""
    return ops.expand(ops.zeros((), dtype=g.dtype, device=g.device), tuple(x.shape))


def _gather_vjp(ops, c, g):
    zeros = _zeros_like_input(ops, c.input_types[0], g)
    return ops.apply(scatter_add, zeros, c.inputs[1], g, axis=c.attrs["axis"]), None


def _axis_samples(rng, with_src: bool, unique: bool):
    def index(shape, n, axis):
        if not unique:
            return rng.integers(0, n, size=shape)
        # distinct positions along `axis` in every column, so that non-accumulating writes are unambiguous
        full = [n if d == axis else s for d, s in enumerate(shape)]
        return _cut(np.argsort(rng.random(full), axis=axis), shape)

    x = rng.normal(size=(4, 5))
    cases = [((3, 5), 0), ((4, 2), 1), ((2, 3), 0), ((0, 5), 0)]
    out = []
    for shape, axis in cases:
        idx = index(shape, x.shape[axis], axis)
        args = (x, idx, rng.normal(size=(4, 6))) if with_src else (x, idx)
        out.append(Sample(args, {"axis": axis}))
    scalar_args = [rng.normal(size=()), rng.integers(0, 1, size=())]
    if with_src:
        scalar_args.append(rng.normal(size=()))
    out.append(Sample(tuple(scalar_args), {"axis": 0}))
    return out


gather = register(Primitive(
    "gather", Kind.INDEX, _gather_infer, _gather_eager, _gather_vjp, save_inputs=True,
    reference=lambda torch, x, index, *, axis: torch.gather(x, axis, index),
    samples=lambda rng: _axis_samples(rng, False, False),
    doc="out[i][j] = x[index[i][j]][j] for axis 0 (torch.gather); index may be smaller than x.",
))  # fmt: skip


# ----------------------------------------------------------------------------- scatter, scatter_add
def _scatter_infer(name: str):
    def infer(x: TensorType, index: TensorType, src: TensorType, *, axis: int) -> TensorType:
        _check_axis_index(name, x, index, axis, src)
        return x

    return infer


def _scatter_eager(accumulate: bool):
    def eager(xp, x, index, src, *, axis):
        out = xp.array(x, copy=True)
        if x.ndim == 0:
            view, index, src = out.reshape(1), index.reshape(1), src.reshape(1)
        else:
            view = out
        where, values = _grids(xp, index, axis), _cut(src, index.shape)
        if accumulate:
            xp.add.at(view, where, values)
        else:
            view[where] = values
        return out

    return eager


def _scatter_add_vjp(ops, c, g):
    needs = c.needs_input_grad
    return (g if needs[0] else None), None, (_src_grad(ops, g, c, c.attrs["axis"]) if needs[2] else None)


def _scatter_vjp(ops, c, g):
    axis = c.attrs["axis"]
    needs = c.needs_input_grad
    gx = ops.scatter(g, axis, c.inputs[1], 0.0) if needs[0] else None  # overwritten elements get none
    return gx, None, (_src_grad(ops, g, c, axis) if needs[2] else None)


scatter_add = register(Primitive(
    "scatter_add", Kind.INDEX, _scatter_infer("scatter_add"), _scatter_eager(True), _scatter_add_vjp,
    save_inputs=True, reference=lambda torch, x, index, src, *, axis: torch.scatter_add(x, axis, index, src),
    samples=lambda rng: _axis_samples(rng, True, False),
    doc="A copy of x with src[i][j] added at x[index[i][j]][j] for axis 0; repeats add up.",
))  # fmt: skip

scatter = register(Primitive(
    "scatter", Kind.INDEX, _scatter_infer("scatter"), _scatter_eager(False), _scatter_vjp, save_inputs=True,
    reference=lambda torch, x, index, src, *, axis: torch.scatter(x, axis, index, src),
    samples=lambda rng: _axis_samples(rng, True, True),
    doc="A copy of x with src[i][j] written at x[index[i][j]][j] for axis 0 (repeats: one of them wins).",
))  # fmt: skip


# ----------------------------------------------------------------------------- take, index_put
def _indexed_shape(name: str, x: TensorType, indices: tuple[TensorType, ...]) -> tuple[Dim, ...]:
    if not indices:
        raise ValueError(f"{name}: expected at least one index tensor")
    if len(indices) > x.ndim:
        raise IndexError(f"{name}: too many indices ({len(indices)}) for a tensor of shape {list(x.shape)}")
    for i in indices:
        _check_index(name, i)
    try:
        lead = broadcast_shapes(*(i.shape for i in indices))
    except ValueError:
        shapes = ", ".join(str(list(i.shape)) for i in indices)
        raise IndexError(f"{name}: shape mismatch: indexing tensors could not be broadcast together with shapes "
                         f"{shapes}") from None  # fmt: skip
    return lead + tuple(x.shape[len(indices) :])


def _take_infer(x: TensorType, *indices: TensorType) -> TensorType:
    return TensorType(_indexed_shape("take", x, indices), x.dtype, x.device)


def _take_vjp(ops, c, g):
    zeros = _zeros_like_input(ops, c.input_types[0], g)
    indices = tuple(c.inputs[i] for i in range(1, len(c.input_types)))
    return (ops.apply(index_put, zeros, g, *indices, accumulate=True),) + (None,) * (len(c.input_types) - 1)


def _index_samples(rng, unique: bool):
    x = rng.normal(size=(4, 3, 2))
    if unique:
        rows, cols = rng.permutation(4)[:3], rng.permutation(3)[:3]
        pair = (rows.reshape(3, 1), rng.permutation(3)[:2].reshape(1, 2))  # a 3x2 grid: distinct pairs
    else:
        rows, cols = rng.integers(0, 4, size=5), rng.integers(0, 3, size=5)
        pair = (rng.integers(0, 4, size=(3, 1)), rng.integers(0, 3, size=(1, 2)))
    return [((x, rows), (len(rows), 3, 2)), ((x, rows[:2], cols[:2]), (2, 2)), ((x, *pair), (3, 2, 2)),
            ((x, rows[:0]), (0, 3, 2)), ((x, rng.integers(0, 4, size=())), (3, 2))]  # fmt: skip


def _take_eager(xp, x, *indices):
    # numpy's take of rows copies them in one pass where x[(idx,)] builds an advanced-index
    # iterator: 4 us where it took 7 for an LSTM LM's (16, 35) tokens of a (500, 128) table
    if len(indices) == 1 and xp is np:
        return np.take(x, indices[0], axis=0)
    return x[indices]


take = register(Primitive(
    "take", Kind.INDEX, _take_infer, _take_eager, _take_vjp, save_inputs=True,
    reference=lambda torch, x, *indices: x[indices],
    samples=lambda rng: [Sample(args) for args, _ in _index_samples(rng, False)],
    doc="x[i0, i1, ...] with int64 index tensors over the leading dims (numpy's advanced indexing).",
))  # fmt: skip


def _index_put_infer(x: TensorType, values: TensorType, *indices: TensorType, accumulate: bool) -> TensorType:
    shape = _indexed_shape("index_put", x, indices)
    if values.dtype is not x.dtype:
        raise TypeError(f"index_put: expected values of dtype {x.dtype.name} like self, got {values.dtype.name}")
    try:
        if broadcast_shapes(values.shape, shape) != shape:
            raise ValueError
    except ValueError:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {list(shape)}") from None  # fmt: skip
    return x


def _index_put_eager(xp, x, values, *indices, accumulate):
    out = xp.array(x, copy=True)
    if accumulate and _rows_of_a_table(xp, out, values, indices):
        index = indices[0].reshape(-1)
        _add_rows(out, values.reshape(len(index), *out.shape[1:]), index)
    elif accumulate:
        xp.add.at(out, indices, values)
    else:
        out[indices] = values
    return out


def _rows_of_a_table(xp, out, values, indices) -> bool:
    """Whether this is an embedding's gradient: whole rows of a table, one index (of any shape) per
    row of ``values`` (numpy's ``add.at`` adds them element by element, half of an NCF training step)."""
    return (
        xp.__name__ == "numpy" and len(indices) == 1 and out.ndim >= 2
        and values.shape == indices[0].shape + out.shape[1:] and values.size >= 4096
    )  # fmt: skip


def _add_rows(out, values, index) -> None:
    """``np.add.at(out, index, values)`` for whole rows of ``out`` (a 1-D ``index``), in as many vector
    steps as a row repeats: step ``k`` adds each row's ``k``-th value (rows are distinct within a
    step), so every element sums its values one by one in index order, as ``add.at`` does. A row
    repeated more than ``_MAX_ROUNDS`` times (a padding token) takes one ``add.at`` over the flat
    elements instead: numpy's 1-D ``add.at`` is a fast loop where its row-wise one is not (90 us
    against 480 for 560 rows of 128, a quarter of them one row), and sums in the same order."""
    index = np.where(index < 0, index + out.shape[0], index)  # -1 and n-1 are one row
    order = np.argsort(index, kind="stable")
    ordered = index[order]
    run_start = np.concatenate(([True], ordered[1:] != ordered[:-1]))
    starts = np.flatnonzero(run_start)
    rank = np.arange(len(index)) - starts[np.cumsum(run_start) - 1]  # k: the k-th value of its row
    rounds = int(rank.max()) + 1 if len(index) else 0
    if rounds > _MAX_ROUNDS and out.flags.c_contiguous:
        width = out.size // out.shape[0]
        flat = (index[:, None] * width + np.arange(width)).reshape(-1)
        np.add.at(out.reshape(-1), flat, values.reshape(-1))  # (a view: ``out`` is C order)
        return
    if rounds > _MAX_ROUNDS:
        np.add.at(out, index, values)
        return
    for k in range(rounds):
        chosen = order[rank == k]
        out[index[chosen]] += values[chosen]


_MAX_ROUNDS = 16


def _index_put_vjp(ops, c, g):
    indices = tuple(c.inputs[i] for i in range(2, len(c.input_types)))
    needs = c.needs_input_grad
    gx = gv = None
    if needs[0]:
        zero = ops.zeros((), dtype=g.dtype, device=g.device)
        gx = g if c.attrs["accumulate"] else ops.index_put(g, indices, zero)
    if needs[1]:
        gv = ops.sum_to(ops.index(g, indices), c.input_types[1].shape)
    return (gx, gv) + (None,) * len(indices)


def _index_put_samples(rng):
    out = []
    for accumulate in (False, True):
        for (x, *indices), shape in _index_samples(rng, unique=not accumulate):
            out.append(Sample((x, rng.normal(size=shape), *indices), {"accumulate": accumulate}))
            out.append(Sample((x, rng.normal(size=shape[-1:]), *indices), {"accumulate": accumulate}))
    return out


index_put = register(Primitive(
    "index_put", Kind.INDEX, _index_put_infer, _index_put_eager, _index_put_vjp, save_inputs=True,
    reference=lambda torch, x, values, *indices, accumulate: torch.index_put(x, indices, values, accumulate),
    samples=_index_put_samples,
    doc="A copy of x with values (broadcast) written, or added when accumulate, at x[i0, i1, ...].",
))  # fmt: skip
