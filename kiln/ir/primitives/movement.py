"""Movement primitives: ops that move or view elements and compute none.

``reshape``, ``expand``, ``permute`` and ``slice`` are views (the eager result shares memory with the
input), as their PyTorch counterparts are; ``pad``, ``concatenate`` and ``flip`` copy. Attributes are
normalized by the frontend (non-negative axes, clamped slice bounds), so each rule is plain.

A symbolic dimension (``Sym``) is carried through unchanged: a reshape keeps it as a whole
dimension (its ``shape`` attribute names the symbol; the other dimensions' product is kept), a
slice takes all of it (``0:B:1``), pad does not pad it, concatenate joins along another axis.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ..shapes import numel
from ..types import (
    Dim,
    Sym,
    SymbolicShapeError,
    SymSum,
    TensorType,
    dim_factors,
    is_static,
    sym_product,
    sym_sum,
)
from . import Kind, Primitive, Sample, register

# ----------------------------------------------------------------------------- index maps of the views
# ``index_map(ix, index, in_shape, out_shape, **attrs)``: the input index that output ``index`` reads,
# over the index algebra ``ix`` the caller passes (see the registry's docstring).


_RESHAPE_TAKES_COPY = np.lib.NumpyVersion(np.__version__) >= "2.1.0"


def reshape_view(array, shape: tuple[int, ...]):
    """``array`` (numpy or cupy) reshaped to ``shape`` as a view of its memory, or None where that
    needs a copy (the strides cannot express it)."""
    if _RESHAPE_TAKES_COPY and isinstance(array, np.ndarray):
        try:
            return np.reshape(array, shape, copy=False)
        except ValueError:
            return None
    probe = array.view()
    try:
        probe.shape = shape  # numpy before 2.1 and cupy refuse exactly when a copy would be needed
    except AttributeError:
        return None
    return probe


def _contiguous_strides(shape) -> tuple[int, ...]:
    """C-order strides in elements: static when only the leading size is symbolic (a symbol
    anywhere else raises, as it has no static stride)."""
    return tuple(math.prod(shape[k + 1 :]) for k in range(len(shape)))


def _reshape_index(ix, index, in_shape, out_shape, **attrs):
    """Row-major: flatten the output index, unflatten it in the input's shape. A symbolic size may
    lead both shapes (the strides stay static: they multiply only the sizes after it)."""
    if any(n == 0 for n in in_shape):  # no element is ever read (and a size-0 dim would divide by 0 below)
        return tuple(ix.zero for _ in in_shape)
    flat = ix.zero
    for e, stride in zip(index, _contiguous_strides(out_shape), strict=True):
        flat = ix.add(flat, ix.scale(e, stride))
    out = []
    for k, (n, stride) in enumerate(zip(in_shape, _contiguous_strides(in_shape), strict=True)):
        if n == 1:
            out.append(ix.zero)
            continue
        quotient, _ = ix.divmod(flat, stride)
        if isinstance(n, Sym):  # the leading dim: flat < n * stride, so the quotient is in range
            assert k == 0, f"a symbolic size after the first dim of {list(in_shape)}"
            out.append(quotient)
            continue
        out.append(ix.divmod(quotient, n)[1])
    return tuple(out)


def _expand_index(ix, index, in_shape, out_shape, **attrs):
    """numpy's right-aligned broadcasting: a size-1 input dim is read at 0."""
    lead = len(index) - len(in_shape)
    return tuple(ix.zero if n == 1 else index[lead + k] for k, n in enumerate(in_shape))


def _permute_index(ix, index, in_shape, out_shape, *, perm):
    """Output dim ``i`` is input dim ``perm[i]``."""
    out = [ix.zero] * len(perm)
    for i, p in enumerate(perm):
        out[p] = index[i]
    return tuple(out)


def _slice_index(ix, index, in_shape, out_shape, *, starts, stops, steps):
    return tuple(
        ix.add(ix.scale(e, step), ix.const(start)) for e, start, step in zip(index, starts, steps, strict=True)
    )


