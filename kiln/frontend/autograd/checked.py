"""Tensors a composite op's backward depends on only through copies, checked as if saved.

PyTorch's convolution node saves its input and weight, and its backward raises if either was
changed in place since. kiln's convolutions are composites of primitives whose nodes save what
the primitives read: the direct path the padded copy of the input, im2col its windows, so an
in-place change of the input itself went unnoticed (the gradient was the old input's).
``check_saved(t, sources, op)`` puts one node in front of ``t``'s history that checks ``sources``
are still at the versions they had and passes the gradient through unchanged: the composite raises
where PyTorch's op does, with the same message as any saved tensor.

A compiled call's backward is traced by running the autograd graph of its trace, these nodes
included (``jit/build.py``): the compiled backward checks the call's tensors that any node checked
(``jit/eager_checks.py``) at its own time, as the eager node would.

>>> import kiln
>>> x, w = kiln.ones(3), kiln.ones(3, requires_grad=True)
>>> y = check_saved(x.clone() * w, (x,), "ExampleBackward")
>>> _ = x.add_(1)
>>> y.sum().backward()
Traceback (most recent call last):
...
RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation: it was saved by ExampleBackward at version 0 and is now at version 1. Hint: clone it before the inplace operation, or run with kiln.autograd.set_detect_anomaly(True) to see the forward op.
"""

from __future__ import annotations

from .node import Node
from .saved import save_tensors, unpack_tensors, version_error

__all__ = ["check_output", "check_saved"]


class CheckedBackward(Node):
    """The identity on the gradient, after checking that ``sources`` are unchanged since saved."""

    kiln_only = True

    # named as a PrimBackward's, which the tracer walks for the tensors the autograd graph holds
    __slots__ = ("op", "saved_inputs", "saved_versions")
    saved_inputs: tuple | None  # None once released

    def __init__(self, op: str, edge: tuple, sources: tuple) -> None:
        super().__init__((edge,))
        self.op, self.saved_inputs, self.saved_versions = op, sources, save_tensors(sources)

    def name(self) -> str:
        return self.op

    def apply(self, grads: list) -> tuple:
        unpack_tensors(self, self.saved_inputs, self.saved_versions)
        return (grads[0],)

    def release(self) -> None:
        self.saved_inputs = None


def check_saved(t, sources, op: str):
    """``t``, whose backward now first checks that no tensor of ``sources`` changed in place since
    this call (``op`` names the node in the error). ``t`` is new memory, not a view, just made by
    the composite (an in-place op on a view of it rebuilds the view's history from it). Without
    history (nothing requires grad) ``t`` is left as it is: no node, no check, as in PyTorch."""
    node = t.grad_fn
    if node is None:
        return t
    assert t._base is None, f"{op}: check_saved takes new memory, not a view"
    t.grad_fn, t._output_nr = CheckedBackward(op, (node, t._output_nr), tuple(sources)), 0
    return t


class CheckedOutputBackward(Node):
    """The identity on the gradient, after checking that the tensor whose history it heads was not
    changed in place since it was made (its version counter and version, not the tensor: the tensor
    would hold its own node)."""

    kiln_only = True

    __slots__ = ("op", "counter", "version")

    def __init__(self, op: str, edge: tuple, t) -> None:
        super().__init__((edge,))
        self.op, self.counter, self.version = op, t._version, t._version[0]

    def name(self) -> str:
        return self.op

    def apply(self, grads: list) -> tuple:
        if self.counter[0] != self.version:
            raise version_error(self, self.version, self.counter[0])
        return (grads[0],)


def check_output(t, op: str):
    """``t``, whose backward now first checks that ``t`` itself was not changed in place since this
    call: PyTorch's softmax keeps its output, and a composite whose nodes keep other values would
    give the gradient of the old output where PyTorch raises. ``t`` is new memory, as for
    ``check_saved``; without history it is left as it is."""
    node = t.grad_fn
    if node is None:
        return t
    assert t._base is None, f"{op}: check_output takes new memory, not a view"
    t.grad_fn, t._output_nr = CheckedOutputBackward(op, (node, t._output_nr), t), 0
    return t
