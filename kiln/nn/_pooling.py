# mypy: ignore-errors
# reason: mypy misreads x[(a, *b)] as 3.11-only star syntax (a blocking error no narrower header silences)
"""Pooling over sliding windows: max, average and adaptive average pooling, 1-D to 3-D.

Each pools ``kiln.unfold_windows`` of the padded input over its kernel dims (max pooling with
windows that tile the input views them instead). Max pooling takes each window's maximum and the
position of its first maximum (the first NaN, where there is one), and its gradient goes to that
one position, as in PyTorch (amax's own gradient would split it between ties, e.g. the zeros
after relu). Both are elementwise chains over the window's offsets and the gradient is one
``where``: they fuse into compiled kernels, where argmax + gather + scatter-add ran on numpy.
"""

from __future__ import annotations

import itertools
import math

import kiln

from ._utils import batched, check_tensor, ntuple, pad_spec

__all__ = [
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
]  # fmt: skip


def _pool_geometry(spatial, kernel, stride, padding, dilation, ceil_mode: bool, op: str):
    """Output sizes and the extra right padding that ceil_mode needs, per spatial dim."""
    if any(p > (dl * (k - 1) + 1) // 2 for k, p, dl in zip(kernel, padding, dilation, strict=True)):
        raise RuntimeError(
            f"{op}: pad should be at most half of effective kernel size, but got pad={padding}, "
            f"kernel_size={kernel} and dilation={dilation}"
        )
    out, extra = [], []
    for size, k, s, p, dl in zip(spatial, kernel, stride, padding, dilation, strict=True):
        span = size + 2 * p - dl * (k - 1) - 1
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= size + p:
            o -= 1  # the last window must start inside the input or its left padding
        if o < 1:
            raise RuntimeError(
                f"{op}: given input size {tuple(spatial)}, kernel_size {kernel}, padding {padding} and "
                f"dilation {dilation}, the output size would be {o}: too small"
            )
        out.append(o)
        extra.append(max(0, (o - 1) * s + dl * (k - 1) + 1 - (size + 2 * p)))
    return tuple(out), tuple(extra)


def _pool_args(input, kernel_size, stride, padding, dilation, d: int, op: str):
    check_tensor(input, "input", op)
    kernel = ntuple(kernel_size, d, "kernel_size", op)
    stride = kernel if stride is None or stride == () or stride == [] else ntuple(stride, d, "stride", op)
    padding = ntuple(padding, d, "padding", op)
    dilation = ntuple(dilation, d, "dilation", op)
    if any(v <= 0 for v in kernel + stride + dilation):
        raise ValueError(f"{op}: kernel_size, stride and dilation must be positive, got {kernel}, {stride}, {dilation}")
    return kernel, stride, padding, dilation


def _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, d: int, op: str):
    kernel, stride, padding, dilation = _pool_args(input, kernel_size, stride, padding, dilation, d, op)
    x, unbatched = batched(input, d, op)
    spatial = tuple(x.shape[2:])
    out_size, extra = _pool_geometry(spatial, kernel, stride, padding, dilation, ceil_mode, op)
    pads = tuple((p, p + e) for p, e in zip(padding, extra, strict=True))
    if any(p for pair in pads for p in pair):
        if not x.dtype.is_floating_point:
            raise NotImplementedError(f"{op}: padding or ceil_mode needs a floating-point input, got {x.dtype}")
        x = kiln.pad(x, pad_spec(pads), value=-math.inf)
    out, index = _MaxOfWindows.apply(*_windows(x, kernel, stride, dilation, out_size))
    if not return_indices:
        return out.squeeze(0) if unbatched else out
    flat = _flat_input_index(index, spatial, kernel, stride, padding, dilation, out_size)
    return (out.squeeze(0), flat.squeeze(0)) if unbatched else (out, flat)


def _windows(x, kernel, stride, dilation, out_size):
    """(windows, kernel_axes): the windows of ``x`` (N, C, *S) as one tensor with the kernel
    offsets along ``kernel_axes``. Windows that tile the input (stride equal to the kernel, no
    dilation) are a view of it, (N, C, O1, K1, O2, K2, ...); others are unfolded, (N, C, *K, *O)."""
    d = len(kernel)
    n, c = x.shape[0], x.shape[1]
    if stride == kernel and all(v == 1 for v in dilation):
        x = x[(slice(None), slice(None), *(slice(0, o * k) for o, k in zip(out_size, kernel, strict=True)))]
        split = [n, c] + [size for pair in zip(out_size, kernel, strict=True) for size in pair]
        return x.reshape(split), tuple(range(3, 3 + 2 * d, 2))
    return kiln.unfold_windows(x, kernel, stride, dilation), tuple(range(2, 2 + d))


