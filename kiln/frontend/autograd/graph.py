"""The autograd graph: backward nodes, their edges, and the tensors they save.

Every differentiable op run in grad mode on an input that requires grad attaches a
``PrimBackward`` to its result (``result.grad_fn``). A node's ``next_edges`` point, per input,
to that input's own ``grad_fn`` (with the output number) or, for a leaf, to an
``AccumulateGrad`` that adds into ``leaf.grad``. Saved tensors carry the version they had when
saved; using one that was modified in place since raises an error naming the op.
"""

from __future__ import annotations

import functools
import itertools
import sys
import traceback
import weakref
from typing import Any

import numpy as np

from ...ir.dtypes import FLOATING
from ...ir.types import TensorType
from ..jit import state as _jit
from . import grad_mode
from .grad_mode import enable_grad, state
from .saved import (  # noqa: F401 - re-exported: nodes elsewhere import these from graph
    FreedGraphError,
    SavedTensor,
    _freed_error,
    inference_error,
    save_tensors,
    unpack_tensors,
    version_error,
)

_shared: dict[tuple, tuple] = {}  # record's shared shape and dtype tuples
_next_seq = itertools.count().__next__  # a bound method: cheaper than next(counter)
_new_object = object.__new__
_getrefcount = sys.getrefcount
_ndarray = np.ndarray
Edge = tuple["Node", int] | None


class Node:
    """A backward function in the graph. ``apply(grads) -> grads``, one per next edge."""

    __slots__ = ("next_edges", "seq", "pre_hooks", "hooks", "forward_stack", "__weakref__")
    num_outputs = 1

    def __init__(self, next_edges: tuple[Edge, ...]) -> None:
        self.next_edges = next_edges
        self.seq = _next_seq()  # later nodes run first when several are ready
        self.pre_hooks: dict[int, list] | None = None  # output_nr -> hooks on that gradient
        self.hooks: list | None = None
        # anomaly mode: the stack at the forward op (less Node's and its subclass's __init__ and their caller)
        self.forward_stack = _forward_stack(3) if grad_mode.anomaly_used and state.anomaly else None

    def name(self) -> str:
        return type(self).__name__

    def apply(self, grads: list) -> tuple:
        raise NotImplementedError

    def release(self) -> None:
        """Drop what was saved for backward (after a backward without retain_graph)."""

    def register_hook(self, fn) -> RemovableHandle:
        """``fn(grad_inputs, grad_outputs)`` runs after this node; it may return new grad_inputs."""
        if self.hooks is None:
            self.hooks = []
        return RemovableHandle(self.hooks, fn)

    def register_prehook(self, fn, output_nr: int = 0) -> RemovableHandle:
        if self.pre_hooks is None:
            self.pre_hooks = {}
        return RemovableHandle(self.pre_hooks.setdefault(output_nr, []), fn)

    def __repr__(self) -> str:
        return f"<{self.name()} object>"


def _forward_stack(frames_of_kiln: int) -> list[str]:
    """The stack at the forward op that makes a node, less the last ``frames_of_kiln`` frames below
    this call (the node's construction): anomaly mode names it if the node's backward fails."""
    return traceback.format_stack()[: -1 - frames_of_kiln]


class RemovableHandle:
    __slots__ = ("_hooks", "_fn")

    def __init__(self, hooks: list, fn) -> None:
        self._hooks = hooks
        self._fn = fn
        hooks.append(fn)

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


@functools.lru_cache(maxsize=4096)
def _tensor_type(shape: tuple, dtype, device) -> TensorType:
    """A ``TensorType`` (frozen, so shared): ~75 ns from the cache against ~300 ns to construct, and
    a binary op's VJP reads two."""
    return TensorType(shape, dtype, device)


class _VjpContext:
    """What a primitive's VJP rule sees as ``ctx``: its node (a ``PrimBackward``) read through these
    properties, with no object of its own per call."""

    __slots__ = ()
    saved_inputs: tuple | None
    saved_versions: tuple[int, ...]
    saved_output: bool | None
    out_data: Any
    out_counter: list
    out_version: int
    out_trace: Any
    input_shapes: tuple
    input_dtypes: tuple
    device: Any
    _edges: tuple

    @property
    def inputs(self) -> _SavedInputs:
        saved = self.saved_inputs
        if saved is None:
            raise _freed_error(self)  # type: ignore[arg-type]
        return _SavedInputs(saved, self)  # type: ignore[arg-type]

    @property
    def output(self):
        """The saved output, as a tensor whose ``grad_fn`` is this node (for higher-order gradients)."""
        if not self.saved_output:
            raise _freed_error(self)  # type: ignore[arg-type]
        counter = self.out_counter
        if counter[0] != self.out_version:
            raise version_error(self, self.out_version, counter[0])  # type: ignore[arg-type]
        from ..tensor import make_tensor  # noqa: PLC0415 - tensor imports this module

        t = make_tensor(self.out_data, self.device)
        t._version = counter
        t._requires_grad = True
        t.grad_fn, t._output_nr = self, 0
        if self.out_trace is not None:
            t._trace = self.out_trace  # a traced output keeps its IR value
        return t

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        device = self.device
        return tuple([_tensor_type(s, d, device) for s, d in zip(self.input_shapes, self.input_dtypes, strict=True)])

    @property
    def needs_input_grad(self) -> tuple[bool, ...]:
        # (a leaf input whose edge is still pending stands in _edges for that edge: not None either)
        return tuple([e is not None for e in self._edges])


