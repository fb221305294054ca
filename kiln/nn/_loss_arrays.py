"""``smooth_l1_loss`` and ``huber_loss`` on eager CPU tensors as one autograd node before the reduction,
as PyTorch's SmoothL1LossBackward / HuberLossBackward.

Composed of ops, ``where(|d| < beta, 0.5 d^2 / beta, |d| - 0.5 beta)`` is nine nodes (the difference,
abs, the comparison's where, the products and quotients of both branches), each dispatched and each
walked by the backward: an actor-critic's value loss per time step (pytorch/examples'
reinforcement_learning) spent a fifth of its update in them. ``pointwise_eager`` computes the same
values with the same operations on the arrays and attaches one node whose gradient is the closed form
``g * where(|d| < beta, d / beta, sign(d))`` (Huber's: ``d`` and ``delta sign(d)``), and its negation
for the target. It declines (None) wherever the ops must run: traces and profiles record them, and
broadcasting or mixed dtypes take the ops' checks; the node recomputes the ops under ``create_graph``.
The reduction (mean, sum) stays an op after it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.frontend.autograd import grad_mode
from kiln.frontend.ops._util import plain_arrays
from kiln.frontend.ops.arrays_node import ArraysBackward
from kiln.frontend.tensor import Tensor, make_tensor


def pointwise_eager(
    kind: str, input, target, width: float, composite: Callable[[Tensor, Tensor], Tensor]
) -> Tensor | None:
    """The unreduced loss ``kind`` ("smooth_l1": ``width`` is beta; "huber": delta) as one node, or
    None where ``composite(input, target)`` (the same with ops) must run."""
    if not (plain_arrays(input, target) and input._data.shape == target._data.shape and input._data.ndim):
        return None
    d = np.subtract(input._data, target._data)
    magnitude = np.abs(d)
    inside = magnitude < width
    if kind == "smooth_l1":  # 0.5 d d / beta inside, |d| - 0.5 beta outside: the ops' order of operations
        near, far = 0.5 * d * d / width, magnitude - 0.5 * width
    else:  # 0.5 d d inside, delta (|d| - 0.5 delta) outside
        near, far = 0.5 * d * d, width * (magnitude - 0.5 * width)
    result = make_tensor(np.where(inside, near, far), input._device, input._dtype)
    if (input._requires_grad or target._requires_grad) and grad_mode.state.grad_enabled:
        if grad_mode.inference_used and (input._inference or target._inference):
            return None  # the ops raise the error of saving an inference tensor
        PointwiseLossBackward.attach(result, input, target, kind, width, composite)
    return result


class PointwiseLossBackward(ArraysBackward):
    """The backward of ``pointwise_eager``: the loss's slope in ``d = input - target``, times ``g``."""

    __slots__ = ("kind", "width")
    kind: str
    width: float

    @classmethod
    def attach(cls, result: Tensor, input: Tensor, target: Tensor, kind: str, width: float, composite) -> None:
        node = cls._new(result, (input, target), composite)
        node.kind, node.width = kind, width

    def name(self) -> str:
        return "SmoothL1LossBackward0" if self.kind == "smooth_l1" else "HuberLossBackward0"

    def _on_arrays(self, g: Tensor, saved: tuple) -> tuple:
        input, target = saved
        d = np.subtract(input._data, target._data)
        inside = np.abs(d) < self.width
        near = d / self.width if self.kind == "smooth_l1" else d
        far = np.sign(d) if self.kind == "smooth_l1" else self.width * np.sign(d)
        slope = np.multiply(g._data, np.where(inside, near, far))
        edge_input, edge_target = self.next_edges
        grad_input = make_tensor(slope, g._device, g._dtype) if edge_input is not None else None
        grad_target = make_tensor(np.negative(slope), g._device, g._dtype) if edge_target is not None else None
        return grad_input, grad_target
