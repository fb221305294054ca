"""Transposed 2-D convolution: ``conv_transpose2d`` and the ``ConvTranspose2d`` layer.

The math is the adjoint of conv2d written with kiln ops: spread the input apart by ``stride``
(zeros between pixels), pad by ``dilation * (kernel - 1) - padding`` (plus ``output_padding``
at the end), then a stride-1 conv2d with the kernel flipped and its in/out channels swapped.
"""

from __future__ import annotations

import kiln

from .. import functional as F
from .linear import add_weight_and_bias, reset_weight_and_bias
from .module import Module

__all__ = ["ConvTranspose1d", "ConvTranspose2d", "conv_transpose1d", "conv_transpose2d"]


def _pair(value, name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2:
        raise ValueError(f"conv_transpose2d: expected {name} to be an int or a pair, got {value}")
    return pair


def _spread(x, stride: tuple[int, int]):
    """Insert ``stride - 1`` zeros between neighbouring pixels of (N, C, H, W)."""
    if stride == (1, 1):
        return x
    n, c, h, w = x.shape
    sh, sw = stride
    x = F.pad(x.reshape(n, c, h, 1, w, 1), (0, sw - 1, 0, 0, 0, sh - 1))
    return x.reshape(n, c, h * sh, w * sw)[:, :, : (h - 1) * sh + 1, : (w - 1) * sw + 1]


def _pad_or_crop(x, before: tuple[int, int], after: tuple[int, int]):
    """Pad (positive amounts) or crop (negative amounts) the two spatial dims of (N, C, H, W)."""
    x = F.pad(x, (max(before[1], 0), max(after[1], 0), max(before[0], 0), max(after[0], 0)))
    h, w = x.shape[2], x.shape[3]
    top, left = max(-before[0], 0), max(-before[1], 0)
    return x[:, :, top : h - max(-after[0], 0), left : w - max(-after[1], 0)]


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> kiln.Tensor:  # fmt: skip
    """Transposed convolution of (N, C_in, H, W) or (C_in, H, W) with weight (C_in, C_out / groups, kH, kW)."""
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    output_padding, dilation = _pair(output_padding, "output_padding"), _pair(dilation, "dilation")
    if input.dim() not in (3, 4):
        raise RuntimeError(f"conv_transpose2d: expected 3D (unbatched) or 4D (batched) input, got {input.dim()}D")
    if weight.dim() != 4:
        raise RuntimeError(f"conv_transpose2d: expected a 4D weight, got {weight.dim()}D")
    batched = input.dim() == 4
    x = input if batched else input.unsqueeze(0)
    c_in = x.shape[1]
    if weight.shape[0] != c_in or c_in % groups != 0:
        raise RuntimeError(f"conv_transpose2d: expected input with {weight.shape[0]} channels (divisible by groups="
                           f"{groups}), got input of shape {list(input.shape)}")  # fmt: skip
    for op, s, d in zip(output_padding, stride, dilation, strict=True):
        if op >= max(s, d):
            raise RuntimeError(f"conv_transpose2d: output padding must be smaller than either stride or dilation, "
                               f"got output_padding={output_padding}, stride={stride}, dilation={dilation}")  # fmt: skip
    kh, kw = weight.shape[2], weight.shape[3]
    c_out_g = weight.shape[1]
    # (C_in, C_out/g, kh, kw) -> (C_out, C_in/g, kh, kw), kernel flipped.
    w = weight.reshape(groups, c_in // groups, c_out_g, kh, kw).transpose(1, 2)
    w = kiln.flip(w.reshape(groups * c_out_g, c_in // groups, kh, kw), (2, 3))
    reach = (dilation[0] * (kh - 1), dilation[1] * (kw - 1))
    before = (reach[0] - padding[0], reach[1] - padding[1])
    after = (before[0] + output_padding[0], before[1] + output_padding[1])
    x = _pad_or_crop(_spread(x, stride), before, after)
    out = F.conv2d(x, w, bias, 1, 0, dilation, groups)
    return out if batched else out.squeeze(0)


class ConvTranspose2d(Module):
    """Transposed 2-D convolution: ``weight`` (C_in, C_out / groups, kH, kW), ``bias`` (C_out)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__()
        if in_channels % groups != 0:
            raise ValueError(f"in_channels ({in_channels}) must be divisible by groups ({groups})")
        if out_channels % groups != 0:
            raise ValueError(f"out_channels ({out_channels}) must be divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for ConvTranspose2d, got {padding_mode!r}')
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride = _pair(kernel_size, "kernel_size"), _pair(stride, "stride")
        self.padding, self.output_padding = _pair(padding, "padding"), _pair(output_padding, "output_padding")
        self.dilation, self.padding_mode = _pair(dilation, "dilation"), padding_mode
        shape = (in_channels, out_channels // groups, *self.kernel_size)
        add_weight_and_bias(self, shape, out_channels, bias, device, dtype)

    def reset_parameters(self) -> None:
        reset_weight_and_bias(self.weight, self.bias)

    def forward(self, input):
        return conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                self.groups, self.dilation)  # fmt: skip

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if any(self.padding):
            s += f", padding={self.padding}"
        if any(d != 1 for d in self.dilation):
            s += f", dilation={self.dilation}"
        if any(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


def _single(value, name: str) -> int:
    single = value if isinstance(value, int) else tuple(value)
    if isinstance(single, tuple):
        if len(single) != 1:
            raise ValueError(f"conv_transpose1d: expected {name} to be an int or a 1-tuple, got {value}")
        single = single[0]
    return single


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> kiln.Tensor:  # fmt: skip
    """Transposed convolution of (N, C_in, L) or (C_in, L) with weight (C_in, C_out / groups, k):
    the 2-d one over a height of 1."""
    if input.dim() not in (2, 3):
        raise RuntimeError(f"conv_transpose1d: expected 2D (unbatched) or 3D (batched) input, got {input.dim()}D")
    if weight.dim() != 3:
        raise RuntimeError(f"conv_transpose1d: expected a 3D weight, got {weight.dim()}D")
    # The unit height: stride and dilation 1, no padding.
    out = conv_transpose2d(input.unsqueeze(-2), weight.unsqueeze(-2), bias, (1, _single(stride, "stride")),
                           (0, _single(padding, "padding")), (0, _single(output_padding, "output_padding")), groups,
                           (1, _single(dilation, "dilation")))  # fmt: skip
    return out.squeeze(-2)


class ConvTranspose1d(Module):
    """Transposed 1-D convolution: ``weight`` (C_in, C_out / groups, k), ``bias`` (C_out)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__()
        if in_channels % groups != 0:
            raise ValueError(f"in_channels ({in_channels}) must be divisible by groups ({groups})")
        if out_channels % groups != 0:
            raise ValueError(f"out_channels ({out_channels}) must be divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for ConvTranspose1d, got {padding_mode!r}')
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride = (_single(kernel_size, "kernel_size"),), (_single(stride, "stride"),)
        self.padding, self.output_padding = (_single(padding, "padding"),), (_single(output_padding, "output_padding"),)
        self.dilation, self.padding_mode = (_single(dilation, "dilation"),), padding_mode
        shape = (in_channels, out_channels // groups, *self.kernel_size)
        add_weight_and_bias(self, shape, out_channels, bias, device, dtype)

    def reset_parameters(self) -> None:
        reset_weight_and_bias(self.weight, self.bias)

    def forward(self, input):
        return conv_transpose1d(input, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                self.groups, self.dilation)  # fmt: skip

    extra_repr = ConvTranspose2d.extra_repr