def _listed(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _symbols_and_rest(shape) -> tuple[Counter, int]:
    """The symbols of ``shape`` (a product's factors counted each) and the product of the rest."""
    symbols: Counter = Counter()
    rest = 1
    for d in shape:
        scale, factors = dim_factors(d)
        symbols.update(factors)
        rest *= scale
    return symbols, rest


def _reshape_infer(x: TensorType, *, shape: tuple[Dim, ...]) -> TensorType:
    if x.is_static and is_static(shape):
        if numel(shape) != x.numel or any(isinstance(d, int) and d < 0 for d in shape):
            raise RuntimeError(f"shape {list(shape)} is invalid for input of size {x.numel} (shape {list(x.shape)})")
        return TensorType(tuple(shape), x.dtype, x.device)
    # Symbolic: each symbol stays a whole dimension, so the sizes match for every value of the symbols
    # exactly when both sides hold the same symbols and the same product of the other dims.
    if any(not isinstance(d, Sym) and (not isinstance(d, int) or d < 0) for d in shape):
        raise RuntimeError(f"reshape: expected a shape of non-negative ints and symbols, got {shape!r}")
    (given, rest_given), (wanted, rest_wanted) = _symbols_and_rest(x.shape), _symbols_and_rest(shape)
    rest = [rest_given, rest_wanted]
    if given != wanted or rest[0] != rest[1]:
        raise RuntimeError(
            f"shape {_listed(shape)} is invalid for input of shape {_listed(x.shape)}: a reshape keeps each symbolic "
            f"dimension whole (the same symbols on both sides) and the product of the others ({rest[0]} given, "
            f"{rest[1]} asked)"
        )
    return TensorType(tuple(shape), x.dtype, x.device)


reshape = register(Primitive(
    "reshape", Kind.MOVEMENT, _reshape_infer, lambda xp, x, *, shape: x.reshape(shape),
    lambda ops, c, g: (ops.reshape(g, c.input_types[0].shape),),
    reference=lambda torch, x, *, shape: x.reshape(shape),
    samples=lambda rng: [Sample((rng.normal(size=(2, 6)),), {"shape": (3, 4)}),
                         Sample((rng.normal(size=()),), {"shape": (1, 1)}),
                         Sample((rng.normal(size=(0, 2)),), {"shape": (2, 0)})],
    is_view=True, index_map=_reshape_index, doc="Row-major reshape of a tensor whose strides allow a view (the frontend copies first otherwise).",
))  # fmt: skip


def _expand_infer(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    lead = len(shape) - x.ndim
    ok = lead >= 0 and all(s == d or d == 1 for s, d in zip(shape[lead:], x.shape, strict=True))
    if not ok:
        raise RuntimeError(
            f"the expanded size {list(shape)} must match the existing size {list(x.shape)} at every "
            "non-singleton dimension (and have at least as many dimensions)"
        )
    return TensorType(tuple(shape), x.dtype, x.device)


expand = register(Primitive(
    "expand", Kind.MOVEMENT, _expand_infer, lambda xp, x, *, shape: xp.broadcast_to(x, shape),
    lambda ops, c, g: (ops.sum_to(g, c.input_types[0].shape),),
    reference=lambda torch, x, *, shape: x.expand(shape),
    samples=lambda rng: [Sample((rng.normal(size=(3, 1)),), {"shape": (2, 3, 4)}),
                         Sample((rng.normal(size=()),), {"shape": (5,)})],
    is_view=True, index_map=_expand_index, doc="Broadcast to `shape` without copying (stride 0 on the new dimensions).",
))  # fmt: skip


copy = register(Primitive(
    "copy", Kind.MOVEMENT, lambda x: x, lambda xp, x: xp.array(x, copy=True, order="C"),
    lambda ops, c, g: (g,), reference=lambda torch, x: x.clone(),
    samples=lambda rng: [Sample((rng.normal(size=(2, 3)).T,)), Sample((rng.normal(size=()),))],
    eager_into=lambda xp, x, *, out: xp.copyto(out, x), doc="A fresh row-major copy (clone, contiguous).",
))  # fmt: skip


# ----------------------------------------------------------------------------- permute
def _permute_infer(x: TensorType, *, perm: tuple[int, ...]) -> TensorType:
    if sorted(perm) != list(range(x.ndim)):
        raise RuntimeError(
            f"permute: expected a permutation of the {x.ndim} dims of an input of shape {list(x.shape)}, "
            f"got {list(perm)}"
        )
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype, x.device)


def inverse_permutation(perm: tuple[int, ...]) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return tuple(inverse)


permute = register(Primitive(
    "permute", Kind.MOVEMENT, _permute_infer, lambda xp, x, *, perm: x.transpose(perm),  # (xp.transpose: +0.6 us)
    lambda ops, c, g: (ops.permute(g, inverse_permutation(c.attrs["perm"])),),
    reference=lambda torch, x, *, perm: x.permute(perm),
    samples=lambda rng: [Sample((rng.normal(size=(2, 3, 4)),), {"perm": (2, 0, 1)}),
                         Sample((rng.normal(size=()),), {"perm": ()}),
                         Sample((rng.normal(size=(0, 3)),), {"perm": (1, 0)})],
    is_view=True, index_map=_permute_index, doc="Reorder the dims: output dim i is input dim perm[i] (a view).",
))  # fmt: skip


# ----------------------------------------------------------------------------- slice and pad
def sliced_size(start: int, stop: int, step: int) -> int:
    return max(0, (stop - start + step - 1) // step)


def _slice_infer(x: TensorType, *, starts, stops, steps) -> TensorType:
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ValueError(
            f"slice: expected one start/stop/step per dim of shape {list(x.shape)}, got starts {starts}, "
            f"stops {stops}, steps {steps}"
        )
    for axis, (a, b, s, n) in enumerate(zip(starts, stops, steps, x.shape, strict=True)):
        if isinstance(n, Sym) or isinstance(b, Sym):
            # a:b:1 to a symbolic stop (all of a symbolic dim, ``mask[:T]``, a padded image's inside): running
            # the graph checks that the size ``b`` binds to is at most ``n`` and at least ``a``
            # (``frontend/jit/dynamic.bind_graph``). A whole stop on a symbolic dim is refused but for the
            # first two steps (``x[:, 0]``, a CLS token), which every size a dynamic program serves (>= 2)
            # has; ``x[:, :3]`` of a length 2 would be shorter than the program's. (A whole stop Python
            # computed from the size, ``x[:n // 2]`` one number at 4 and 5, keeps the call static:
            # ``frontend/jit/watched_sizes.py``.)
            if s == 1 and isinstance(a, int) and isinstance(b, int) and 0 <= a <= b <= 2 and not isinstance(n, SymSum):
                continue
            if (
                s != 1
                or not isinstance(b, Sym)
                or _difference(b, a) is None
                or (isinstance(a, int) and a < 0)
                or not _within(n, a, b)
            ):
                raise SymbolicShapeError(
                    f"slice: dim {axis} of size {n} is symbolic (or sliced to a symbol): only start:stop:1 with a "
                    f"symbolic stop and a start it exceeds by a known size is supported yet, got {a}:{b}:{s}"
                )
            continue
        if s < 1 or not 0 <= a <= n or not 0 <= b <= n:
            raise IndexError(
                f"slice: dim {axis} of size {n} needs 0 <= start, stop <= {n} and step > 0, got {a}:{b}:{s}"
            )
    shape: list[Dim] = []
    for a, b, s, n in zip(starts, stops, steps, x.shape, strict=True):
        size = _difference(b, a) if isinstance(n, Sym) or isinstance(b, Sym) else sliced_size(a, b, s)
        assert size is not None, "checked above"
        shape.append(size)
    return TensorType(tuple(shape), x.dtype, x.device)


def _difference(stop: Dim, start: Dim) -> Dim | None:
    """``stop - start`` as a size, where every symbolic term of the start is a term of the stop: a
    whole start taken off (``(H+1) - 1``), a symbolic one (``(T+1) - T``: the gradient of a cat's last
    part), or the last steps of a symbolic length (``T - (T-1)``: ``y[:, -1]``); None otherwise (a
    difference that is not a size, or one that could be negative)."""
    if isinstance(start, int):
        return sym_sum([stop], -start)
    if stop == start:
        return 0
    stop_terms, start_terms = _linear(stop), _linear(start)
    if stop_terms is None or start_terms is None:
        return None
    rest = list(stop_terms[0])
    for term in start_terms[0]:
        if term not in rest:
            return None
        rest.remove(term)
    offset = stop_terms[1] - start_terms[1]
    return None if not rest and offset < 0 else sym_sum(rest, offset)


def _within(n: Dim, *bounds: Dim) -> bool:
    """Whether the symbols of a slice's bounds are the symbols of the dim it slices (a dim ``s1``
    sliced to ``s0+1`` holds only while ``s0 < s1``, which nothing checks: refused)."""
    if not isinstance(n, Sym):
        return True  # a whole dim sliced to a symbolic size: bind_graph checks the size fits
    return all(_symbols(b) <= _symbols(n) for b in bounds if isinstance(b, Sym))


def _symbols(size: Sym) -> set:
    """The terms of a symbolic size; a floor-divided one is a term of its own."""
    linear = _linear(size)
    return set(linear[0]) if linear is not None else {size}


def _linear(size: Dim) -> tuple[list, int] | None:
    """A symbolic size as its terms and whole offset (``(T-1)``: [T], -1); None for a floor-divided one."""
    if isinstance(size, SymSum):
        return (list(size.terms), size.offset) if size.divisor == 1 else None
    return ([size], 0) if isinstance(size, Sym) else None


def _slice_eager(xp, x, *, starts, stops, steps):
    return x[tuple(map(slice, starts, stops, steps))]


def _slice_vjp(ops, c, g):
    shape = c.input_types[0].shape
    a = c.attrs
    low = a["starts"]
    high = tuple(n - lo - m - max(m - 1, 0) * (s - 1) for n, lo, m, s in zip(shape, low, g.shape, a["steps"]))
    return (ops.strided_pad(g, low, high, tuple(s - 1 for s in a["steps"])),)


def _slice_samples(rng):
    x = rng.normal(size=(5, 6))
    return [
        Sample((x,), {"starts": (1, 0), "stops": (4, 6), "steps": (1, 2)}),
        Sample((x,), {"starts": (4, 5), "stops": (5, 1), "steps": (3, 1)}),  # empty along dim 1
        Sample((x,), {"starts": (0, 2), "stops": (5, 5), "steps": (2, 3)}),
        Sample((rng.normal(size=()),), {"starts": (), "stops": (), "steps": ()}),
    ]


slice_ = register(Primitive(
    "slice", Kind.MOVEMENT, _slice_infer, _slice_eager, _slice_vjp,
    reference=lambda torch, x, *, starts, stops, steps: x[tuple(map(slice, starts, stops, steps))],
    samples=_slice_samples, is_view=True, index_map=_slice_index,
    doc="Per-dim start:stop:step (normalized: 0 <= start, stop <= size, step > 0); a view.",
))  # fmt: skip


def padded_size(n: int, low: int, high: int, interior: int) -> int:
    return low + high + n + max(n - 1, 0) * interior


def _pad_infer(x: TensorType, *, low, high, interior, value) -> TensorType:
    if not len(low) == len(high) == len(interior) == x.ndim:
        raise ValueError(
            f"pad: expected one low/high/interior entry per dim of shape {list(x.shape)}, got low {low}, "
            f"high {high}, interior {interior}"
        )
    if any(isinstance(p, int) and p < 0 for p in (*low, *high, *interior)) or any(isinstance(i, Sym) for i in interior):
        raise ValueError(f"pad: padding must be non-negative, got low {low}, high {high}, interior {interior}")
    shape: list[Dim] = []
    for n, lo, hi, i in zip(x.shape, low, high, interior, strict=True):
        if isinstance(n, Sym):  # taken as >= 1: an empty dim specializes (dynamic.py)
            shape.append(sym_sum([sym_product(1 + i, [n]), lo, hi], -i))
        elif isinstance(lo, Sym) or isinstance(hi, Sym):  # (the gradient of ``y[:, -1]`` over a symbolic length)
            shape.append(sym_sum([lo, hi], padded_size(n, 0, 0, i)))
        else:
            shape.append(padded_size(n, lo, hi, i))
    return TensorType(tuple(shape), x.dtype, x.device)


def _interior_slices(shape, low, interior) -> tuple[slice, ...]:
    return tuple(slice(lo, lo + max(n - 1, 0) * (i + 1) + 1 if n else lo, i + 1)
                 for n, lo, i in zip(shape, low, interior))  # fmt: skip


def _pad_eager(xp, x, *, low, high, interior, value):
    shape = tuple(map(padded_size, x.shape, low, high, interior))
    if value == 0 and math.copysign(1.0, value) > 0:
        # Fresh zeroed memory takes no pass of its own: a gradient padded back to the width of the
        # output it was sliced from (an LSTM's packed states, 31 MB at T=350) costs a third as much.
        out = xp.zeros(shape, dtype=x.dtype)
        out[_interior_slices(x.shape, low, interior)] = x
        return out
    return _pad_into(xp, x, low=low, high=high, interior=interior, value=value, out=xp.empty(shape, dtype=x.dtype))


def _pad_into(xp, x, *, low, high, interior, value, out):
    out[...] = value
    out[_interior_slices(x.shape, low, interior)] = x
    return out


def _pad_vjp(ops, c, g):
    a = c.attrs
    shape = c.input_types[0].shape
    stops = tuple(lo + max(n - 1, 0) * (i + 1) + 1 if n else lo for n, lo, i in zip(shape, a["low"], a["interior"]))
    return (ops.strided_slice(g, a["low"], stops, tuple(i + 1 for i in a["interior"])),)


def _pad_reference(torch, x, *, low, high, interior, value):
    out = torch.full(tuple(map(padded_size, x.shape, low, high, interior)), value, dtype=x.dtype)
    out[_interior_slices(x.shape, low, interior)] = x
    return out


def _pad_samples(rng):
    return [
        Sample((rng.normal(size=(2, 3)),), {"low": (1, 0), "high": (0, 2), "interior": (0, 0), "value": 0.0}),
        Sample((rng.normal(size=(3, 2)),), {"low": (0, 2), "high": (1, 0), "interior": (2, 1), "value": -1.5}),
        Sample((rng.normal(size=(0, 2)),), {"low": (2, 0), "high": (1, 0), "interior": (1, 0), "value": 0.0}),
        Sample((rng.normal(size=()),), {"low": (), "high": (), "interior": (), "value": 0.0}),
    ]


pad = register(Primitive(
    "pad", Kind.MOVEMENT, _pad_infer, _pad_eager, _pad_vjp, reference=_pad_reference, samples=_pad_samples,
    eager_into=_pad_into,
    doc="Constant padding: `low`/`high` elements before/after each dim and `interior` between elements "
        "(XLA's pad); the VJP of a strided slice.",
))  # fmt: skip


# ----------------------------------------------------------------------------- concatenate, flip
def _concatenate_infer(*xs: TensorType, axis: int) -> TensorType:
    if not xs:
        raise ValueError("concatenate: expected a non-empty list of tensors")
    first = xs[0]
    if not 0 <= axis < max(first.ndim, 1) or first.ndim == 0:
        raise IndexError(f"concatenate: axis {axis} is out of range for inputs of shape {list(first.shape)}")
    for i, t in enumerate(xs[1:], 1):
        if t.dtype is not first.dtype:
            raise TypeError(f"concatenate: expected inputs of one dtype (promote first), got "
                            f"{first.dtype.name} and {t.dtype.name} for tensor number {i}")  # fmt: skip
        if t.ndim != first.ndim:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {first.ndim} and {t.ndim}")
        for d, (m, n) in enumerate(zip(first.shape, t.shape, strict=True)):
            if d != axis and m != n:
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension {axis}. Expected size {m} but got size {n} "
                    f"for tensor number {i} in the list (shapes {list(first.shape)} and {list(t.shape)})."
                )
    shape = list(first.shape)
    shape[axis] = sym_sum([t.shape[axis] for t in xs])  # a symbolic size joined gives a sum: (T+1)
    return TensorType(tuple(shape), first.dtype, first.device)


def _concatenate_vjp(ops, c, g):
    axis = c.attrs["axis"]
    grads, offset = [], 0
    for t, needed in zip(c.input_types, c.needs_input_grad, strict=True):
        n = t.shape[axis]
        grads.append(ops.narrow(g, axis, offset, n) if needed else None)
        offset += n
    return tuple(grads)


concatenate = register(Primitive(
    "concatenate", Kind.MOVEMENT, _concatenate_infer,
    lambda xp, *xs, axis: xp.concatenate(xs, axis=axis), _concatenate_vjp,
    reference=lambda torch, *xs, axis: torch.cat(xs, dim=axis),
    samples=lambda rng: [Sample((rng.normal(size=(2, 3)), rng.normal(size=(1, 3)), rng.normal(size=(0, 3))),
                                {"axis": 0}),
                         Sample((rng.normal(size=(2, 3)), rng.normal(size=(2, 1))), {"axis": 1}),
                         Sample((rng.normal(size=(4,)),), {"axis": 0})],
    doc="Join same-dtype tensors along an existing axis (sizes must match elsewhere).",
))  # fmt: skip


def _flip_infer(x: TensorType, *, axes: tuple[int, ...]) -> TensorType:
    if any(not 0 <= a < x.ndim for a in axes) or len(set(axes)) != len(axes):
        raise IndexError(f"flip: axes {axes} must be distinct dims of an input of shape {list(x.shape)}")
    return x


flip = register(Primitive(
    "flip", Kind.MOVEMENT, _flip_infer,
    # PyTorch's flip copies; numpy's is a negative-stride view, so copy it.
    lambda xp, x, *, axes: xp.array(xp.flip(x, axes), copy=True), lambda ops, c, g: (ops.flip(g, c.attrs["axes"]),),
    reference=lambda torch, x, *, axes: torch.flip(x, axes),
    samples=lambda rng: [Sample((rng.normal(size=(2, 3, 4)),), {"axes": (0, 2)}),
                         Sample((rng.normal(size=()),), {"axes": ()}),
                         Sample((rng.normal(size=(0, 2)),), {"axes": (1,)})],
    doc="Reverse the order of elements along `axes` (a copy, as in PyTorch).",
))  # fmt: skip
