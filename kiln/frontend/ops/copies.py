"""Shape ops that copy: flip, roll, repeat, tile, cat, stack, tril/triu, pad.

PyTorch copies for these, so kiln does too, even where numpy would return a view (flip).
"""

from __future__ import annotations

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.shapes import normalize_axis
from ...ir.types import CPU, Device
from ...runtime.devices import to_device
from ..autograd import grad_mode
from ..autograd.graph import LazyEdgesNode, pending_edge
from ..dispatch import apply
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor, method
from ._util import cast, plain_arrays, recomputed_gradients
from .elementwise import where
from .shape import _shape_arg, _view_as, expand, flatten, narrow, reshape, strided_pad, strided_slice, unsqueeze

__all__ = [
    "flip", "roll", "repeat", "tile", "cat", "concat", "concatenate", "stack", "tril", "triu", "pad",
]  # fmt: skip


# ----------------------------------------------------------------------------- copies
@method("flip")
def flip(input: Tensor, dims) -> Tensor:
    """Reverse along ``dims`` (a copy, as in PyTorch; numpy would return a view)."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    axes = tuple(normalize_axis(d, input._data.ndim) for d in dims)
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"flip: dims has duplicates, original flip dims size={len(dims)}, but unique flip dims "
                           f"size={len(set(axes))}")  # fmt: skip
    return apply(P["flip"], input, axes=axes)


@method("roll")
def roll(input: Tensor, shifts, dims=None) -> Tensor:
    """Shift elements along ``dims``, wrapping around (a copy); without dims, over the flattened tensor."""
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    if dims is None:
        if len(shifts) != 1:
            raise RuntimeError(f"roll: shifts {list(shifts)} need matching dims when more than one is given")
        return reshape(roll(flatten(input), shifts, 0), tuple(input._data.shape))
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims: {len(dims)}")
    out = input
    for shift, dim in zip(shifts, dims, strict=True):
        dim = normalize_axis(dim, input._data.ndim)
        n = input._data.shape[dim]
        s = shift % n if n else 0
        out = cat([narrow(out, dim, n - s, s), narrow(out, dim, 0, n - s)], dim)
    return out if out is not input else _copy(input)


def _copy(input: Tensor) -> Tensor:
    """A fresh contiguous copy (the copy primitive; ``clone`` lives in creation)."""
    return apply(P["copy"], input)


@method("repeat")
def repeat(input: Tensor, *sizes) -> Tensor:
    """Tile ``input`` ``sizes[i]`` times along dim i (a copy); extra leading sizes add dims."""
    sizes = _shape_arg(sizes)
    shape = input._data.shape
    if len(sizes) < len(shape):
        raise RuntimeError(f"Number of dimensions of repeat dims ({len(sizes)}) can not be smaller than number of "
                           f"dimensions of tensor ({len(shape)})")  # fmt: skip
    if any(r < 0 for r in sizes):
        raise RuntimeError(f"Trying to create tensor with negative dimension: repeats {list(sizes)}")
    shape = (1,) * (len(sizes) - len(shape)) + shape
    interleaved = _view_as(input, tuple(d for n in shape for d in (1, n)))
    expanded = expand(interleaved, tuple(d for r, n in zip(sizes, shape, strict=True) for d in (r, n)))
    # one copy, always: a stride-0 reshape would otherwise share memory where PyTorch's result does not
    return _view_as(_copy(expanded), tuple(r * n for r, n in zip(sizes, shape, strict=True)))


@method("tile")
def tile(input: Tensor, dims) -> Tensor:
    dims = tuple(dims)
    return repeat(input, (1,) * (input._data.ndim - len(dims)) + dims)


def _cat_inputs(tensors, op: str) -> list[Tensor]:
    if isinstance(tensors, Tensor):
        raise TypeError(f"{op}(): argument 'tensors' must be a tuple or list of Tensors, not Tensor")
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{op}(): expected a non-empty list of Tensors")
    if not all([isinstance(x, Tensor) for x in tensors]):
        i, x = next((i, x) for i, x in enumerate(tensors) if not isinstance(x, Tensor))
        raise TypeError(f"{op}(): expected a list of Tensors, but element {i} is {type(x).__name__}")
    return tensors


def cat(tensors, dim: int = 0) -> Tensor:
    """Join along ``dim`` (a copy); dtypes promote as in PyTorch, and legacy 1-d empty tensors are skipped."""
    return _join(_cat_inputs(tensors, "cat"), dim)


def _join(tensors: list[Tensor], dim: int) -> Tensor:
    """``cat`` of a checked list (each step one pass in C where it can be: a collate joins many)."""
    dtypes = {x._dtype for x in tensors}
    dtype = tensors[0]._dtype
    for other in dtypes - {dtype}:
        dtype = dt.promote_types(dtype, other)
    # PyTorch ignores tensors of shape (0,) whatever the others' shape (a legacy rule kept for old code)
    kept = [x for x in tensors if x._data.shape != (0,)] or tensors[:1]
    if not all([x._data.ndim for x in tensors]):
        i = next(i for i, x in enumerate(tensors) if x._data.ndim == 0)
        raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    axis = normalize_axis(dim, kept[0]._data.ndim)
    if len(dtypes) > 1:
        kept = [cast(x, dtype) for x in kept]
    return apply(P["concatenate"], *kept, axis=axis)


concat = concatenate = cat


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = _cat_inputs(tensors, "stack")
    shape = tensors[0]._data.shape
    for i, x in enumerate(tensors[1:], 1):
        if x._data.shape != shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(shape)} at entry 0 and "
                               f"{list(x.shape)} at entry {i}")  # fmt: skip
    dim = normalize_axis(dim, len(shape) + 1)
    if plain_arrays(*tensors):  # (not in traces: they record the ops)
        return _stack_arrays(tensors, dim)
    return _stack_ops(tensors, dim)


def _stack_ops(tensors: list[Tensor], dim: int) -> Tensor:
    shape = tensors[0]._data.shape
    if dim < len(shape) and 0 not in shape and not _jit.tracing:
        # joined along ``dim``, then that dim split in two: the same copy without a view per tensor
        # (DataLoader's collate of 32 small tensors: 61 -> 16 us; torch's 3.5). Not in a trace: a
        # dynamic size's reshape keeps each symbol whole, and ``n * s`` split into ``(n, s)`` is not
        return reshape(_join(tensors, dim), shape[:dim] + (len(tensors),) + shape[dim:])
    return _join([unsqueeze(x, dim) for x in tensors], dim)


def _stack_arrays(tensors: list[Tensor], dim: int) -> Tensor:
    """``stack`` of plain float tensors of one dtype, eager, as one node (``StackBackward``): stacking
    scalars (an actor-critic's 500 per-step losses) made an ``unsqueeze`` node per tensor and the
    ``concatenate``'s backward a view per tensor, PyTorch one StackBackward0."""
    first = tensors[0]
    arrays = [x._data for x in tensors]
    # (numpy's array of 0-d arrays is their stack, 10x faster than np.stack's per-array checks)
    joined = np.array(arrays) if dim == 0 and not first._data.ndim else np.stack(arrays, axis=dim)
    result = make_tensor(joined, first._device, first._dtype)
    if grad_mode.state.grad_enabled and any([x._requires_grad for x in tensors]):
        if grad_mode.inference_used and any([x._inference for x in tensors]):
            return _stack_ops(tensors, dim)  # (the ops raise the error of saving an inference tensor)
        StackBackward.attach(result, tuple(tensors), dim)
    return result


class StackBackward(LazyEdgesNode):
    """The backward of ``_stack_arrays``: the gradient split along ``dim``, a view per tensor. It keeps
    the tensors only to recompute the ops where a graph (create_graph) or a trace must see them, and
    reads none of their values: an in-place change after the stack is no error, as in PyTorch."""

    __slots__ = ("tensors", "dim")
    tensors: tuple | None
    dim: int

    @classmethod
    def attach(cls, result: Tensor, tensors: tuple, dim: int) -> None:
        node = cls(tuple([pending_edge(t) for t in tensors]))
        node.tensors, node.dim = tensors, dim
        result.grad_fn, result._output_nr, result._requires_grad = node, 0, True

    def name(self) -> str:
        return "StackBackward0"

    def apply(self, grads: list) -> tuple:
        g, tensors = grads[0], self.tensors
        if tensors is None:
            raise RuntimeError("Trying to backward through the graph a second time (through StackBackward0): its "
                               "saved tensors were freed after the first backward. Pass retain_graph=True.")  # fmt: skip
        if grad_mode.state.grad_enabled or not plain_arrays(g):  # a graph, a trace or a profile records ops
            wanted = tuple(edge is not None for edge in self.next_edges)
            return recomputed_gradients(lambda *xs: _stack_ops(list(xs), self.dim), tensors, wanted, g)
        parts = np.moveaxis(g._data, self.dim, 0)
        return tuple(None if edge is None else make_tensor(parts[k], g._device, g._dtype)
                     for k, edge in enumerate(self.next_edges))  # fmt: skip

    def release(self) -> None:
        self.tensors = None


# ----------------------------------------------------------------------------- triangles, padding
def _triangle(input: Tensor, diagonal: int, lower: bool, op: str) -> Tensor:
    if input._data.ndim < 2:
        raise RuntimeError(f"{op}: input tensor must have at least 2 dimensions, got shape {list(input.shape)}")
    rows, cols = input._data.shape[-2:]
    offsets = np.arange(cols)[None, :] - np.arange(rows)[:, None]  # col - row
    keep = offsets <= diagonal if lower else offsets >= diagonal
    return where(constant(keep, input._device), input, constant(np.zeros((), input._dtype.np), input._device))


def constant(array: np.ndarray, device: Device) -> Tensor:
    """A constant numpy array as a tensor on ``device`` (index tables, masks)."""
    if device is CPU:
        return make_tensor(array)
    return make_tensor(to_device(array, device), device)


@method("tril")
def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    """Keep the elements on and below the ``diagonal``-th diagonal of the last two dims; zero the rest."""
    return _triangle(input, diagonal, True, "tril")


@method("triu")
def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    """Keep the elements on and above the ``diagonal``-th diagonal of the last two dims; zero the rest."""
    return _triangle(input, diagonal, False, "triu")


def pad(input: Tensor, pad, mode: str = "constant", value=None) -> Tensor:
    """``torch.nn.functional.pad``: ``pad = (left, right, top, bottom, ...)`` from the last dim backward.

    Negative amounts crop. ``mode`` is "constant" (with ``value``, default 0), "reflect",
    "replicate" or "circular".
    """
    pad = tuple(int(p) for p in pad)
    shape = input._data.shape
    if len(pad) % 2 or len(pad) // 2 > len(shape):
        raise RuntimeError(f"Padding length must be divisible by 2 and at most twice the number of dims "
                           f"({len(shape)}), got pad {list(pad)}")  # fmt: skip
    low, high = [0] * len(shape), [0] * len(shape)
    for i in range(len(pad) // 2):
        low[-1 - i], high[-1 - i] = pad[2 * i], pad[2 * i + 1]
    if mode != "constant":
        if value not in (None, 0):
            raise ValueError(f'Padding mode "{mode}" doesn\'t take in value argument')
        return _pad_by_index(input, low, high, mode)
    if any(p < 0 for p in low + high):  # crop first, then pad what remains positive
        starts = [max(-p, 0) for p in low]
        stops = [n - max(-p, 0) for n, p in zip(shape, high, strict=True)]
        if any(a > b for a, b in zip(starts, stops, strict=True)):
            raise RuntimeError(f"pad {list(pad)} crops more than the input's shape {list(shape)}")
        input = strided_slice(input, starts, stops, (1,) * len(shape))
        low, high = [max(p, 0) for p in low], [max(p, 0) for p in high]
    return strided_pad(input, low, high, (0,) * len(shape), 0 if value is None else value)


def _pad_by_index(input: Tensor, low, high, mode: str) -> Tensor:
    """Reflect/replicate/circular padding: each dim is an index_select of computed positions."""
    from .indexing import index_select  # noqa: PLC0415 - indexing imports this module

    shape = input._data.shape
    out = input
    for dim, (lo, hi, n) in enumerate(zip(low, high, shape, strict=True)):
        if not lo and not hi:
            continue
        limit = n - 1 if mode == "reflect" else n
        if mode != "replicate" and (lo > limit or hi > limit) or n == 0:
            raise RuntimeError(f"{mode} padding: padding ({lo}, {hi}) at dimension {dim} must be at most "
                               f"{limit} for input of shape {list(shape)}")  # fmt: skip
        pos = np.arange(-lo, n + hi)
        if mode == "reflect":
            pos = np.abs(pos)
            pos = np.where(pos > n - 1, 2 * (n - 1) - pos, pos)
        elif mode == "replicate":
            pos = np.clip(pos, 0, n - 1)
        elif mode == "circular":
            pos = pos % n
        else:
            raise NotImplementedError(
                f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}"
            )
        index = constant(pos.astype(np.int64), input._device)
        out = index_select(out, dim, index)
    return out
