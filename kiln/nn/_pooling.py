# mypy: ignore-errors
# reason: mypy misreads x[(a, *b)] as 3.11-only star syntax (a blocking error no narrower header silences)
"""Max pooling over sliding windows, 1-D to 3-D, its ``*_with_indices`` spellings and its partial
inverse (max unpooling); and the window geometry that every pooling over windows shares.

Each pools ``kiln.unfold_windows`` of the padded input over its kernel dims (windows that tile the
input view it instead). Max pooling takes each window's maximum and the position of its first
maximum (the first NaN, where there is one), and its gradient goes to that one position, as in
PyTorch (amax's own gradient would split it between ties, e.g. the zeros after relu). It is an
elementwise chain over the window's offsets and the gradient is one ``where``: they fuse into
compiled kernels, where argmax + gather + scatter-add ran on numpy. Where the composite runs on
numpy (eager, not compiled), plain float tensors take ``_pooling_arrays``' one node instead.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

import kiln
from kiln.frontend.eager_composites import compiled_composite

from ._pooling_arrays import max_pool_on_arrays
from ._utils import batched, check_tensor, ntuple, pad_spec

__all__ = [
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "max_pool1d_with_indices",
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
    "max_unpool1d",
    "max_unpool2d",
    "max_unpool3d",
]


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
    on_arrays = max_pool_on_arrays(x, kernel, stride, dilation, pads, out_size)  # (None: the ops run)
    if on_arrays is not None:
        out, first = on_arrays
        index = kiln.from_numpy(first.astype(np.int32)) if return_indices else None
    else:
        x = x.contiguous()  # C-order results, as PyTorch's (and the arrays path's)
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

    kiln_only = True  # calls no user code: a traced call runs it unwatched (``jit.hazards``)

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


@compiled_composite("max_pool2d")
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


def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):  # fmt: skip
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):  # fmt: skip
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool3d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):  # fmt: skip
    return max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


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
