"""Linear layers: ``Linear``, ``Bilinear`` and ``Identity``, with PyTorch's default initialisation."""

from __future__ import annotations

import math

import kiln

from .. import functional as F
from .. import init
from ..parameter import Parameter
from .module import Module

__all__ = ["Identity", "Linear", "Bilinear"]


def add_weight_and_bias(module, weight_shape: tuple, bias_size: int, bias: bool, device, dtype) -> None:
    """Register ``weight`` (and ``bias``, or ``None``) on a layer, then initialise them."""
    module.weight = Parameter(kiln.empty(*weight_shape, device=device, dtype=dtype))
    if bias:
        module.bias = Parameter(kiln.empty(bias_size, device=device, dtype=dtype))
    else:
        module.register_parameter("bias", None)
    module.reset_parameters()


def reset_weight_and_bias(weight, bias) -> None:
    """PyTorch's default for Linear and the convolutions: kaiming_uniform_(a=sqrt(5)) for the
    weight, uniform(+-1/sqrt(fan_in)) for the bias."""
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(bias, -bound, bound)


class Identity(Module):
    """Returns its input; accepts and ignores any constructor arguments."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """``y = x W^T + b`` with ``weight`` (out_features, in_features) and ``bias`` (out_features)."""

    kiln_only = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        add_weight_and_bias(self, (out_features, in_features), out_features, bias, device, dtype)

    def reset_parameters(self) -> None:
        reset_weight_and_bias(self.weight, self.bias)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class NonDynamicallyQuantizableLinear(Linear):
    """A ``Linear`` under the name PyTorch gives ``MultiheadAttention.out_proj`` (PyTorch uses it to keep
    that projection out of dynamic quantization, which kiln does not have); programs import it by name."""


class Bilinear(Module):
    """``y = x1^T A x2 + b`` with ``weight`` (out_features, in1_features, in2_features)."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        self.weight = Parameter(kiln.empty(out_features, in1_features, in2_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(kiln.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )
