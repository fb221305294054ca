"""Shape and view ops: reshape, expand, permute, slicing, cat, and friends.

Exactly PyTorch's view ops return views (sharing memory and the version counter with their
base). The shape ops that copy (flip, roll, repeat, cat, pad...) are in ``copies.py``.
"""

from __future__ import annotations

from ...ir.primitives import P
from ...ir.primitives.movement import reshape_view
from ...ir.shapes import normalize_axis, numel
from ..dispatch import apply
from ..tensor import Tensor, method
from ._views import broadcast_view, lean, wrap_view

__all__ = [
    "reshape", "view", "expand", "broadcast_to", "sum_to", "contiguous", "flatten", "unflatten", "squeeze",
    "unsqueeze", "permute", "transpose", "swapaxes", "swapdims", "t", "movedim", "moveaxis", "expand_as", "narrow",
    "select", "diagonal", "strided_slice", "strided_pad",
]  # fmt: skip

_reshape, _permute, _slice, _pad, _expand = P["reshape"], P["permute"], P["slice"], P["pad"], P["expand"]
_reduce_sum = P["reduce_sum"]


def _shape_arg(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = shape[0]
    return tuple(map(int, shape))  # (map: 0.3 us less than a generator for 4 dims)


def _infer_minus_one(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    if -1 not in shape:
        return shape
    if shape.count(-1) > 1:
        raise RuntimeError(f"only one dimension can be inferred, got shape {list(shape)}")
    known = numel([d for d in shape if d != -1])
    if known == 0 or size % known:
        raise RuntimeError(f"shape {list(shape)} is invalid for input of size {size}")
    return tuple(size // known if d == -1 else d for d in shape)


def _viewable(x: Tensor, shape: tuple[int, ...]) -> bool:
    if x._data.flags.c_contiguous:
        return True
    return reshape_view(x._data, shape) is not None


def _reshaped(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The reshape primitive's view (``x``'s strides allow it)."""
    if lean(x):
        try:
            return wrap_view(x, x._data.reshape(shape), _reshape, {"shape": shape})
        except ValueError:
            pass  # a size that does not fit: the primitive raises its shape rule's error
    return apply(_reshape, x, shape=shape)


@method("reshape")
def reshape(input: Tensor, *shape) -> Tensor:
    """A view when the strides allow it, else a copy (as ``torch.reshape``)."""
    shape = _infer_minus_one(_shape_arg(shape), input._data.size)
    if not _viewable(input, shape):
        input = contiguous(input)
    return _reshaped(input, shape)


@method("view")
def view(input: Tensor, *shape) -> Tensor:
    """Always a view; an error when the strides do not allow one (as ``torch.Tensor.view``)."""
    shape = _infer_minus_one(_shape_arg(shape), input._data.size)
    if not _viewable(input, shape):
        raise RuntimeError(
            f"view size {list(shape)} is not compatible with input tensor's size {list(input.shape)} and "
            f"stride {list(input.stride())} (at least one dimension spans across two contiguous subspaces). "
            "Use .reshape(...) instead."
        )
    return _reshaped(input, shape)


@method("expand")
def expand(input: Tensor, *shape) -> Tensor:
    shape = _shape_arg(shape)
    lead = len(shape) - input.ndim
    shape = tuple(input._data.shape[i - lead] if d == -1 and i >= lead else d for i, d in enumerate(shape))
    if shape == input._data.shape:
        return input
    if lean(input):
        try:
            return wrap_view(input, broadcast_view(input._data, shape), _expand, {"shape": shape})
        except ValueError:
            pass  # sizes that do not broadcast: the primitive raises its shape rule's error
    return apply(_expand, input, shape=shape)


@method("broadcast_to")
def broadcast_to(input: Tensor, shape) -> Tensor:
    return expand(input, tuple(shape))


def sum_to(input: Tensor, shape) -> Tensor:
    """Sum ``input`` down to ``shape`` (the reverse of broadcasting): the VJP of every broadcast."""
    shape = tuple(shape)
    given = input._data.shape
    if given == shape:
        return input
    lead = len(given) - len(shape)
    kept = tuple(lead + i for i, d in enumerate(shape) if d == 1 and given[lead + i] != 1)
    if not kept:  # only leading dims go (a bias's gradient): one reduction, no reshape
        return apply(_reduce_sum, input, axes=tuple(range(lead)), keepdim=False)
    out = apply(_reduce_sum, input, axes=tuple(range(lead)) + kept, keepdim=True)
    return out if lead == 0 else reshape(out, shape)


@method("contiguous")
def contiguous(input: Tensor) -> Tensor:
    if input._data.flags.c_contiguous:
        return input
    from .creation import clone  # noqa: PLC0415

    return clone(input)


def _dims_arg(dims) -> tuple:
    if len(dims) == 1 and isinstance(dims[0], tuple | list):
        return tuple(dims[0])
    return tuple(dims)


def _view_as(input: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A view with size-1 dims dropped or added: always possible without a copy."""
    return _reshaped(input, shape)


def _permuted(x: Tensor, perm: tuple[int, ...]) -> Tensor:
    """The permute primitive's view (``perm`` checked)."""
    if lean(x):
        return wrap_view(x, x._data.transpose(perm), _permute, {"perm": perm})
    return apply(_permute, x, perm=perm)


# ----------------------------------------------------------------------------- reshaping views
@method("flatten")
def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    shape = input._data.shape
    if not shape:
        return reshape(input, (1,))
    start, end = normalize_axis(start_dim, len(shape)), normalize_axis(end_dim, len(shape))
    if start > end:
        raise RuntimeError(f"flatten() has invalid args: start_dim ({start_dim}) cannot come after end_dim ({end_dim})")
    return reshape(input, shape[:start] + (numel(shape[start : end + 1]),) + shape[end + 1 :])


@method("unflatten")
def unflatten(input: Tensor, dim: int, sizes) -> Tensor:
    shape = input._data.shape
    dim = normalize_axis(dim, len(shape))
    sizes = _infer_minus_one(tuple(int(s) for s in sizes), shape[dim])
    if numel(sizes) != shape[dim]:
        raise RuntimeError(
            f"unflatten: provided sizes {list(sizes)} don't multiply up to the size of dim {dim} ({shape[dim]}) "
            f"in the input tensor of shape {list(shape)}"
        )
    return view(input, shape[:dim] + sizes + shape[dim + 1 :])


@method("squeeze")
def squeeze(input: Tensor, dim=None) -> Tensor:
    """Drop size-1 dims: all of them, or those of ``dim`` (an int or a tuple) that have size 1."""
    shape = input._data.shape
    if dim is None:
        dims = {i for i, n in enumerate(shape) if n == 1}
    else:
        dims = {normalize_axis(d, len(shape)) for d in ((dim,) if isinstance(dim, int) else dim)}
    return _view_as(input, tuple(n for i, n in enumerate(shape) if not (i in dims and n == 1)))


@method("unsqueeze")
def unsqueeze(input: Tensor, dim: int) -> Tensor:
    shape = input._data.shape
    dim = normalize_axis(dim, len(shape) + 1)
    return _view_as(input, shape[:dim] + (1,) + shape[dim:])


@method("expand_as")
def expand_as(input: Tensor, other: Tensor) -> Tensor:
    return expand(input, tuple(other._data.shape))


# ----------------------------------------------------------------------------- permuting views
@method("permute")
def permute(input: Tensor, *dims) -> Tensor:
    ndim = input._data.ndim
    dims = _dims_arg(dims)
    if len(dims) != ndim:
        raise RuntimeError(
            f"permute(): number of dims don't match: the input has {ndim} dims (shape {list(input.shape)}) "
            f"but {len(dims)} were given ({list(dims)})"
        )
    perm = tuple(normalize_axis(d, ndim) for d in dims)
    if len(set(perm)) != ndim:
        raise RuntimeError(f"permute(): duplicate dims are not allowed, got {list(dims)}")
    return _permuted(input, perm)


@method("transpose", "swapaxes", "swapdims")
def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    ndim = input._data.ndim
    perm = list(range(ndim))
    a, b = normalize_axis(dim0, ndim), normalize_axis(dim1, ndim)
    perm[a], perm[b] = perm[b], perm[a]
    return _permuted(input, tuple(perm))


swapaxes = swapdims = transpose


@method("t")
def t(input: Tensor) -> Tensor:
    if input._data.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {input._data.ndim}D")
    return _permuted(input, tuple(reversed(range(input._data.ndim))))


def _reversed_dims(self: Tensor) -> Tensor:
    """``x.T``: the dims in reverse order (a view)."""
    return _permuted(self, tuple(reversed(range(self._data.ndim))))


def _matrix_transpose(self: Tensor) -> Tensor:
    """``x.mT``: the last two dims swapped (a view)."""
    if self._data.ndim < 2:
        raise RuntimeError(f"tensor.mT is only supported on matrices or batches of matrices. Got {self.ndim}-D tensor.")
    return transpose(self, -2, -1)


Tensor.T = property(_reversed_dims)  # type: ignore[attr-defined]  # bound at import, as @method does
Tensor.mT = property(_matrix_transpose)  # type: ignore[attr-defined]


@method("movedim", "moveaxis")
def movedim(input: Tensor, source, destination) -> Tensor:
    ndim = input._data.ndim
    source = (source,) if isinstance(source, int) else tuple(source)
    destination = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(source) != len(destination):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(source)} dims) should "
                           f"contain the same number of dims as destination ({list(destination)} dims)")  # fmt: skip
    src = [normalize_axis(d, ndim) for d in source]
    dst = [normalize_axis(d, ndim) for d in destination]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise RuntimeError(f"movedim: repeated dim in source {list(source)} or destination {list(destination)}")
    perm = [-1] * ndim
    for s, d in zip(src, dst, strict=True):
        perm[d] = s
    rest = iter(i for i in range(ndim) if i not in src)
    return _permuted(input, tuple(p if p >= 0 else next(rest) for p in perm))


