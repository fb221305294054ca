"""Adaptive max pooling, power-average (LP) pooling, max unpooling, ``pdist``, and the ``*_with_indices``
spellings of max pooling."""

from __future__ import annotations

import math

import kiln

from ._pooling import avg_pool1d, avg_pool2d, avg_pool3d, max_pool1d, max_pool2d, max_pool3d
from ._utils import check_tensor

__all__ = ["adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_max_pool1d_with_indices",
           "adaptive_max_pool2d_with_indices", "adaptive_max_pool3d_with_indices", "lp_pool1d", "lp_pool2d",
           "lp_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices", "max_unpool1d",
           "max_unpool2d", "max_unpool3d", "pdist"]  # fmt: skip

_MAX_POOLS = {1: max_pool1d, 2: max_pool2d, 3: max_pool3d}
_AVG_POOLS = {1: avg_pool1d, 2: avg_pool2d, 3: avg_pool3d}


def _adaptive_max_pool(input, output_size, return_indices: bool, d: int):
    op = f"adaptive_max_pool{d}d"
    check_tensor(input, "input", op)
    if input.ndim not in (d + 1, d + 2):
        raise ValueError(f"{op}: expected {d + 1}D or {d + 2}D input, got {input.ndim}D")
    spatial = tuple(input.shape[-d:])
    sizes = (output_size,) * d if isinstance(output_size, int) else tuple(output_size)
    if len(sizes) != d:
        raise ValueError(f"{op}: output_size must be an int or {d} values, got {output_size!r}")
    sizes = tuple(s if o is None else o for s, o in zip(spatial, sizes, strict=True))
    if all(s % o == 0 for s, o in zip(spatial, sizes, strict=True)):
        # Equal bins: a max pool with kernel = stride (its indices are PyTorch's too).
        kernel = tuple(s // o for s, o in zip(spatial, sizes, strict=True))
        return _MAX_POOLS[d](input, kernel, kernel, return_indices=return_indices)
    if return_indices:
        raise NotImplementedError(f"{op}: return_indices=True needs output sizes that divide the input's "
                                  f"{spatial}, got {sizes}")  # fmt: skip
    # A max over a box is the max over each dim in turn; PyTorch's bins are
    # [floor(i * in / out), ceil((i + 1) * in / out)) along each dim.
    out = input
    for k, (size, n) in enumerate(zip(spatial, sizes, strict=True)):
        dim = input.ndim - d + k
        bins = []
        for i in range(n):
            start, end = (i * size) // n, -((-(i + 1) * size) // n)
            bins.append(kiln.amax(kiln.narrow(out, dim, start, end - start), dim=dim, keepdim=True))
        out = kiln.cat(bins, dim=dim)
    return out


def adaptive_max_pool1d(input, output_size, return_indices: bool = False):
    return _adaptive_max_pool(input, output_size, return_indices, 1)


def adaptive_max_pool2d(input, output_size, return_indices: bool = False):
    """Max pooling to a fixed output size with PyTorch's bins."""
    return _adaptive_max_pool(input, output_size, return_indices, 2)


def adaptive_max_pool3d(input, output_size, return_indices: bool = False):
    return _adaptive_max_pool(input, output_size, return_indices, 3)


def adaptive_max_pool1d_with_indices(input, output_size, return_indices: bool = False):
    return _adaptive_max_pool(input, output_size, True, 1)


def adaptive_max_pool2d_with_indices(input, output_size, return_indices: bool = False):
    return _adaptive_max_pool(input, output_size, True, 2)


def adaptive_max_pool3d_with_indices(input, output_size, return_indices: bool = False):
    return _adaptive_max_pool(input, output_size, True, 3)


def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):  # fmt: skip
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):  # fmt: skip
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool3d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):  # fmt: skip
    return max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def _lp_pool(input, norm_type: float, kernel_size, stride, ceil_mode: bool, d: int):
    kernel = (kernel_size,) * d if isinstance(kernel_size, int) else tuple(kernel_size)
    out = _AVG_POOLS[d](input.pow(norm_type), kernel, stride, 0, ceil_mode)
    # PyTorch keeps the sign and clamps the magnitude (an odd power of negatives averages below zero).
    return (kiln.sign(out) * kiln.relu(kiln.abs(out))).mul(math.prod(kernel)).pow(1.0 / norm_type)


def lp_pool1d(input, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False):
    """(sum over each window of x^p)^(1/p)."""
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 1)


def lp_pool2d(input, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False):
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 2)


def lp_pool3d(input, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False):
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 3)


def _max_unpool(input, indices, kernel_size, stride, padding, output_size, d: int):
    """Place each value at its ``indices`` (flat positions in each output plane, as max pooling returns them)."""
    op = f"max_unpool{d}d"
    kernel = (kernel_size,) * d if isinstance(kernel_size, int) else tuple(kernel_size)
    stride = kernel if stride is None else ((stride,) * d if isinstance(stride, int) else tuple(stride))
    padding = (padding,) * d if isinstance(padding, int) else tuple(padding)
    if input.ndim not in (d + 1, d + 2):
        raise ValueError(f"{op}: expected {d + 1}D or {d + 2}D input, got {input.ndim}D")
    if tuple(indices.shape) != tuple(input.shape):
        raise ValueError(f"{op}: expected indices of the input's shape {list(input.shape)}, got {list(indices.shape)}")
    spatial = tuple(input.shape[-d:])
    if output_size is None:
        sizes = tuple((n - 1) * s - 2 * p + k for n, s, p, k in zip(spatial, stride, padding, kernel, strict=True))
    else:
        sizes = tuple(output_size)[-d:]
    batched = input.ndim == d + 2
    x, idx = (input, indices) if batched else (input.unsqueeze(0), indices.unsqueeze(0))
    n, c = x.shape[0], x.shape[1]
    plane = math.prod(sizes)
    flat_index = idx.reshape(n, c, -1).to(kiln.int64)
    kiln.jit.check_range(flat_index, 0, plane, RuntimeError,
                         f"{op}: found an invalid max index {{value}} (output volumes are of size {plane})")  # fmt: skip
    out = kiln.zeros(n, c, plane, dtype=x.dtype, device=x.device).scatter(2, flat_index, x.reshape(n, c, -1))
    out = out.reshape(n, c, *sizes)
    return out if batched else out.squeeze(0)


def max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    """The partial inverse of ``max_pool1d``: maxima back at their positions, zeros elsewhere."""
    return _max_unpool(input, indices, kernel_size, stride, padding, output_size, 1)


def max_unpool2d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool(input, indices, kernel_size, stride, padding, output_size, 2)


def max_unpool3d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool(input, indices, kernel_size, stride, padding, output_size, 3)


def pdist(input, p: float = 2) -> kiln.Tensor:
    """p-norm distances between the rows of an (N, M) input, for each pair i < j in row-major order."""
    if input.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {input.ndim}D")
    n = input.shape[0]
    first = [i for i in range(n) for _ in range(i + 1, n)]
    second = [j for i in range(n) for j in range(i + 1, n)]
    if not first:
        return kiln.zeros(0, dtype=input.dtype, device=input.device)
    a = kiln.index_select(input, 0, kiln.tensor(first, dtype=kiln.int64, device=input.device))
    b = kiln.index_select(input, 0, kiln.tensor(second, dtype=kiln.int64, device=input.device))
    return kiln.norm(a - b, p, dim=1)