class _MaxOfWindows(kiln.autograd.Function):
    """(max, position of the first max) of each window of ``windows`` (offsets along ``kernel_axes``):
    the position is a flat index into the kernel, row-major; the gradient goes to that element.

    One elementwise chain over the window's offsets, first to last (a running maximum, and the
    first offset that equals it or is NaN): a fused kernel, where a reduction over the kernel
    axes (not trailing) would run on numpy."""

    @staticmethod
    def forward(ctx, windows, kernel_axes):
        kernel = [windows.shape[a] for a in kernel_axes]
        offsets = [_offset(windows, kernel_axes, k) for k in itertools.product(*map(range, kernel))]
        # One offset (kernel 1): the windows are a view of the input; the result is new memory,
        # as PyTorch's, so a later in-place change of the input leaves it alone.
        top = offsets[0] if len(offsets) > 1 else offsets[0].clone()
        for w in offsets[1:]:
            top = kiln.maximum(top, w)
        index = kiln.full_like(top, len(offsets), dtype=kiln.int32)  # 4 bytes: saved for the backward
        for k in reversed(range(len(offsets))):
            w = offsets[k]
            hit = (w == top) | kiln.isnan(w) if w.dtype.is_floating_point else w == top
            index = kiln.where(hit, k, index)
        ctx.save_for_backward(index)
        ctx.mark_non_differentiable(index)
        ctx.geometry = (tuple(windows.shape), kernel_axes)
        return top, index

    @staticmethod
    def backward(ctx, g, _):
        (index,) = ctx.saved_tensors
        shape, kernel_axes = ctx.geometry
        kernel = [shape[a] for a in kernel_axes]
        at = [1] * len(shape)  # the kernel's flat offsets along its axes, 1 along the others
        for a, k in zip(kernel_axes, kernel, strict=True):
            at[a] = k
        position = kiln.arange(math.prod(kernel), dtype=kiln.int32, device=g.device).reshape(at)
        keep = [1 if a in kernel_axes else size for a, size in enumerate(shape)]  # the windows' dims
        zero = kiln.zeros((), dtype=g.dtype, device=g.device)
        return kiln.where(position == index.reshape(keep), g.reshape(keep), zero), None


def _offset(windows, kernel_axes, k):
    """The windows' elements at kernel offset ``k`` (one index per kernel axis), (N, C, *O)."""
    key = [slice(None)] * windows.ndim
    for a, i in zip(kernel_axes, k, strict=True):
        key[a] = i
    return windows[tuple(key)]


def _flat_input_index(offset, spatial, kernel, stride, padding, dilation, out_size):
    """The window-local argmax (N, C, *O) as an index into the flattened unpadded input (int64)."""
    offset = offset.long()
    flat = None
    d = len(kernel)
    for i in range(d):
        inner = math.prod(kernel[i + 1 :])
        k_i = (offset // inner) % kernel[i]  # this dim's kernel offset
        shape = [1] * (2 + d)
        shape[2 + i] = out_size[i]
        start = (kiln.arange(out_size[i], device=offset.device) * stride[i] - padding[i]).reshape(shape)
        pos = start + k_i * dilation[i]
        flat = pos if flat is None else flat * spatial[i] + pos
    return flat


@kiln.jit.composite("max_pool1d")
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of (N, C, L); ``stride`` defaults to ``kernel_size``; padding is -inf."""
    return _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 1, "max_pool1d")


@kiln.jit.composite("max_pool2d")
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of (N, C, H, W), as ``torch.nn.functional.max_pool2d``.

    With ``return_indices`` also the flat index (into H * W) of each maximum.

    >>> import kiln
    >>> max_pool2d(kiln.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
    [[[[5.0, 7.0], [13.0, 15.0]]]]
    """
    return _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 2, "max_pool2d")


@kiln.jit.composite("max_pool3d")
def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 3, "max_pool3d")


def _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, d: int, op: str):
    kernel, stride, padding, dilation = _pool_args(input, kernel_size, stride, padding, 1, d, op)
    x, unbatched = batched(input, d, op)
    spatial = tuple(x.shape[2:])
    out_size, extra = _pool_geometry(spatial, kernel, stride, padding, dilation, ceil_mode, op)
    pads = tuple((p, p + e) for p, e in zip(padding, extra, strict=True))
    if any(p for pair in pads for p in pair):
        x = kiln.pad(x, pad_spec(pads))
    total = kiln.unfold_windows(x, kernel, stride, dilation).sum(dim=tuple(range(2, 2 + d)))
    if divisor_override is not None:
        if divisor_override == 0:
            raise RuntimeError(f"{op}: divisor must be not zero")
        out = total / divisor_override
    elif (count_include_pad or not any(padding)) and not any(extra):
        out = total / math.prod(kernel)
    else:
        out = total / _window_counts(x, spatial, padding, extra, kernel, stride, count_include_pad)
    return out.squeeze(0) if unbatched else out


def _window_counts(x, spatial, padding, extra, kernel, stride, count_include_pad: bool):
    """How many elements each window averages: PyTorch counts the symmetric padding when asked,
    never the extra right padding of ceil_mode."""
    d = len(spatial)
    if count_include_pad:
        region, pads = tuple(s + 2 * p for s, p in zip(spatial, padding, strict=True)), tuple((0, e) for e in extra)
    else:
        region, pads = spatial, tuple((p, p + e) for p, e in zip(padding, extra, strict=True))
    ones = kiln.pad(kiln.ones(1, 1, *region, dtype=x.dtype, device=x.device), pad_spec(pads))
    return kiln.unfold_windows(ones, kernel, stride, (1,) * d).sum(dim=tuple(range(2, 2 + d)))


@kiln.jit.composite("avg_pool1d")
def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1, "avg_pool1d")


@kiln.jit.composite("avg_pool2d")
def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):  # fmt: skip
    """Mean over windows of (N, C, H, W), as ``torch.nn.functional.avg_pool2d``."""
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2,
                     "avg_pool2d")  # fmt: skip


@kiln.jit.composite("avg_pool3d")
def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):  # fmt: skip
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3,
                     "avg_pool3d")  # fmt: skip


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
    if all(s % o == 0 for s, o in zip(spatial, sizes, strict=True)):
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