moveaxis = movedim


# ----------------------------------------------------------------------------- slicing views
def strided_slice(input: Tensor, starts, stops, steps) -> Tensor:
    """``input[a0:b0:s0, a1:b1:s1, ...]`` with normalized bounds per dim (a view); the slice primitive."""
    starts, stops, steps = tuple(starts), tuple(stops), tuple(steps)
    if lean(input) and _slice_in_bounds(input._data.shape, starts, stops, steps):
        array = input._data[tuple(map(slice, starts, stops, steps))]
        return wrap_view(input, array, _slice, {"starts": starts, "stops": stops, "steps": steps})
    return apply(_slice, input, starts=starts, stops=stops, steps=steps)


def _slice_in_bounds(shape: tuple[int, ...], starts: tuple, stops: tuple, steps: tuple) -> bool:
    """Whether the slice rule accepts these bounds (numpy would clamp them instead). A 0-d array is left
    to the primitive: its empty index gives a numpy scalar."""
    if not shape or not len(starts) == len(stops) == len(steps) == len(shape):
        return False
    return all([0 <= a <= n and 0 <= b <= n and s > 0 for a, b, s, n in zip(starts, stops, steps, shape)])


def strided_pad(input: Tensor, low, high, interior, value=0) -> Tensor:
    """``value`` around (``low``/``high`` per dim) and between (``interior``) the elements: the pad primitive.

    ``strided_pad(x, (1,), (0,), (1,))`` of ``[a, b]`` is ``[0, a, 0, b]``; it is the VJP of ``strided_slice``.
    """
    return apply(_pad, input, low=tuple(low), high=tuple(high), interior=tuple(interior), value=value)