class _SavedInputs:
    """The saved inputs, version-checked one at a time as the VJP reads them: a rule that does not
    read an input is not stopped by an in-place change to it, as in PyTorch."""

    __slots__ = ("saved", "node")

    def __init__(self, saved: tuple, node: PrimBackward) -> None:
        self.saved, self.node = saved, node

    def __getitem__(self, i: int):
        t = self.saved[i]
        saved_version = self.node.saved_versions[i]
        if t._version[0] != saved_version:
            raise version_error(self.node, saved_version, t._version[0])
        return t

    def __len__(self) -> int:
        return len(self.saved)

    def __iter__(self):
        return (self[i] for i in range(len(self.saved)))


class LazyEdgesNode(Node):
    """A node whose edges are made when first read (see next_edges): until then ``_edges`` holds
    ``pending_edge(input)`` per input, which is no new object for most inputs."""

    __slots__ = ("_edges", "_edges_pending")
    _edges: tuple  # the next edges, or what stands for them until they are read (see pending_edge)
    _edges_pending: bool  # whether _edges may hold what stands for an edge

    @property
    def next_edges(self) -> tuple[Edge, ...]:  # type: ignore[override]  # Node's slot, made lazy here
        """One edge per input. A leaf input's edge, to its AccumulateGrad, is made when the edges are
        first read (by backward): the node holds the leaf itself until then, as the accumulator
        would, and a graph dropped unused (``y = w * x`` in a loop) makes no accumulator at all.
        PyTorch makes one per op there, which is ~0.15 us of a one-element op's ~1.3 us. Likewise an
        input that is its node's first output stands for its edge as that node: no edge tuple kept
        per input while the graph lives, for the cyclic collector to walk."""
        if self._edges_pending:  # (the leaf's edge whatever became of it since, as if made at once)
            self._edges = tuple(
                [
                    e
                    if e is None or e.__class__ is tuple
                    else (e, 0)
                    if isinstance(e, Node)
                    else (grad_accumulator(e), 0)
                    for e in self._edges
                ]
            )
            self._edges_pending = False
        return self._edges

    @next_edges.setter
    def next_edges(self, pending: tuple) -> None:
        """Node's constructor sets the pending edges: ``pending_edge(input)`` per input."""
        self._edges, self._edges_pending = pending, True


def pending_edge(t):
    """What a ``LazyEdgesNode`` holds for input ``t`` in ``_edges``: None where no gradient flows to
    it, the leaf itself where it is a leaf that requires grad, else ``_pending_history(t)``."""
    return (t if t.grad_fn is None else _pending_history(t)) if t._requires_grad else None


def _pending_history(t):
    """What stands for the edge of ``t``, which has a ``grad_fn``: that node where ``t`` is its first
    output, else the edge itself."""
    if t._base is not None:
        refresh_view_history(t)  # (see _edge_of)
    return t.grad_fn if t._output_nr == 0 else (t.grad_fn, t._output_nr)


class PrimBackward(LazyEdgesNode, _VjpContext):
    """The backward of one primitive call: runs the primitive's VJP rule (which reads the node as its
    ``ctx``: saved inputs and output, attributes, input types). Made by ``record``.

    Every object a node keeps is walked by each full collection of Python's cyclic collector (whose
    number grows with the graph), so a node keeps few: its inputs' tuple as its saved inputs (with
    their versions as ints, which the collector does not track), input shapes and dtypes as shared
    tuples, leaf inputs in place of their edges, and a saved output as its array, version counter and
    version (a ``SavedTensor`` and its weak reference to the node were two more objects)."""

    __slots__ = ("prim", "attrs", "input_shapes", "input_dtypes", "device", "saved_inputs", "saved_versions",
                 "saved_output", "out_data", "out_counter", "out_version", "out_trace", "view_version")  # fmt: skip
    prim: Any  # the Primitive
    attrs: dict
    input_shapes: tuple
    input_dtypes: tuple
    device: Any
    saved_inputs: tuple | None  # the input tensors (checked against saved_versions when read); None once released
    saved_versions: tuple[int, ...]  # each saved input's version when saved
    saved_output: bool | None  # whether the output is saved (out_*; see keep_output); None: released
    view_version: int  # the version of a view's memory when this node became its history (-1: not a view's)

    def name(self) -> str:
        return "".join(part.capitalize() for part in self.prim.name.split("_")) + "Backward"

    def apply(self, grads: list) -> tuple:
        return self.prim.vjp(_ops.module or _ops.load(), self, grads[0])

    def release(self) -> None:
        self.saved_inputs = None
        self.saved_output = self.out_data = None

    def keep_output(self, t) -> None:
        """Save ``t`` as this node's output (read back by ``output``), at its present version."""
        if t._inference:
            raise inference_error()
        self.out_data, self.out_counter, self.out_version, self.out_trace = t._data, t._version, t._version[0], t._trace
        self.saved_output = True


