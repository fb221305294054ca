"""Transposed convolutions: ``conv_transpose1d``, ``conv_transpose2d``, ``conv_transpose3d``.

A transposed convolution is the adjoint of a convolution, written two ways with kiln ops:

- strided, or from an input much smaller than its output (``_as_adjoint``): im2col's adjoint,
  each input pixel times the filter (one product) summed into place by ``fold_windows``;
- otherwise: spread the input apart by ``stride`` (zeros between pixels), pad by
  ``dilation * (kernel - 1) - padding`` (plus ``output_padding`` at the end), then a stride-1
  convolution (direct, Winograd or im2col) with the kernel flipped and its in/out channels swapped.

On plain eager CPU tensors (one group) the adjoint runs as one autograd node on the arrays
(``frontend/ops/conv_arrays.py``). As PyTorch's, the backward raises if the input or the weight
changed in place since (``_conv.py``'s module docstring): the products' copies are checked by the
adjoint itself, by the convolution of copies through ``also_saved``.
"""

from __future__ import annotations

import functools
import math

import kiln
from kiln.frontend.autocast import LOWER, autocast_op
from kiln.frontend.ops.conv_arrays import conv_transpose_eager

from ._conv import also_saved, conv1d, conv2d, conv3d, conv_checked

__all__ = ["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]

_CONVS = {1: conv1d, 2: conv2d, 3: conv3d}


def _tuple(value, d: int, name: str, op: str) -> tuple[int, ...]:
    values = (value,) * d if isinstance(value, int) else tuple(value)
    if len(values) != d:
        raise ValueError(f"{op}: expected {name} to be an int or {d} ints, got {value}")
    return values


def _spread(x, stride: tuple[int, ...]):
    """Insert ``stride - 1`` zeros between neighbouring elements of each spatial dim of (N, C, *spatial)."""
    for k, s in enumerate(stride):
        if s == 1:
            continue
        dim = 2 + k
        size = x.shape[dim]
        shape = list(x.shape)
        x = x.unsqueeze(dim + 1)
        amounts = [0, 0] * (x.ndim - dim - 2) + [0, s - 1]
        x = kiln.pad(x, amounts)
        shape[dim] = size * s
        x = kiln.narrow(x.reshape(shape), dim, 0, (size - 1) * s + 1)
    return x


def _pad_or_crop(x, before: tuple[int, ...], after: tuple[int, ...]):
    """Pad (positive amounts) or crop (negative amounts) the spatial dims of (N, C, *spatial)."""
    amounts = []
    for b, a in zip(reversed(before), reversed(after), strict=True):
        amounts += [max(b, 0), max(a, 0)]
    x = kiln.pad(x, amounts)
    for k, (b, a) in enumerate(zip(before, after, strict=True)):
        start, stop = max(-b, 0), x.shape[2 + k] - max(-a, 0)
        if start or stop != x.shape[2 + k]:
            x = kiln.narrow(x, 2 + k, start, stop - start)
    return x


def _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, d: int):
    op = f"conv_transpose{d}d"
    stride, padding = _tuple(stride, d, "stride", op), _tuple(padding, d, "padding", op)
    output_padding, dilation = _tuple(output_padding, d, "output_padding", op), _tuple(dilation, d, "dilation", op)
    if input.dim() not in (d + 1, d + 2):
        raise RuntimeError(f"{op}: expected {d + 1}D (unbatched) or {d + 2}D (batched) input, got {input.dim()}D")
    if weight.dim() != d + 2:
        raise RuntimeError(f"{op}: expected a {d + 2}D weight, got {weight.dim()}D")
    batched = input.dim() == d + 2
    x = input if batched else input.unsqueeze(0)
    c_in = x.shape[1]
    if weight.shape[0] != c_in or c_in % groups != 0:
        raise RuntimeError(f"{op}: expected input with {weight.shape[0]} channels (divisible by groups={groups}), "
                           f"got input of shape {list(input.shape)}")  # fmt: skip
    for o, s, dl in zip(output_padding, stride, dilation, strict=True):
        if o >= max(s, dl):
            raise RuntimeError(f"{op}: output padding must be smaller than either stride or dilation, got "
                               f"output_padding={output_padding}, stride={stride}, dilation={dilation}")  # fmt: skip
    kernel = tuple(weight.shape[2:])
    if _as_adjoint(x, kernel, stride, padding, output_padding, dilation):
        adjoint = functools.partial(_adjoint, stride=stride, padding=padding, output_padding=output_padding,
                                    groups=groups, dilation=dilation)  # fmt: skip
        out = None
        if groups == 1:  # one autograd node on plain eager CPU tensors (None: the ops must run)
            size = _adjoint_size(x, kernel, stride, output_padding, dilation)
            pads = tuple((p, p) for p in padding)
            out = conv_transpose_eager(x, weight, bias, size, kernel, stride, dilation, pads, adjoint)
        out = adjoint(x, weight, bias) if out is None else out
        return out if batched else out.squeeze(0)
    c_out_g = weight.shape[1]
    # (C_in, C_out/g, *k) -> (C_out, C_in/g, *k), kernel flipped.
    w = weight.reshape(groups, c_in // groups, c_out_g, *kernel).transpose(1, 2)
    w = kiln.flip(w.reshape(groups * c_out_g, c_in // groups, *kernel), tuple(range(2, 2 + d)))
    before = tuple(dl * (k - 1) - p for dl, k, p in zip(dilation, kernel, padding, strict=True))
    after = tuple(b + o for b, o in zip(before, output_padding, strict=True))
    token = also_saved.set((x, weight))  # the convolution of copies checks the originals too
    try:
        out = _CONVS[d](_pad_or_crop(_spread(x, stride), before, after), w, bias, 1, 0, dilation, groups)
    finally:
        also_saved.reset(token)
    return out if batched else out.squeeze(0)


def _as_adjoint(x, kernel, stride, padding, output_padding, dilation) -> bool:
    """Whether the transposed convolution runs as the adjoint of im2col (``_adjoint``): for strides
    above 1, whose spread input is mostly zeros (3/4 of a stride-2 2-d one: DCGAN's generator
    multiplied 4x what it needed), and for inputs much smaller than their output (a 1x1 noise
    vector to a 4x4 plane); not for ``output_padding`` of a stride or more (allowed with a larger
    dilation), which leaves trailing windows of no input."""
    spatial = tuple(x.shape[2:])
    out = tuple((i - 1) * s - 2 * p + dl * (k - 1) + o + 1
                for i, s, p, dl, k, o in zip(spatial, stride, padding, dilation, kernel, output_padding, strict=True))  # fmt: skip
    return (
        all(o < s for o, s in zip(output_padding, stride, strict=True)) and min(out, default=1) > 0
        and (any(s > 1 for s in stride) or 2 * math.prod(spatial) <= math.prod(out))
    )  # fmt: skip


def _adjoint_size(x, kernel, stride, output_padding, dilation) -> tuple[int, ...]:
    """The spatial size of the folded windows of ``_adjoint``: the output's before its crop."""
    return tuple((i - 1) * s + dl * (k - 1) + 1 + o
                 for i, s, dl, k, o in zip(x.shape[2:], stride, dilation, kernel, output_padding, strict=True))  # fmt: skip


def _adjoint(x, weight, bias, stride, padding, output_padding, groups: int, dilation):
    """The transposed convolution as what it is, the input gradient of a convolution by ``weight``:
    each input pixel times the filter, (C_out/g * prod(k), C_in/g) @ (C_in/g, N * prod(in)) per
    group, the products summed into place by ``fold_windows`` (im2col's adjoint, compiled), and
    ``padding`` cropped. Its gradients are an unfold and two products."""
    d = len(stride)
    n, c_in, spatial = x.shape[0], x.shape[1], tuple(x.shape[2:])
    kernel, c_out_g = tuple(weight.shape[2:]), weight.shape[1]
    w = weight.reshape(groups, c_in // groups, c_out_g * math.prod(kernel)).transpose(1, 2)
    pixels = x.transpose(0, 1).reshape(groups, c_in // groups, n * math.prod(spatial))
    windows = conv_checked(kiln.matmul(w, pixels), (x, weight)).reshape(groups * c_out_g, *kernel, n, *spatial)
    size = _adjoint_size(x, kernel, stride, output_padding, dilation)
    out = kiln.fold_windows(windows, size, kernel, stride, dilation, batch_inner=True)
    if any(padding):
        for k, (p, s) in enumerate(zip(padding, size, strict=True)):
            out = kiln.narrow(out, 2 + k, p, s - 2 * p)
        out = out.contiguous()  # a crop of rows: the next op (a BatchNorm's compiled program) wants it dense
    if bias is not None:
        checked = out.grad_fn is not None
        out = out + bias.reshape(bias.shape[0], *(1,) * d)
        out = out if checked else conv_checked(out, (x, weight))  # only the bias requires grad
    return out


@autocast_op(LOWER)
def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> kiln.Tensor:  # fmt: skip
    """Transposed convolution of (N, C_in, L) or (C_in, L) with weight (C_in, C_out / groups, k)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 1)


@autocast_op(LOWER)
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> kiln.Tensor:  # fmt: skip
    """Transposed convolution of (N, C_in, H, W) or (C_in, H, W) with weight (C_in, C_out / groups, kH, kW)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 2)


@autocast_op(LOWER)
def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> kiln.Tensor:  # fmt: skip
    """Transposed convolution of (N, C_in, D, H, W) or (C_in, D, H, W) with weight (C_in, C_out / groups, *k)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 3)
