"""More of PyTorch's shape names, over kiln's views and copies: the ``*stack`` and ``*split``
families, ``rot90``, ``diff``, broadcasting helpers, ``take_along_dim``, index grids
(``tril_indices``, ``cartesian_prod``, ``combinations``), ``block_diag`` and ``Tensor.unfold``.

All are compositions of existing ops (``cat``, ``narrow``, ``flip``, ``transpose``, ``gather``...):
their gradients come from those ops and ``kiln.compile`` traces them. Index grids whose size
depends only on Python ints are built with numpy as constants.
"""

from __future__ import annotations

import itertools

import numpy as np

from ...ir import dtypes as dt
from ...ir.shapes import normalize_axis
from ..tensor import Tensor, make_tensor, method
from .copies import cat, constant, flip, stack
from .creation import placement, zeros
from .elementwise import sub
from .indexing import gather, index_select
from .pieces import split
from .shape import broadcast_to, expand, movedim, narrow, reshape, sum_to, transpose, unsqueeze

__all__ = [
    "atleast_1d", "atleast_2d", "atleast_3d", "hstack", "vstack", "row_stack", "dstack", "column_stack",
    "tensor_split", "hsplit", "vsplit", "dsplit", "fliplr", "flipud", "rot90", "diff", "ravel",
    "broadcast_shapes", "broadcast_tensors", "take_along_dim", "block_diag", "cartesian_prod", "combinations",
    "tril_indices", "triu_indices",
]  # fmt: skip


def _tensors(tensors, op: str) -> list[Tensor]:
    if isinstance(tensors, Tensor):
        raise TypeError(f"{op}(): argument 'tensors' must be a tuple or list of Tensors, not Tensor")
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError(f"{op} expects a non-empty TensorList")
    return tensors


def _atleast(tensors, ndim: int):
    def lift(x: Tensor) -> Tensor:
        if x.ndim >= ndim:
            return x
        if ndim == 3 and x.ndim == 2:
            return unsqueeze(x, -1)
        if x.ndim == 0:
            return reshape(x, (1,) * ndim)
        return reshape(x, (1,) * (ndim - 1 - (ndim == 3)) + tuple(x.shape) + (1,) * (ndim == 3))

    if len(tensors) == 1 and not isinstance(tensors[0], Tensor):
        return tuple(lift(x) for x in tensors[0])
    return lift(tensors[0]) if len(tensors) == 1 else tuple(lift(x) for x in tensors)


def atleast_1d(*tensors):
    return _atleast(tensors, 1)


def atleast_2d(*tensors):
    """0-d to (1, 1), 1-d (n,) to (1, n)."""
    return _atleast(tensors, 2)


def atleast_3d(*tensors):
    """0-d to (1, 1, 1), (n,) to (1, n, 1), (m, n) to (m, n, 1), as numpy's."""
    return _atleast(tensors, 3)


def hstack(tensors) -> Tensor:
    """Concatenated along the columns: dim 0 for 1-d tensors, dim 1 otherwise."""
    tensors = [atleast_1d(x) for x in _tensors(tensors, "hstack")]
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


def vstack(tensors) -> Tensor:
    return cat([atleast_2d(x) for x in _tensors(tensors, "vstack")], 0)


row_stack = vstack


def dstack(tensors) -> Tensor:
    return cat([atleast_3d(x) for x in _tensors(tensors, "dstack")], 2)


def column_stack(tensors) -> Tensor:
    """1-d (and 0-d) tensors become columns, then concatenated along dim 1."""
    tensors = _tensors(tensors, "column_stack")
    return cat([reshape(x, (x.numel(), 1)) if x.ndim <= 1 else x for x in tensors], 1)


