"""``leaky_relu`` on eager CPU tensors as one autograd node, as PyTorch's LeakyReluBackward (``relu``'s
node is ``relu.py``'s).

Composed of ops, ``where(x > 0, x, x * slope)`` is three dispatches forward and, backward, the
where's and the product's nodes with a zero-filled branch each: about 100 us a step on a
(16, 16, 8, 8) tensor where PyTorch takes 20. ``leaky_relu_eager`` runs the same expression on the
arrays and attaches one ``LeakyReluBackward`` that keeps the mask ``x > 0`` and returns
``where(mask, g, g * slope)``, the sum the two nodes returned (the zero branches add exactly). It
declines (returns None) wherever the composite must run: a trace records the ops, a profile records
them, and every other device, dtype or argument takes the ops' own checks and errors.
"""

from __future__ import annotations

import numpy as np

from ...ir.types import CPU
from .. import dispatch
from ..autograd import grad_mode
from ..autograd.graph import _edge_of
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor
from .elementwise import where
from .relu import MaskBackward

_FLOATS = frozenset((np.dtype(np.float32), np.dtype(np.float64)))


def leaky_relu_eager(input, negative_slope) -> Tensor | None:
    """``where(input > 0, input, input * negative_slope)`` as one node, or None where the ops must run."""
    if (_jit.tracing and _jit.current.get() is not None) or dispatch.profiling_ops or not _plain(input, negative_slope):
        return None
    x = input._data
    out = x * negative_slope  # a new array of x's dtype (a Python number does not promote)
    if 0 < negative_slope <= 1:  # (not 0: where x is inf, x * 0 is nan and the maximum would take it)
        np.maximum(x, out, out=out)  # x where x > 0 (x >= x * slope there), x * slope elsewhere; nan stays nan
    else:
        out = np.where(x > 0, x, out)
    result = make_tensor(out, CPU, input._dtype)
    if input._requires_grad and grad_mode.state.grad_enabled:
        if grad_mode.inference_used and input._inference:
            return None  # the ops raise the error of saving an inference tensor
        # `x > 0`, as PyTorch's backward compares: the gradient at 0 (and at nan) is the slope.
        LeakyReluBackward.attach(result, input, x > 0, negative_slope)
    return result


def _plain(input, negative_slope) -> bool:
    """A plain float32/float64 CPU tensor (no sparse or other kind) and a Python number for a slope."""
    return (
        type(input) is Tensor
        and input._device is CPU
        and input._data.dtype in _FLOATS
        and type(negative_slope) in (float, int)
    )


class LeakyReluBackward(MaskBackward):
    """The backward of ``leaky_relu_eager``: ``g`` where the input was positive, ``g * slope`` elsewhere."""

    __slots__ = ("slope",)
    slope: float

    @classmethod
    def attach(cls, result: Tensor, input: Tensor, mask: np.ndarray, slope: float) -> None:
        node = cls((_edge_of(input),))
        node.mask, node.slope = mask, slope  # the mask as the where's node kept its condition
        result.grad_fn, result._output_nr, result._requires_grad = node, 0, True

    def name(self) -> str:
        return "LeakyReluBackward"

    def _through_ops(self, mask: Tensor, g: Tensor) -> Tensor:
        return where(mask, g, g * self.slope)

    def _on_arrays(self, mask: np.ndarray, g: np.ndarray) -> np.ndarray:
        return g * _factor(mask, self.slope, g.dtype)


def _factor(mask: np.ndarray, slope: float, dtype: np.dtype) -> np.ndarray:
    """1 where ``mask`` holds, ``slope`` elsewhere: ``g * factor`` is ``where(mask, g, g * slope)`` exactly
    (a product by 1 is exact). Two full arrays and a maximum run several times faster than numpy's where."""
    if not 0 <= slope <= 1:
        return np.where(mask, dtype.type(1), dtype.type(slope))
    factor = mask.astype(dtype)
    return np.maximum(factor, np.full_like(factor, slope), out=factor)  # (a scalar operand is slower)
