"""``gelu(approximate="tanh")`` on eager CPU tensors as one autograd node.

Composed of ops (``elementwise.gelu``), the tanh form is eight passes forward and, backward, a node
per op: about fifteen passes with the accumulations of the input's four uses. Where the composite
runs on numpy (eager, its compiled program not running), GPT's two (8, 64, 512) GELUs were about a
fifth of a step. ``gelu_tanh_eager`` runs the ops' forward expression on the arrays -- the same
operations in the same order, so the same values bit for bit -- and keeps tanh's output; its
backward is the derivative in one expression,

    dy/dx = s + x (1 - t^2) (b + 3 a x^2) / 2,   s = (1 + t) / 2,  t = tanh(x (a x^2 + b)),

within rounding of the ops' chain. Under ``create_graph``, a trace or a profile the backward is
the ops' gradient of the composite recomputed (differentiable again). It declines (returns None)
wherever the composite must run: traces and profiles record ops; other devices, dtypes and kinds
of tensor take the ops' checks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...ir.types import CPU
from ..autograd import grad_mode
from ..tensor import Tensor, make_tensor
from ._util import plain_arrays
from .arrays_node import ArraysBackward


def gelu_tanh_eager(input, a: float, b: float, composite: Callable[[Tensor], Tensor]) -> Tensor | None:
    """``x (t / 2 + 1 / 2)`` with ``t = tanh(x (x x a + b))`` as one node, or None where ``composite``
    (the same with ops) must run."""
    if not plain_arrays(input) or input._data.ndim == 0:  # (numpy makes scalars of 0-d results)
        return None
    x = input._data
    dtype = x.dtype.type
    inner = np.multiply(x, x)  # the ops' order: ((x x) a + b) x, tanh, t 1/2 + 1/2, x s
    inner *= dtype(a)
    inner += dtype(b)
    inner *= x
    t = np.tanh(inner, out=inner)
    s = t * dtype(0.5)
    s += dtype(0.5)
    result = make_tensor(np.multiply(x, s, out=s), CPU, input._dtype)
    if input._requires_grad and grad_mode.state.grad_enabled:
        GeluTanhBackward.attach(result, input, t, (a, b), composite)
    return result


class GeluTanhBackward(ArraysBackward):
    """The backward of ``gelu_tanh_eager``: ``g dy/dx`` (see the module docstring)."""

    __slots__ = ("t", "constants")
    t: np.ndarray | None  # tanh's output; None once released
    constants: tuple[float, float]

    @classmethod
    def attach(cls, result: Tensor, input: Tensor, t: np.ndarray, constants: tuple, composite: Callable) -> None:
        node = cls._new(result, (input,), composite)
        node.t, node.constants = t, constants

    def name(self) -> str:
        return "GeluBackward"

    def _on_arrays(self, g: Tensor, saved: tuple) -> tuple:
        x, gx = saved[0]._data, g._data
        a, b = self.constants
        t, dtype = self.t, x.dtype.type
        assert t is not None  # (released together with ``saved``, which unpack_tensors checked)
        slope = np.multiply(x, x)
        slope *= dtype(3 * a)
        slope += dtype(b)  # du/dx of u = x (a x^2 + b)
        slope *= x
        slope *= np.subtract(dtype(1), np.multiply(t, t))
        slope *= dtype(0.5)
        slope += t * dtype(0.5)
        slope += dtype(0.5)  # s + x (1 - t^2) du/dx / 2
        return (make_tensor(np.multiply(gx, slope, out=slope), CPU, g._dtype),)

    def release(self) -> None:
        super().release()
        self.t = None
