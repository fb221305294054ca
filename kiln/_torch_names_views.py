"""``torch.*`` names over kiln's view and split ops: the ``*_copy`` variants (``view_copy``,
``permute_copy``... the view's values in new memory), ``split_with_sizes``, ``unsafe_split`` and
``unsafe_chunk`` (PyTorch's versions without the views' bookkeeping: the same values here),
``diagonal_scatter`` and ``cumulative_trapezoid``.

Every one is a composition of kiln's differentiable ops, so each carries gradients and compiles.
This module sits on the public side, over the frontend.
"""

from __future__ import annotations

from .frontend import ops
from .frontend.tensor import Tensor, method
from .ir import dtypes as dt

__all__ = [
    "view_copy", "permute_copy", "transpose_copy", "expand_copy", "slice_copy", "select_copy", "squeeze_copy",
    "unsqueeze_copy", "diagonal_copy", "t_copy", "unbind_copy", "split_copy", "split_with_sizes_copy", "alias_copy",
    "detach_copy", "as_strided_copy", "unfold_copy", "split_with_sizes", "unsafe_split", "unsafe_chunk",
    "unsafe_split_with_sizes", "diagonal_scatter", "cumulative_trapezoid",
]  # fmt: skip


def view_copy(input: Tensor, size) -> Tensor:
    return input.view(size).clone()


def permute_copy(input: Tensor, dims) -> Tensor:
    return input.permute(*dims).clone()


def transpose_copy(input: Tensor, dim0: int, dim1: int) -> Tensor:
    return ops.transpose(input, dim0, dim1).clone()


def expand_copy(input: Tensor, size, *, implicit: bool = False) -> Tensor:
    return input.expand(*size).clone()


def slice_copy(input: Tensor, dim: int = 0, start=None, end=None, step: int = 1) -> Tensor:
    """``input[..., start:end:step, ...]`` along ``dim``, as new memory."""
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    dim = dim % input.ndim if input.ndim else dim
    index = (slice(None),) * dim + (slice(start, end, step),)
    return input[index].clone()


def select_copy(input: Tensor, dim: int, index: int) -> Tensor:
    return ops.select(input, dim, index).clone()


def squeeze_copy(input: Tensor, dim=None) -> Tensor:
    return (ops.squeeze(input) if dim is None else ops.squeeze(input, dim)).clone()


def unsqueeze_copy(input: Tensor, dim: int) -> Tensor:
    return ops.unsqueeze(input, dim).clone()


def diagonal_copy(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    return ops.diagonal(input, offset, dim1, dim2).clone()


def t_copy(input: Tensor) -> Tensor:
    return input.t().clone()


def unbind_copy(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    return tuple(t.clone() for t in ops.unbind(input, dim))


def split_copy(input: Tensor, split_size: int, dim: int = 0) -> tuple[Tensor, ...]:
    return tuple(t.clone() for t in ops.split(input, split_size, dim))


def split_with_sizes_copy(input: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    return tuple(t.clone() for t in split_with_sizes(input, split_sizes, dim))


def alias_copy(input: Tensor) -> Tensor:
    return input.clone()


def detach_copy(input: Tensor) -> Tensor:
    return input.detach().clone()


def as_strided_copy(input: Tensor, size, stride, storage_offset=None) -> Tensor:
    return input.as_strided(size, stride, storage_offset).clone()


def unfold_copy(input: Tensor, dimension: int, size: int, step: int) -> Tensor:
    return input.unfold(dimension, size, step).clone()


def split_with_sizes(input: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces of the given sizes along ``dim``; the sizes must add up to the dim's size exactly."""
    sizes = [int(s) for s in split_sizes]
    length = input.shape[dim]
    if sum(sizes) != length or any(s < 0 for s in sizes):
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {length} (input tensor's size at "
                           f"dimension {dim}), but got split_sizes={sizes}")  # fmt: skip
    return tuple(ops.split(input, sizes, dim))


def unsafe_split(input: Tensor, split_size: int, dim: int = 0) -> tuple[Tensor, ...]:
    return tuple(ops.split(input, split_size, dim))


def unsafe_split_with_sizes(input: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    return split_with_sizes(input, split_sizes, dim)


def unsafe_chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    return tuple(ops.chunk(input, chunks, dim))


@method("diagonal_scatter")
def diagonal_scatter(input: Tensor, src: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """``input`` with its diagonal (``offset``, ``dim1``, ``dim2``, as ``diagonal``'s) replaced by ``src``,
    as new memory; the gradient flows to both.

    >>> import kiln
    >>> kiln.diagonal_scatter(kiln.zeros(2, 3), kiln.ones(2), 1)
    tensor([[0., 1., 0.],
            [0., 0., 1.]])
    """
    target_shape = tuple(ops.diagonal(input, offset, dim1, dim2).shape)
    if tuple(src.shape) != target_shape:
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = {list(src.shape)}, "
                           f"slice size = {list(target_shape)}")  # fmt: skip
    # A scatter into the two dims flattened, not a write through ``diagonal``'s view: that view is
    # a copy where dim1 and dim2 are not adjacent (kiln's diagonal), and a scatter compiles anyway.
    moved = ops.movedim(input, (dim1, dim2), (-2, -1))
    rows, cols = moved.shape[-2:]
    length = target_shape[-1]
    first = max(-offset, 0) * cols + max(offset, 0)
    flat_index = ops.arange(length) * (cols + 1) + first
    flat = ops.reshape(moved, (*moved.shape[:-2], rows * cols))
    index = ops.expand(flat_index, tuple(src.shape))
    out = ops.scatter(flat, -1, index, src.to(input.dtype))
    return ops.movedim(ops.reshape(out, tuple(moved.shape)), (-2, -1), (dim1, dim2))


def cumulative_trapezoid(y: Tensor, x: Tensor | None = None, *, dx=None, dim: int = -1) -> Tensor:
    """The running trapezoid rule along ``dim`` (one fewer element there): spacing ``dx`` (default 1)
    or sample points ``x`` (1-D, or shaped as ``y``)."""
    if x is not None and dx is not None:
        raise TypeError("cumulative_trapezoid() received an invalid combination of arguments: x and dx")
    if y.dtype is dt.bool_:
        raise RuntimeError("cumulative_trapezoid: received a bool input for `y`, but bool is not supported")
    dim = dim % y.ndim if y.ndim else dim
    n = y.shape[dim]
    if n == 0:
        return ops.mul(y, 1.0)
    y = y if y.dtype.is_floating_point else y.to(dt.get_default_dtype())
    halves = ops.add(ops.narrow(y, dim, 1, n - 1), ops.narrow(y, dim, 0, n - 1)) / 2
    if isinstance(x, Tensor):
        if x.ndim == 1:
            if x.shape[0] != n:
                raise RuntimeError("cumulative_trapezoid: There must be one `x` value for each sample point")
            shape = [1] * y.ndim
            shape[dim] = n
            x = ops.reshape(x, tuple(shape))
            xdim = dim
        else:
            xdim = (dim - y.ndim) % x.ndim
        m = x.shape[xdim]
        return ops.cumsum(halves * (ops.narrow(x, xdim, 1, m - 1) - ops.narrow(x, xdim, 0, m - 1)), dim)
    return ops.cumsum(halves * (1 if dx is None else dx), dim)
