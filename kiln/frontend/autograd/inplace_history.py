"""What an in-place write does to a tensor's autograd history, beyond taking the value's.

A write whose value does not derive from the written tensor's own history (``v.copy_(s)``,
``v.fill_(0)``, ``v.zero_()``, ``v.normal_()``, ``v[...] = s`` on a tensor that is no view)
still keeps an edge to that old history, which receives a zero gradient, as PyTorch's
``CopyBackwards`` and ``FillBackward`` do: ``v = conv2d(a, w); v.copy_(s); v.sum().backward()``
leaves ``a.grad`` and ``w.grad`` zeros, not None. The difference matters: an optimizer with
momentum or weight decay steps a parameter whose gradient is zero and skips one whose gradient
is None.

``retain_grad`` keeps the gradient of the tensor's present value: an in-place write moves its hook
from the old history's node to the new one (``move_retained_grad``).
"""

from __future__ import annotations

import weakref

from .graph import _edge_of
from .node import Node


class OverwriteBackward(Node):
    """The history of a tensor overwritten in place: the gradient goes on to the written value, and
    zeros go to the tensor's old history (edges: the value's, the old history's)."""

    kiln_only = True

    __slots__ = ("op",)
    op: str  # the in-place op, for the node's name

    @classmethod
    def attach(cls, target, value, op: str) -> None:
        """Make ``target``'s history "``value`` written over the present history"."""
        node = cls((_edge_of(value), (target.grad_fn, target._output_nr)))
        node.op = op
        target.grad_fn, target._output_nr, target._requires_grad = node, 0, True

    def name(self) -> str:
        return "CopyBackwards" if self.op == "copy_" else f"{self.op.strip('_').capitalize()}Backward0"

    def apply(self, grads: list) -> tuple:
        from ..ops import zeros  # noqa: PLC0415 - ops import the tensor, which imports autograd

        g = grads[0]
        # (built by the ops, so create_graph and a trace see them: a compiled backward sends the
        # same zeros down the old edge)
        return g, zeros(tuple(g.shape), dtype=g.dtype, device=g.device)


def reaches_directly(node, old: Node, old_nr: int) -> bool:
    """Whether ``node`` has an edge straight to output ``old_nr`` of ``old`` (``x.mul_(2)``'s value
    does; ``x.copy_(s)``'s does not). Reads a lazy node's pending edges without making them."""
    if node is None:
        return False
    edges = getattr(node, "_edges", None)
    if edges is None:
        edges = node.next_edges
    for e in edges:  # pending: None, a leaf, a node (its output 0) or an edge (see LazyEdgesNode)
        if (e is old and old_nr == 0) or (e.__class__ is tuple and e[0] is old and e[1] == old_nr):
            return True
    return False


class RetainGrad:
    """``retain_grad``'s hook on a node's output: keeps the gradient as ``tensor.grad``."""

    __slots__ = ("ref",)

    def __init__(self, tensor) -> None:
        self.ref = weakref.ref(tensor)

    def __call__(self, grad) -> None:
        t = self.ref()
        if t is not None:
            g = grad.detach()
            t._grad = g.clone() if t._grad is None else t._grad + g


def move_retained_grad(tensor, old: Node | None, old_nr: int) -> None:
    """After an in-place write gave ``tensor`` a new history: its ``retain_grad`` hook, on output
    ``old_nr`` of ``old``, goes to the new node, so ``tensor.grad`` is its new value's gradient."""
    if not tensor._retains_grad or old is None or (tensor.grad_fn is old and tensor._output_nr == old_nr):
        return
    hooks = (old.pre_hooks or {}).get(old_nr, [])
    hooks[:] = [h for h in hooks if not (isinstance(h, RetainGrad) and h.ref() is tensor)]
    tensor.grad_fn.register_prehook(RetainGrad(tensor), tensor._output_nr)
