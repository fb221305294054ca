"""The sinks of the graph: a leaf's ``AccumulateGrad`` adds the gradient arriving there into
``leaf.grad``, taking it as it is (no copy) where nothing else can see it, as PyTorch does."""

from __future__ import annotations

import sys
import weakref

import numpy as np

from ..jit import state as _jit
from .grad_mode import state
from .node import Node

_getrefcount = sys.getrefcount
_ndarray = np.ndarray


class AccumulateGrad(Node):
    """The sink of a leaf tensor: adds the incoming gradient into ``leaf.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable) -> None:
        super().__init__(())
        self.variable = variable

    def apply(self, grads: list) -> tuple:
        if self.variable._requires_grad:  # requires_grad_(False) since the forward: no .grad, as in PyTorch
            accumulate_into_grad(self.variable, grads[0], from_buffer=True)
        hooks = self.variable._post_accumulate_hooks
        if hooks and grads[0] is not None:
            if _jit.tracing:
                _jit.ran_hooks(self.variable)
            for hook in list(hooks):
                hook(self.variable)
        return ()


def accumulate_into_grad(leaf, grad, from_buffer: bool = False) -> None:
    """Add ``grad`` into ``leaf.grad``. ``from_buffer``: the caller (AccumulateGrad, run by the engine)
    holds ``grad`` only in its list of gradients, so that a reference count shows whether anything
    else does (see _stealable)."""
    if grad is None:
        return
    if _jit.tracing:
        _jit.grad_change(leaf)
    if leaf._grad is None:
        # Under create_graph the gradient itself, to stay differentiable. Otherwise it may be the
        # same tensor as another leaf's (add passes its gradient through unchanged) or memory the
        # graph or the user still holds: copied unless nothing else can see it. A trace records the
        # copy as before (its values' aliasing is the compiled program's, not Python's references).
        if state.grad_enabled:
            leaf._grad = grad
        else:
            leaf._grad = grad if from_buffer and not _jit.tracing and _stealable(grad) else grad.detach().clone()
    elif state.grad_enabled:
        leaf._grad = leaf._grad + grad  # create_graph: keep the sum differentiable
    elif _jit.tracing:  # a trace sees the accumulation as an op
        from ..ops import add, commit_inplace  # noqa: PLC0415

        commit_inplace(leaf._grad, add(leaf._grad, grad), op="gradient accumulation")
    else:
        leaf._grad._data += grad._data
        leaf._grad._version[0] += 1


# The references to the incoming gradient while ``_stealable`` reads its count: the engine's buffer
# (the list passed to AccumulateGrad.apply), accumulate_into_grad's and _stealable's parameters,
# and getrefcount's own argument. Any other holder (another node's buffer, a saved tensor, the
# user, a hook's closure) raises the count, and the gradient is copied.
_GRAD_REFS = 4
# To an array while _sole_memory reads its count: the tensor's _data (or the view's .base), the
# parameter or local, and getrefcount's argument.
_ARRAY_REFS = 3


def _stealable(grad) -> bool:
    """Whether ``grad`` may become a leaf's ``.grad`` as it is, with no copy (PyTorch's AccumulateGrad
    rule): a plain tensor, which nothing but the engine's buffer holds, on memory nothing else reaches."""
    return (
        _getrefcount(grad) <= _GRAD_REFS
        and grad._base is None
        and grad.grad_fn is None
        and not grad._requires_grad
        and _sole_memory(grad._data)
    )


def _sole_memory(data) -> bool:
    """Whether ``data`` is a C-contiguous array (as a cloned gradient is) that only its tensor holds,
    owning its memory or a view of all of an array's memory that only ``data`` holds (a product's
    result taken through a transpose)."""
    if data.__class__ is not _ndarray or _getrefcount(data) > _ARRAY_REFS or not data.flags.c_contiguous:
        return False
    base = data.base
    return base is None or (
        base.__class__ is _ndarray
        and base.base is None
        and _getrefcount(base) <= _ARRAY_REFS
        and base.nbytes == data.nbytes
    )


def grad_accumulator(leaf) -> AccumulateGrad:
    """The leaf's AccumulateGrad, shared by every node that uses the leaf (held weakly)."""
    acc = leaf._grad_acc() if leaf._grad_acc is not None else None
    if acc is None:
        acc = AccumulateGrad(leaf)
        leaf._grad_acc = weakref.ref(acc)
    return acc