@method("tensor_split")
def tensor_split(input: Tensor, indices_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Views split at the given indices, or into ``sections`` pieces whose sizes differ by at most
    one (the first ``n % sections`` one larger), as PyTorch's (and numpy's array_split)."""
    if input.ndim == 0:
        raise RuntimeError("tensor_split expected at least a 1-dimensional tensor, but got a tensor with 0 dims")
    dim = normalize_axis(dim, input.ndim)
    n = input.shape[dim]
    if isinstance(indices_or_sections, Tensor):
        if indices_or_sections.ndim > 1 or indices_or_sections.dtype != dt.int64:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to be a zero-dimensional or "
                               "one-dimensional tensor of dtype long")  # fmt: skip
        indices_or_sections = indices_or_sections.tolist()
    if isinstance(indices_or_sections, int):
        sections = indices_or_sections
        if sections <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {sections}")
        size, extra = divmod(n, sections)
        bounds = list(itertools.accumulate([size + 1] * extra + [size] * (sections - extra), initial=0))
    else:
        bounds = [0] + [min(max(int(i) if i >= 0 else n + int(i), 0), n) for i in indices_or_sections] + [n]
    pieces = []
    for start, stop in itertools.pairwise(bounds):
        start = min(start, n)
        pieces.append(narrow(input, dim, start, max(stop - start, 0)))
    return tuple(pieces)


def _split_named(input: Tensor, indices_or_sections, dim: int, op: str, min_ndim: int) -> tuple[Tensor, ...]:
    if input.ndim < min_ndim:
        raise RuntimeError(
            f"torch.{op} requires a tensor with at least {min_ndim} dimension, but got a tensor with {input.ndim} dimensions!"
        )
    if isinstance(indices_or_sections, int):
        n = input.shape[dim]
        if indices_or_sections == 0 or n % indices_or_sections:
            raise RuntimeError(
                f"torch.{op} attempted to split along dimension {dim}, but the size of the dimension {n} "
                f"is not divisible by the split_size {indices_or_sections}!"
            )
    return tensor_split(input, indices_or_sections, dim)


@method("hsplit")
def hsplit(input: Tensor, indices_or_sections) -> tuple[Tensor, ...]:
    return _split_named(input, indices_or_sections, 0 if input.ndim == 1 else 1, "hsplit", 1)


@method("vsplit")
def vsplit(input: Tensor, indices_or_sections) -> tuple[Tensor, ...]:
    return _split_named(input, indices_or_sections, 0, "vsplit", 2)


@method("dsplit")
def dsplit(input: Tensor, indices_or_sections) -> tuple[Tensor, ...]:
    return _split_named(input, indices_or_sections, 2, "dsplit", 3)


@method("split_with_sizes")
def split_with_sizes(input: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    return split(input, list(split_sizes), dim)


@method("fliplr")
def fliplr(input: Tensor) -> Tensor:
    if input.ndim < 2:
        raise RuntimeError("Input must be >= 2-d.")
    return flip(input, (1,))


@method("flipud")
def flipud(input: Tensor) -> Tensor:
    if input.ndim < 1:
        raise RuntimeError("Input must be >= 1-d.")
    return flip(input, (0,))


@method("rot90")
def rot90(input: Tensor, k: int = 1, dims=(0, 1)) -> Tensor:
    """Rotated by 90 degrees k times in the plane ``dims``, from the first axis towards the second."""
    dims = tuple(dims)
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if input.ndim < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {input.ndim}")
    d0, d1 = normalize_axis(dims[0], input.ndim), normalize_axis(dims[1], input.ndim)
    if d0 == d1:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} and dim1 = {d1}")
    k %= 4
    if k == 1:
        return transpose(flip(input, (d1,)), d0, d1)
    if k == 2:
        return flip(input, (d0, d1))
    if k == 3:
        return flip(transpose(input, d0, d1), (d1,))
    return input.clone()


@method("diff")
def diff(input: Tensor, n: int = 1, dim: int = -1, prepend=None, append=None) -> Tensor:
    """The n-th forward difference along ``dim`` (``prepend``/``append`` concatenated first); bool
    tensors give ``!=`` of neighbours, as PyTorch's."""
    if input.ndim == 0:
        raise RuntimeError("diff expects input to be at least one-dimensional")
    if n < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")
    dim = normalize_axis(dim, input.ndim)
    parts = [x for x in (prepend, input, append) if x is not None]
    x = cat(parts, dim) if len(parts) > 1 else input
    for _ in range(n):
        length = x.shape[dim]
        if length == 0:
            break
        hi, lo = narrow(x, dim, 1, length - 1), narrow(x, dim, 0, length - 1)
        x = hi != lo if x.dtype == dt.bool_ else sub(hi, lo)
    return x


@method("ravel")
def ravel(input: Tensor) -> Tensor:
    return reshape(input, (-1,))


def broadcast_shapes(*shapes):
    """The shape all the given shapes broadcast to (a ``kiln.Size``), or a RuntimeError naming them."""
    from ..tensor import Size  # noqa: PLC0415

    shapes = [(s,) if isinstance(s, int) else tuple(s) for s in shapes]
    try:
        return Size(np.broadcast_shapes(*shapes))
    except ValueError:
        raise RuntimeError(f"Shape mismatch: objects cannot be broadcast to a single shape: {shapes}") from None


def broadcast_tensors(*tensors) -> tuple[Tensor, ...]:
    if len(tensors) == 1 and not isinstance(tensors[0], Tensor):
        tensors = tuple(tensors[0])
    shape = broadcast_shapes(*(tuple(x.shape) for x in tensors))
    return tuple(broadcast_to(x, shape) for x in tensors)


@method("take_along_dim")
def take_along_dim(input: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """``gather`` with the two broadcast against each other (all but ``dim``); ``dim=None`` flattens both."""
    if indices.dtype != dt.int64:
        raise RuntimeError(f"torch.take_along_dim(): dtype of indices should be Long but got {indices.dtype.name}")
    if dim is None:
        return gather(reshape(input, (-1,)), 0, reshape(indices, (-1,)))
    dim = normalize_axis(dim, input.ndim)
    a_shape, i_shape = list(input.shape), list(indices.shape)
    a_shape[dim] = i_shape[dim] = 1
    shape = list(broadcast_shapes(a_shape, i_shape))
    in_shape, idx_shape = shape.copy(), shape.copy()
    in_shape[dim], idx_shape[dim] = input.shape[dim], indices.shape[dim]
    return gather(expand(input, tuple(in_shape)), dim, expand(indices, tuple(idx_shape)))


@method("reshape_as")
def reshape_as(input: Tensor, other: Tensor) -> Tensor:
    return reshape(input, tuple(other.shape))


@method("sum_to_size")
def sum_to_size(input: Tensor, *size) -> Tensor:
    """Summed down to ``size``, which ``input`` must be expandable from (the reverse of ``expand``)."""
    shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)
    try:
        np.broadcast_shapes(shape, tuple(input.shape))
        ok = np.broadcast_shapes(shape, tuple(input.shape)) == tuple(input.shape)
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(f"size {list(shape)} is not expandable to size {list(input.shape)}")
    return sum_to(input, shape)


