"""More activations for ``kiln.nn.functional``: PyTorch's names, defaults and gradients at the kinks.

Piecewise functions are written with ``where`` on the same comparisons PyTorch's backward uses,
so the gradient exactly at a breakpoint (hardswish and hardsigmoid at +-3) matches.
"""

from __future__ import annotations

import kiln

__all__ = ["celu", "selu", "glu", "hardswish", "hardsigmoid", "mish", "softsign", "softmin", "softshrink",
           "hardshrink", "tanhshrink", "threshold", "prelu", "rrelu", "gumbel_softmax"]  # fmt: skip

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _negative_part(input, alpha: float, inner_scale: float):
    """alpha * (exp(x * inner_scale) - 1) where x <= 0; the exp sees 0 elsewhere, so it cannot overflow."""
    return kiln.expm1(kiln.where(input > 0, 0.0, input) * inner_scale) * alpha


def celu(input, alpha: float = 1.0, inplace: bool = False) -> kiln.Tensor:
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError: alpha must not be 0 for celu")
    out = kiln.where(input > 0, input, _negative_part(input, alpha, 1.0 / alpha))
    return input.copy_(out) if inplace else out


def selu(input, inplace: bool = False) -> kiln.Tensor:
    out = kiln.where(input > 0, input, _negative_part(input, _SELU_ALPHA, 1.0)) * _SELU_SCALE
    return input.copy_(out) if inplace else out


def glu(input, dim: int = -1) -> kiln.Tensor:
    """``a * sigmoid(b)`` where ``a, b`` are the two halves of ``input`` along ``dim``."""
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    size = input.shape[dim]
    if size % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim % input.ndim} is size {size}")
    a, b = kiln.chunk(input, 2, dim=dim)
    return a * kiln.sigmoid(b)


def hardswish(input, inplace: bool = False) -> kiln.Tensor:
    out = kiln.where(input <= -3, 0.0, kiln.where(input < 3, input * (input + 3) / 6, input))
    return input.copy_(out) if inplace else out


def hardsigmoid(input, inplace: bool = False) -> kiln.Tensor:
    out = kiln.where(input <= -3, 0.0, kiln.where(input >= 3, 1.0, input / 6 + 0.5))
    return input.copy_(out) if inplace else out


def mish(input, inplace: bool = False) -> kiln.Tensor:
    out = input * kiln.tanh(kiln.softplus(input))
    return input.copy_(out) if inplace else out


def softsign(input) -> kiln.Tensor:
    return input / (1 + kiln.abs(input))


def softmin(input, dim=None, _stacklevel: int = 3, dtype=None) -> kiln.Tensor:
    from .functional import softmax  # noqa: PLC0415 - functional imports this module

    return softmax(-input, dim, dtype=dtype)


def softshrink(input, lambd: float = 0.5) -> kiln.Tensor:
    if lambd < 0:
        raise RuntimeError(f"lambda must be greater or equal to 0, but found to be {lambd}.")
    return kiln.where(input > lambd, input - lambd, kiln.where(input < -lambd, input + lambd, 0.0))


def hardshrink(input, lambd: float = 0.5) -> kiln.Tensor:
    return kiln.where((input > lambd) | (input < -lambd), input, 0.0)


def tanhshrink(input) -> kiln.Tensor:
    return input - kiln.tanh(input)


def threshold(input, threshold: float, value: float, inplace: bool = False) -> kiln.Tensor:
    """``x`` where ``x > threshold``, else ``value``."""
    out = kiln.where(input > threshold, input, value)
    return input.copy_(out) if inplace else out


def prelu(input, weight) -> kiln.Tensor:
    """Leaky ReLU with a learned slope, one per channel (dim 1) or one shared (``weight`` of one element)."""
    if weight.numel() != 1:
        channel_dim = 1 if input.ndim >= 2 else 0
        if input.ndim == 0 or input.shape[channel_dim] != weight.numel():
            raise RuntimeError(
                f"Mismatch of parameter numbers and input channel size. Found parameter numbers = {weight.numel()} "
                f"and channel size = {input.shape[channel_dim] if input.ndim else 1}."
            )
        shape = [1] * input.ndim
        shape[channel_dim] = weight.numel()
        weight = weight.reshape(shape)
    else:
        weight = weight.reshape(())
    return kiln.where(input > 0, input, input * weight)


def rrelu(input, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
          inplace: bool = False) -> kiln.Tensor:  # fmt: skip
    """Randomized leaky ReLU: a slope drawn from U(lower, upper) per element while training, their mean else."""
    if training:
        slope = kiln.rand(*input.shape, dtype=input.dtype, device=input.device) * (upper - lower) + lower
    else:
        slope = (lower + upper) / 2
    out = kiln.where(input > 0, input, input * slope)
    return input.copy_(out) if inplace else out


def gumbel_softmax(logits, tau: float = 1.0, hard: bool = False, eps: float = 1e-10, dim: int = -1) -> kiln.Tensor:
    """A sample from the Gumbel-softmax (concrete) distribution over ``dim``; ``hard`` returns one-hot
    samples whose gradient is the soft sample's (straight-through)."""
    # -log(E) with E ~ Exponential(1) is a standard Gumbel sample; E = -log(U), U ~ Uniform(0, 1).
    uniform = kiln.rand(*logits.shape, dtype=logits.dtype, device=logits.device)
    gumbels = -kiln.log(-kiln.log(kiln.clamp(uniform, min=eps)))
    soft = kiln.softmax((logits + gumbels) / tau, dim=dim)
    if not hard:
        return soft
    index = kiln.argmax(soft, dim=dim, keepdim=True)
    one_hot = kiln.zeros_like(soft).scatter(dim, index, 1.0)
    return one_hot - soft.detach() + soft
