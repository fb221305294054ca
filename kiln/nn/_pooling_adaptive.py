"""Adaptive pooling: average or max pooling to a fixed output size, over PyTorch's bins
[floor(i * in / out), ceil((i + 1) * in / out)) along each dim, 1-D to 3-D.

Where the output size divides the input's, the bins are equal and this is a plain pooling with
kernel = stride; otherwise one averaging matrix per dim (average) or a max per bin (max).
"""

from __future__ import annotations

import kiln

from ._pooling import max_pool1d, max_pool2d, max_pool3d
from ._pooling_avg import _avg_pool
from ._utils import batched, check_tensor

__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "adaptive_max_pool1d_with_indices",
    "adaptive_max_pool2d_with_indices",
    "adaptive_max_pool3d_with_indices",
]


def _adaptive_avg_pool(input, output_size, d: int, op: str):
    check_tensor(input, "input", op)
    x, unbatched = batched(input, d, op)
    spatial = tuple(x.shape[2:])
    sizes = (output_size,) * d if isinstance(output_size, int) else tuple(output_size)
    if len(sizes) != d:
        raise ValueError(f"{op}: output_size must be an int or {d} values, got {output_size!r}")
    sizes = tuple(s if o is None else o for s, o in zip(spatial, sizes, strict=True))
    if any(o <= 0 for o in sizes):
        raise RuntimeError(f"{op}: output_size must be positive, got {sizes}")
    if all(o == 1 for o in sizes):
        # one bin: the mean over the spatial dims, whose program holds no window the size of the input
        # (so a compiled call over images of any size has one program: ``frontend/jit/dynamic.py``)
        out = x.mean(tuple(range(2, 2 + d)), keepdim=True)
    elif all(s % o == 0 for s, o in zip(spatial, sizes, strict=True)):
        kernel = tuple(s // o for s, o in zip(spatial, sizes, strict=True))
        out = _avg_pool(x, kernel, kernel, 0, False, True, None, d, op)
    else:
        # Separable: one averaging matrix per dim, rows over PyTorch's bins
        # [floor(i * in / out), ceil((i + 1) * in / out)), applied by matmul along that dim.
        out = x
        for i, (s, o) in enumerate(zip(spatial, sizes, strict=True)):
            avg = _bin_matrix(s, o, x)
            out = kiln.matmul(out.transpose(2 + i, -1), avg.transpose(0, 1)).transpose(2 + i, -1)
    return out.squeeze(0) if unbatched else out


def _bin_matrix(size: int, out: int, like: kiln.Tensor) -> kiln.Tensor:
    """(out, size) matrix averaging input positions [floor(i * size / out), ceil((i + 1) * size / out))."""
    i = kiln.arange(out, device=like.device).reshape(out, 1)
    start, end = (i * size) // out, -((-(i + 1) * size) // out)
    j = kiln.arange(size, device=like.device).reshape(1, size)
    inside = ((j >= start) & (j < end)).to(like.dtype)
    return inside / (end - start).to(like.dtype)


def adaptive_avg_pool1d(input, output_size):
    return _adaptive_avg_pool(input, output_size, 1, "adaptive_avg_pool1d")


def adaptive_avg_pool2d(input, output_size):
    """Average pooling to a fixed output size with PyTorch's bins (ints, a pair, or None to keep a dim)."""
    return _adaptive_avg_pool(input, output_size, 2, "adaptive_avg_pool2d")


def adaptive_avg_pool3d(input, output_size):
    return _adaptive_avg_pool(input, output_size, 3, "adaptive_avg_pool3d")


_MAX_POOLS = {1: max_pool1d, 2: max_pool2d, 3: max_pool3d}


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