@method("narrow")
def narrow(input: Tensor, dim: int, start: int, length: int) -> Tensor:
    shape = input._data.shape
    if not shape:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    dim = normalize_axis(dim, len(shape))
    start, length, n = int(start), int(length), shape[dim]
    if not -n <= start <= n:
        raise IndexError(f"start out of range (expected to be in range of [{-n}, {n}], but got {start})")
    start %= n if n else 1
    if length < 0 or start + length > n:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({n}).")
    starts, stops = [0] * len(shape), list(shape)
    starts[dim], stops[dim] = start, start + length
    steps = (1,) * len(shape)
    if lean(input):  # (bounds checked above)
        array = input._data[(slice(None),) * dim + (slice(start, start + length),)]
        return wrap_view(input, array, _slice, {"starts": tuple(starts), "stops": tuple(stops), "steps": steps})
    return apply(_slice, input, starts=tuple(starts), stops=tuple(stops), steps=steps)


def _strided_diagonal(input: Tensor, a: int, b: int, offset: int, length: int) -> Tensor | None:
    """``diagonal``'s view through ``as_strided``: the other dims, then a step of both dims' strides;
    None where the memory is no dense block (``as_strided`` cannot measure within it)."""
    from .inplace_views import _storage, as_strided  # noqa: PLC0415 - inplace_views builds on this module

    if _storage(input._base if input._base is not None else input) is None:
        return None
    shape, item = input._data.shape, input._data.itemsize
    strides = [s // item for s in input._data.strides]
    rest = [d for d in range(len(shape)) if d not in (a, b)]
    start = input.storage_offset() + (offset * strides[b] if offset >= 0 else -offset * strides[a])
    size = [shape[d] for d in rest] + [length]
    return as_strided(input, size, [strides[d] for d in rest] + [strides[a] + strides[b]], start if length else 0)


@method("select")
def select(input: Tensor, dim: int, index: int) -> Tensor:
    shape = input._data.shape
    if not shape:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    dim = normalize_axis(dim, len(shape))
    n = shape[dim]
    if not -n <= index < n:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(shape)} at dimension {dim}")
    return _view_as(narrow(input, dim, index % n, 1), shape[:dim] + shape[dim + 1 :])


@method("diagonal")
def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of the (dim1, dim2) planes as a last dim, a view of ``input`` (a write through it
    writes ``input``), as PyTorch's: a strided slice of the two dims flattened together where they
    flatten without a copy, else a strided view of the memory (``as_strided``: dims apart in memory,
    ``x.diagonal(0, 0, 2)``, whose flattening was a copy that writes never reached)."""
    ndim = input._data.ndim
    a, b = normalize_axis(dim1, ndim), normalize_axis(dim2, ndim)
    if a == b:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    moved = movedim(input, (a, b), (-2, -1))
    rows, cols = moved._data.shape[-2:]
    length = max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
    row_stride, col_stride = moved._data.strides[-2:]
    if rows > 1 and cols > 1 and row_stride != col_stride * cols:
        strided = _strided_diagonal(input, a, b, offset, length)
        if strided is not None:
            return strided
    start = offset if offset >= 0 else -offset * cols
    flat = reshape(moved, moved._data.shape[:-2] + (rows * cols,))
    lead = flat._data.ndim - 1
    stop = start + (length - 1) * (cols + 1) + 1 if length else start
    return strided_slice(flat, (0,) * lead + (min(start, rows * cols),), flat._data.shape[:-1] + (min(stop, rows * cols),),
                         (1,) * lead + (cols + 1,))  # fmt: skip
