"""Transposed convolution layers: ``ConvTranspose1d``, ``ConvTranspose2d``, ``ConvTranspose3d``
(the math is in ``kiln/nn/_conv_transpose.py``)."""

from __future__ import annotations

from .._conv_transpose import _conv_transpose, _tuple, conv_transpose1d, conv_transpose2d, conv_transpose3d
from .linear import add_weight_and_bias, reset_weight_and_bias
from .module import Module

__all__ = ["ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d"]  # fmt: skip


class _ConvTransposeNd(Module):
    _d = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__()
        d, name = self._d, type(self).__name__
        if in_channels % groups != 0:
            raise ValueError(f"in_channels ({in_channels}) must be divisible by groups ({groups})")
        if out_channels % groups != 0:
            raise ValueError(f"out_channels ({out_channels}) must be divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {name}, got {padding_mode!r}')
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride = _tuple(kernel_size, d, "kernel_size", name), _tuple(stride, d, "stride", name)
        self.padding = _tuple(padding, d, "padding", name)
        self.output_padding = _tuple(output_padding, d, "output_padding", name)
        self.dilation, self.padding_mode = _tuple(dilation, d, "dilation", name), padding_mode
        shape = (in_channels, out_channels // groups, *self.kernel_size)
        add_weight_and_bias(self, shape, out_channels, bias, device, dtype)

    def reset_parameters(self) -> None:
        reset_weight_and_bias(self.weight, self.bias)

    def forward(self, input):
        return _conv_transpose(input, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                               self.groups, self.dilation, self._d)  # fmt: skip

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


class ConvTranspose1d(_ConvTransposeNd):
    """Transposed 1-D convolution: ``weight`` (C_in, C_out / groups, k), ``bias`` (C_out)."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    _d = 1


class ConvTranspose2d(_ConvTransposeNd):
    """Transposed 2-D convolution: ``weight`` (C_in, C_out / groups, kH, kW), ``bias`` (C_out)."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    _d = 2


class ConvTranspose3d(_ConvTransposeNd):
    """Transposed 3-D convolution: ``weight`` (C_in, C_out / groups, kD, kH, kW), ``bias`` (C_out)."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    _d = 3
