"""``softmax`` on eager CPU tensors as one autograd node, as PyTorch's SoftmaxBackward.

Composed of ops (``reductions.softmax``: the detached row maximum, a subtraction, exp, the row sum,
a division) it is five dispatches forward and, backward, the division's, the sum's, exp's and the
subtraction's nodes: ~8 passes, where the gradient of ``y = softmax(x)`` is ``y (g - sum(g y))``.
``softmax_eager`` runs the ops' forward with the kernels dispatch would run (so the same values, bit
for bit) and keeps ``y``; its backward is that expression (the ops' gradient within rounding).
Like PyTorch's node it reads the output, so an in-place change of the output before the backward
is an error. Under ``create_graph``, a trace or a profile the backward is the ops' gradient of the
composite recomputed. It declines (None) wherever the composite must run: traces and profiles
record ops; other devices, dtypes and kinds take the ops' checks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...ir.primitives import P
from .. import dispatch
from ..autograd import grad_mode
from ..autograd.saved import version_error
from ..tensor import Tensor, make_tensor
from ._util import plain_arrays
from .arrays_node import ArraysBackward

_MAX, _SUB, _EXP, _SUM, _DIV = P["reduce_max"], P["sub"], P["exp"], P["reduce_sum"], P["div"]


def _kernel(prim):
    """The kernel dispatch runs for ``prim`` (its compiled route where ``eager_kernels`` has one)."""
    return dispatch._compiled_routes.get(prim) or prim.eager


def softmax_eager(input, axes: tuple[int, ...], composite: Callable[[Tensor], Tensor]) -> Tensor | None:
    """``exp(x - max) / sum(exp(x - max))`` over ``axes`` as one node, or None where ``composite``
    (the same with ops) must run."""
    if not plain_arrays(input) or input._data.ndim == 0:  # (numpy makes scalars of 0-d results)
        return None
    x = input._data
    e = _kernel(_EXP)(np, _kernel(_SUB)(np, x, _kernel(_MAX)(np, x, axes=axes, keepdim=True)))
    y = _kernel(_DIV)(np, e, _kernel(_SUM)(np, e, axes=axes, keepdim=True))
    result = make_tensor(y, input._device, input._dtype)
    if input._requires_grad and grad_mode.state.grad_enabled:
        SoftmaxBackward.attach(result, input, axes, composite)
    return result


class SoftmaxBackward(ArraysBackward):
    """The backward of ``softmax_eager``: ``y (g - sum(g y))`` over the softmax's axes."""

    __slots__ = ("output", "output_version", "axes")
    output: np.ndarray | None  # y's array, and y's version counter with its value when saved
    output_version: tuple
    axes: tuple[int, ...]

    @classmethod
    def attach(cls, result: Tensor, input: Tensor, axes: tuple, composite: Callable) -> None:
        node = cls._new(result, (input,), composite, unchecked=(0,))  # the input for a recomputation only
        # the output's array and version counter, not the tensor: the tensor would hold its node
        node.output, node.output_version = result._data, (result._version, result._version[0])
        node.axes = axes

    def name(self) -> str:
        return "SoftmaxBackward0"

    def _on_arrays(self, g: Tensor, saved: tuple) -> tuple:
        counter, version = self.output_version
        if counter[0] != version:
            raise version_error(self, version, counter[0])
        out = self.output
        assert out is not None  # (released together with ``saved``, which unpack_tensors checked)
        gy = g._data * out
        gy -= out * gy.sum(axis=self.axes, keepdims=True)
        return (make_tensor(gy, g._device, g._dtype),)

    def release(self) -> None:
        super().release()
        self.output = None
