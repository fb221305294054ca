"""Convolution layers ``Conv1d`` and ``Conv2d`` over ``kiln.nn.functional``."""

from __future__ import annotations

from .. import functional as F
from .linear import add_weight_and_bias, reset_weight_and_bias
from .module import Module

__all__ = ["Conv1d", "Conv2d", "Conv3d"]


def _ntuple(value, d: int) -> tuple:
    return tuple(value) if isinstance(value, tuple | list) else (value,) * d


_PAD_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "replicate", "circular": "circular"}


class _ConvNd(Module):
    _d = 0

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None) -> None:  # fmt: skip
        super().__init__()
        d = self._d
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode not in _PAD_MODES:
            raise ValueError(f"padding_mode must be one of {list(_PAD_MODES)}, but got padding_mode='{padding_mode}'")
        if padding_mode != "zeros" and isinstance(padding, str):
            raise NotImplementedError(f"padding={padding!r} with padding_mode={padding_mode!r} is not supported")
        if isinstance(padding, str) and padding not in ("same", "valid"):
            raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _ntuple(kernel_size, d)
        self.stride = _ntuple(stride, d)
        self.padding = padding if isinstance(padding, str) else _ntuple(padding, d)
        self.dilation = _ntuple(dilation, d)
        self.transposed = False
        self.output_padding = (0,) * d
        self.groups = groups
        self.padding_mode = padding_mode
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        add_weight_and_bias(self, shape, out_channels, bias, device, dtype)

    def reset_parameters(self) -> None:
        reset_weight_and_bias(self.weight, self.bias)

    def _conv_forward(self, input, conv):
        if self.padding_mode == "zeros":
            return conv(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        # Non-zero padding modes pad explicitly (F.pad's order: last dim first), then convolve unpadded.
        amounts = [p for size in reversed(self.padding) for p in (size, size)]
        padded = F.pad(input, amounts, mode=_PAD_MODES[self.padding_mode])
        return conv(padded, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    def extra_repr(self) -> str:
        d = self._d
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * d:
            s += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1,) * d:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class Conv1d(_ConvNd):
    """1-D convolution: input (N, C_in, L), ``weight`` (C_out, C_in / groups, k)."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    _d = 1

    def forward(self, input):
        return self._conv_forward(input, F.conv1d)


class Conv2d(_ConvNd):
    """2-D convolution: input (N, C_in, H, W), ``weight`` (C_out, C_in / groups, kH, kW)."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    _d = 2

    def forward(self, input):
        return self._conv_forward(input, F.conv2d)


class Conv3d(_ConvNd):
    """3-D convolution: input (N, C_in, D, H, W), ``weight`` (C_out, C_in / groups, kD, kH, kW)."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    _d = 3

    def forward(self, input):
        return self._conv_forward(input, F.conv3d)


# torch.nn.modules.conv also holds the transposed convolutions.
from .conv_transpose import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d  # noqa: E402

__all__ += ["ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]
