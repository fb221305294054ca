"""The backward node of a composite computed on the arrays: one rule for when it may stay there.

Some composites of ops (gelu's tanh form, softmax, layer norm, cross-entropy) run eagerly as one
autograd node computed on their tensors' arrays, where the ops would make a node per op (see
``plain_arrays`` for when they may). Their backward is a closed form on the arrays too, except where
the ops' own graph must be seen: under ``create_graph`` (the gradient is differentiated again), in a
trace or a profile (they record ops), or for a gradient that is no plain array of the expected
shape. There it recomputes the composite with ops and differentiates that
(``recomputed_gradients``). ``ArraysBackward`` holds that rule and the bookkeeping (edges, the
tensors saved with their versions, the composite); a node adds its name, what it keeps besides its
inputs and its closed form, ``_on_arrays``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..autograd import grad_mode
from ..autograd.graph import LazyEdgesNode, pending_edge, save_tensors, unpack_tensors
from ..tensor import Tensor
from ._util import plain_arrays, recomputed_gradients


class ArraysBackward(LazyEdgesNode):
    """An on-the-arrays node: an edge per input of the composite, the saved tensors (the composite's
    inputs first), and the composite to recompute where the ops must run."""

    __slots__ = ("saved", "versions", "composite")
    saved: tuple | None  # the composite's inputs, then any other tensor the node checks; None once released
    versions: tuple  # their versions when saved (see save_tensors)
    composite: Callable[..., Tensor]

    @classmethod
    def _new(cls, result: Tensor, inputs: tuple, composite: Callable[..., Tensor], *, also: tuple = (),
             unchecked: tuple[int, ...] = ()):  # fmt: skip
        """A node for ``result``: an edge to each of ``inputs`` (None, or one that needs no gradient:
        no edge), saving them and ``also`` (``unchecked``: positions whose in-place change is no
        error, as in the ops' nodes)."""
        node = cls(tuple([None if t is None else pending_edge(t) for t in inputs]))
        saved = inputs + also
        node.saved, node.versions, node.composite = saved, save_tensors(saved, unchecked=unchecked), composite
        result.grad_fn, result._output_nr, result._requires_grad = node, 0, True
        return node

    def apply(self, grads: list) -> tuple:
        g = grads[0]
        saved = unpack_tensors(self, self.saved, self.versions)
        inputs = saved[: len(self.next_edges)]
        if grad_mode.state.grad_enabled or not self._takes(g, inputs[0]):  # a graph, a trace or a profile
            wanted = tuple(edge is not None for edge in self.next_edges)
            return recomputed_gradients(self.composite, inputs, wanted, g)
        return self._on_arrays(g, saved)

    def _takes(self, g: Tensor, x: Tensor) -> bool:
        """Whether the gradient ``g`` of the composite of ``x`` may be computed on the arrays."""
        return plain_arrays(g, x) and g._data.shape == x._data.shape

    def _on_arrays(self, g: Tensor, saved: tuple) -> tuple:
        """The closed-form gradients, one per input (None where it has no edge)."""
        raise NotImplementedError

    def release(self) -> None:
        self.saved = None
