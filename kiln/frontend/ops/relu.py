"""``relu`` on eager CPU tensors as one autograd node, as PyTorch's ReluBackward.

Composed of ops, ``where(x <= 0, 0, x)`` is two dispatches and two 0-d zeros forward, and the
where's node backward (a third dispatch, a zero and a promotion): 9 us forward on a 64x128
float32 tensor where PyTorch takes 2, and about 20 us more backward. ``relu_eager`` computes the
same values on the arrays and attaches one ``ReluBackward`` that keeps the mask ``not x <= 0``
(as the where's node kept its condition) and returns ``where(mask, g, 0)``. Both selects are a
product of the values' bits by the mask: exactly the selected value (nan and infinities
included) or +0.0, in one pass where numpy's ``where`` branches on each element. It declines
(returns None) wherever the ops must run: a trace records them, a profile records them, and
every other device, dtype or kind of tensor takes the ops' own paths.

``clamp`` with number bounds is the same kind of op: two ``where``s, each with its comparison and a
0-d bound (4 dispatches, 20 us on 16x64 float32 where PyTorch takes 2); ``clamp_eager`` computes
them as numpy's ``clip`` and keeps one mask, where the input lay within the bounds.
"""

from __future__ import annotations

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.types import CPU
from .. import dispatch
from ..autograd import grad_mode
from ..autograd.graph import Node, _edge_of
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor
from ._util import scalar_tensor

_where = P["where"]
#: Elements from which the ops run where eager kernels are on: the where's compiled kernel splits
#: over the threads (a 256x4096 float32 relu forward and backward, 2 threads: 490-570 us on the ops,
#: 600-810 us here; 32x8x28x28: equal; 64x128: 35 -> 16 us).
COMPILED_FROM = 1 << 18
#: The unsigned integer of each float's size: a select multiplies the bits by 0 or 1.
_BITS = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def relu_eager(input) -> Tensor | None:
    """``where(input <= 0, 0, input)`` as one node, or None where the ops must run."""
    if (
        (_jit.tracing and _jit.current.get() is not None)
        or dispatch.profiling_ops
        or type(input) is not Tensor
        or input._device is not CPU
    ):
        return None
    x = input._data
    if x.dtype not in _BITS or not x.ndim:  # (a 0-d array's ufuncs return numpy scalars)
        return None
    if x.size >= COMPILED_FROM and _where in dispatch._compiled_routes:
        return None  # the where's compiled kernel, on the kernel threads, is the faster select

    keep = np.less_equal(x, 0)
    np.logical_not(keep, out=keep)  # (not `x > 0`: nan is kept, as where(x <= 0, 0, x) keeps it)
    result = make_tensor(_select(x, keep), CPU, input._dtype)
    if input._requires_grad and grad_mode.state.grad_enabled:
        if grad_mode.inference_used and input._inference:
            return None  # the ops raise the error of saving an inference tensor
        ReluBackward.attach(result, input, keep)
    return result


def clamp_eager(input, min, max) -> Tensor | None:
    """``where(out > max, max, out)`` of ``out = where(input < min, min, input)`` (a None bound
    skipped) as one node, or None where the ops must run: a bound that is not a Python number too."""
    if (
        (_jit.tracing and _jit.current.get() is not None)
        or dispatch.profiling_ops
        or type(input) is not Tensor
        or input._device is not CPU
        or not all(b is None or type(b) in (int, float) for b in (min, max))
    ):
        return None
    x = input._data
    if x.dtype not in _BITS or not x.ndim:
        return None
    if x.size >= COMPILED_FROM and _where in dispatch._compiled_routes:
        return None
    kind = x.dtype.type  # a Python bound is compared and written in the tensor's dtype, as the ops do
    low, high = (None if b is None else kind(b) for b in (min, max))
    # numpy's clip of two bounds keeps x unless x < low (then low), then unless > high: the ops' two
    # wheres, signed zeros and nan included, in one pass (with one bound it is numpy's maximum or
    # minimum, which may turn -0.0 into 0.0: an infinite bound stands for the missing one)
    result = make_tensor(np.clip(x, kind(-np.inf) if low is None else low, kind(np.inf) if high is None else high),
                         CPU, input._dtype)  # fmt: skip
    if input._requires_grad and grad_mode.state.grad_enabled:
        if grad_mode.inference_used and input._inference:
            return None  # the ops raise the error of saving an inference tensor
        ClampBackward.attach(result, input, _within(x, low, high))
    return result


def _within(x: np.ndarray, low, high) -> np.ndarray:
    """Where ``low <= x <= high`` (a None bound: no limit): False at nan, as PyTorch's clamp backward."""
    if low is None:
        return np.less_equal(x, high)
    keep = np.greater_equal(x, low)
    return keep if high is None else np.logical_and(keep, np.less_equal(x, high), out=keep)


def _select(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``where(keep, values, 0)`` exactly, as a new array: the bits of ``values`` times 0 or 1."""
    bits = _BITS[values.dtype]
    return np.multiply(values.view(bits), keep, dtype=bits).view(values.dtype)


class MaskBackward(Node):
    """The backward of an activation that keeps a boolean mask of its input (relu's, leaky_relu's):
    the gradient on the arrays (``_on_arrays``), or through the ops where a graph (create_graph), a
    trace or a profile records them (``_through_ops``). The mask, not the input, is kept, so writing
    into the input afterwards (``inplace=True`` does) leaves the gradient well defined."""

    kiln_only = True

    __slots__ = ("mask",)
    mask: np.ndarray | None

    def apply(self, grads: list) -> tuple:
        g = grads[0]
        mask = self.mask
        if mask is None:
            raise RuntimeError(
                f"Trying to backward through the graph a second time (through {self.name()}): its saved "
                "tensors were freed after the first backward. Pass retain_graph=True to the first backward()."
            )
        if (
            grad_mode.state.grad_enabled or (_jit.tracing and _jit.current.get() is not None) or dispatch.profiling_ops
            or g._device is not CPU or g._data.dtype not in _BITS or g._data.shape != mask.shape
        ):  # fmt: skip
            return (self._through_ops(make_tensor(mask, CPU, dt.bool_), g),)
        return (make_tensor(self._on_arrays(mask, g._data), CPU, g._dtype),)

    def _through_ops(self, mask: Tensor, g: Tensor) -> Tensor:
        raise NotImplementedError

    def _on_arrays(self, mask: np.ndarray, g: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def release(self) -> None:
        self.mask = None


class ReluBackward(MaskBackward):
    """The backward of ``relu_eager``: ``g`` where the input was kept, 0 elsewhere."""

    __slots__ = ()

    @classmethod
    def attach(cls, result: Tensor, input: Tensor, keep: np.ndarray) -> None:
        node = cls((_edge_of(input),))
        node.mask = keep
        result.grad_fn, result._output_nr, result._requires_grad = node, 0, True

    def name(self) -> str:
        return "ReluBackward0"

    def _through_ops(self, mask: Tensor, g: Tensor) -> Tensor:
        return dispatch.apply(_where, mask, g, scalar_tensor(0, g._dtype, g._device))

    def _on_arrays(self, mask: np.ndarray, g: np.ndarray) -> np.ndarray:
        return _select(g, mask)


class ClampBackward(ReluBackward):
    """The backward of ``clamp_eager``: ``g`` where the input lay within the bounds (on one too),
    0 where a bound replaced it and at nan, as PyTorch's."""

    __slots__ = ()

    def name(self) -> str:
        return "ClampBackward1"