class _Ops:
    """``kiln.frontend.ops``, the namespace every VJP rule computes with: imported at the first
    backward (ops imports the tensor, which imports this module), then one attribute read."""

    module: Any = None

    def load(self):
        from .. import ops  # noqa: PLC0415

        self.module = ops
        return ops


_ops = _Ops()


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


def _edge_of(t) -> Edge:
    if t.grad_fn is not None:
        # A view's history is stale when its memory was written through the base or another
        # view since it was set (``v = b.T; b[0] *= 3``, or ``v[:, 1:] *= 3`` on a view of a
        # view): it still leads to the base's old history. Rebuilt from the base, as PyTorch
        # regenerates a view's grad_fn when its version moved.
        if t._base is not None:
            refresh_view_history(t)
        return (t.grad_fn, t._output_nr)
    if t._requires_grad:
        return (grad_accumulator(t), 0)
    return None


# ----------------------------------------------------------------------------- views
def refresh_view_history(view) -> None:
    """Rebuild ``view``'s history from its base if its memory was written since it was set."""
    node = view.grad_fn
    if node.__class__ is PrimBackward and node.view_version not in (-1, view._version[0]):
        _regenerate_view_history(view)


def stamp_view(view) -> None:
    """Note that ``view``'s history (a ``PrimBackward``) is current for its memory's present version."""
    view.grad_fn.view_version = view._version[0]


def _regenerate_view_history(view) -> None:
    """``view``'s history as a gather of its elements from its base's present history."""
    from ..ops import take_flat  # noqa: PLC0415 - ops imports the tensor, which imports this module
    from ..ops.inplace import view_positions  # noqa: PLC0415
    from ..tensor import make_tensor  # noqa: PLC0415

    base = view._base
    if base.grad_fn is None and not base._requires_grad:
        return  # the base's memory carries no history to follow
    positions = make_tensor(view_positions(base._data, view._data), base._device)
    with enable_grad():
        fresh = take_flat(base, positions)
    view.grad_fn, view._output_nr = fresh.grad_fn, 0
    stamp_view(view)


def grad_accumulator(leaf) -> AccumulateGrad:
    """The leaf's AccumulateGrad, shared by every node that uses the leaf (held weakly)."""
    acc = leaf._grad_acc() if leaf._grad_acc is not None else None
    if acc is None:
        acc = AccumulateGrad(leaf)
        leaf._grad_acc = weakref.ref(acc)
    return acc


def record(prim, inputs: tuple, attrs: dict, result: Any) -> None:
    """Attach ``prim``'s backward to ``result`` (called by dispatch when a gradient may flow)."""
    if result._dtype.category != FLOATING:  # (the is_floating_point property costs a call)
        return  # integer and bool results carry no gradient
    # The node's fields written here, without a constructor's call, and binary ops unrolled: this
    # runs for every recorded op, where each call, loop or generator is a visible part of its time.
    node = _new_object(PrimBackward)
    if len(inputs) == 2:
        a, b = inputs
        # An input that does not require grad has no edge (a tensor with a grad_fn requires grad);
        # a leaf that does, or its node for a first output, stands for its edge until the edges
        # are read (see next_edges).
        node._edges = (
            (a if a.grad_fn is None else _pending_history(a)) if a._requires_grad else None,
            (b if b.grad_fn is None else _pending_history(b)) if b._requires_grad else None,
        )
        shapes, dtypes = (a._data.shape, b._data.shape), (a._dtype, b._dtype)
    else:
        node._edges = tuple(
            [(t if t.grad_fn is None else _pending_history(t)) if t._requires_grad else None for t in inputs]
        )
        shapes, dtypes = tuple([t._data.shape for t in inputs]), tuple([t._dtype for t in inputs])
    # One shared tuple for each value (a shape or dtype tuple kept per node is an object the
    # collector walks); bounded, for programs whose shapes keep changing.
    if len(_shared) > 4096:
        _shared.clear()
    node.input_shapes = _shared.setdefault(shapes, shapes)
    node.input_dtypes = _shared.setdefault(dtypes, dtypes)
    node._edges_pending = True
    node.seq = _next_seq()
    node.pre_hooks = node.hooks = None
    node.forward_stack = _forward_stack(1) if grad_mode.anomaly_used and state.anomaly else None  # less record
    node.prim, node.attrs = prim, attrs
    node.device = result._device
    if prim.save_inputs:
        if grad_mode.inference_used and any([t._inference for t in inputs]):
            raise inference_error()
        node.saved_inputs = inputs if inputs.__class__ is tuple else tuple(inputs)
        node.saved_versions = tuple([t._version[0] for t in inputs])
    else:
        node.saved_inputs, node.saved_versions = (), ()
    if prim.save_output:
        node.keep_output(result)
    else:
        node.saved_output = False
    node.view_version = result._version[0] if prim.is_view else -1
    result.grad_fn = node
    result._output_nr = 0
    result._requires_grad = True