def block_diag(*tensors) -> Tensor:
    """The tensors (0-d, 1-d as a row, or 2-d) along the diagonal of a zero matrix, in their promoted dtype."""
    blocks = [reshape(x, (1, -1)) if x.ndim < 2 else x for x in tensors]
    for i, x in enumerate(tensors):
        if x.ndim > 2:
            raise RuntimeError(
                f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input {i} has {x.ndim} dimensions"
            )
    if not blocks:
        return zeros((1, 0))
    dtype = dt.result_type(*blocks)
    cols = sum(b.shape[1] for b in blocks)
    rows, left = [], 0
    for b in blocks:
        width = b.shape[1]
        pieces = [
            zeros((b.shape[0], left), dtype=dtype),
            b.to(dtype),
            zeros((b.shape[0], cols - left - width), dtype=dtype),
        ]
        rows.append(cat(pieces, 1))
        left += width
    return cat(rows, 0)


def cartesian_prod(*tensors) -> Tensor:
    """Every combination of the 1-d tensors' elements, one per row (a 1-d tensor for one input)."""
    for x in tensors:
        if x.ndim != 1:
            raise RuntimeError(f"Expect a 1D vector, but got shape {list(x.shape)}")
    if len({x.dtype for x in tensors}) > 1:
        raise RuntimeError("cartesian_prod expects all tensors to have the same dtype")
    if len(tensors) == 1:
        return tensors[0]
    sizes = [x.shape[0] for x in tensors]
    grids = []
    for i, x in enumerate(tensors):
        shape = [1] * len(tensors)
        shape[i] = sizes[i]
        grids.append(reshape(expand(reshape(x, tuple(shape)), tuple(sizes)), (-1,)))
    return stack(grids, 1)


def combinations(input: Tensor, r: int = 2, with_replacement: bool = False) -> Tensor:
    """The r-length combinations of a 1-d tensor's elements (itertools' order), one per row."""
    if input.ndim != 1:
        raise RuntimeError(f"Expect a 1D vector, but got shape {list(input.shape)}")
    if r < 0:
        raise RuntimeError(f"Expect a non-negative number, but got {r}")
    n = input.shape[0]
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(pick(range(n), r))
    if r == 0 or not rows:
        return input.new_empty((0,)) if r == 0 else input.new_empty((0, r))
    index = constant(np.asarray(rows, dtype=np.int64).reshape(-1), input.device)
    return reshape(index_select(input, 0, index), (len(rows), r))


def _triangle_indices(row: int, col: int, offset: int, lower: bool, dtype, device) -> Tensor:
    mask = np.tri(row, col, offset, dtype=bool) if lower else ~np.tri(row, col, offset - 1, dtype=bool)
    out = np.stack(np.nonzero(mask)).astype(dt.as_dtype(dtype or dt.int64).np)
    tensor = make_tensor(out)
    return tensor if device is None else tensor.to(device)


def tril_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None, layout=None,
                 pin_memory: bool = False) -> Tensor:  # fmt: skip
    """The (2, N) row and column indices of the lower triangle (row-major order), as PyTorch's."""
    placement("tril_indices", layout, pin_memory)
    return _triangle_indices(row, col, offset, True, dtype, device)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None, layout=None,
                 pin_memory: bool = False) -> Tensor:  # fmt: skip
    placement("triu_indices", layout, pin_memory)
    return _triangle_indices(row, col, offset, False, dtype, device)


@method("unfold")
def _unfold_dim(input: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """Every window of ``size`` elements along ``dimension``, ``step`` apart, as a new last dim.

    PyTorch returns a view; kiln gathers a copy (the values and gradients agree, writes through it do not).
    """
    if input.ndim == 0:
        if size > 1:
            raise RuntimeError(f"maximum size for tensor at dimension 0 is 1 but size is {size}")
        return reshape(input, (1,))
    dim = normalize_axis(dimension, input.ndim)
    n = input.shape[dim]
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {dim} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    count = (n - size) // step + 1
    index = np.add.outer(np.arange(count) * step, np.arange(size)).reshape(-1)
    windows = index_select(input, dim, constant(index.astype(np.int64), input.device))
    shape = list(input.shape)
    shape[dim : dim + 1] = [count, size]
    return movedim(reshape(windows, tuple(shape)), dim + 1, -1)
