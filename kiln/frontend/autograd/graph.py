"""The autograd graph: backward nodes, their edges, and the tensors they save.

Every differentiable op run in grad mode on an input that requires grad attaches a
``PrimBackward`` to its result (``result.grad_fn``). A node's ``next_edges`` point, per input,
to that input's own ``grad_fn`` (with the output number) or, for a leaf, to an
``AccumulateGrad`` that adds into ``leaf.grad``. Saved tensors carry the version they had when
saved; using one that was modified in place since raises an error naming the op.

The node base class is in ``node.py``, the leaves' sinks in ``accumulate.py`` and what nodes save
in ``saved.py`` (all re-exported here).
"""

from __future__ import annotations

import functools
from typing import Any

from ...ir.dtypes import FLOATING
from ...ir.types import TensorType
from . import grad_mode
from .accumulate import AccumulateGrad, accumulate_into_grad, grad_accumulator  # noqa: F401 - re-exported
from .grad_mode import enable_grad, state
from .node import Edge, Node, RemovableHandle, _forward_stack, _next_seq  # noqa: F401 - re-exported
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
_last_shapes: tuple = ()  # the shapes tuple of the last node record made (shared)
_new_object = object.__new__


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
    input_dtypes: Any  # a DType shared by every input, or a tuple of them (see record)
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
        device, shapes, dtypes = self.device, self.input_shapes, self.input_dtypes
        if dtypes.__class__ is not tuple:  # one dtype shared by every input (see record)
            return tuple([_tensor_type(s, dtypes, device) for s in shapes])
        return tuple([_tensor_type(s, d, device) for s, d in zip(shapes, dtypes, strict=True)])

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

    kiln_only = True

    __slots__ = ("prim", "attrs", "input_shapes", "input_dtypes", "device", "saved_inputs", "saved_versions",
                 "saved_output", "out_data", "out_counter", "out_version", "out_trace", "view_version")  # fmt: skip
    prim: Any  # the Primitive
    attrs: dict
    input_shapes: tuple  # a shared tuple: each input's shape
    input_dtypes: Any  # the inputs' dtype where they all have one (most ops), else a shared tuple of them
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
    # a view op's node (PrimBackward, the ops' SplitBackward) notes the version; any other node has none
    version = getattr(view.grad_fn, "view_version", -1)
    if version == -1 or version == view._version[0]:
        return  # (``==``: a comparison by ``!=`` is a saved tensor's check, ``jit/eager_checks.py``)
    _regenerate_view_history(view)


def stamp_view(view) -> None:
    """Note that ``view``'s history (a ``PrimBackward``) is current for its memory's present version."""
    view.grad_fn.view_version = view._version[0]


def _regenerate_view_history(view) -> None:
    """``view``'s history as a gather of its elements from its base's present history."""
    from ..ops.inplace import gather_positions, view_positions  # noqa: PLC0415 - ops imports the tensor, which imports this module

    base = view._base
    if base.grad_fn is None and not base._requires_grad:
        return  # the base's memory carries no history to follow
    from .inplace_history import move_retained_grad  # noqa: PLC0415 - it imports this module

    with enable_grad():
        fresh = gather_positions(base, view_positions(base._data, view._data))
    old, old_nr = view.grad_fn, view._output_nr
    view.grad_fn, view._output_nr = fresh.grad_fn, 0
    stamp_view(view)
    move_retained_grad(view, old, old_nr)  # ``view.grad`` is its present value's gradient


def _shared_tuple(value: tuple) -> tuple:
    """``value``, or the equal tuple record shared before."""
    return _shared.get(value) or _share(value)


def _share(value: tuple) -> tuple:
    """``value`` as record's shared tuple from now on; the table is bounded, for programs whose
    shapes keep changing."""
    if len(_shared) > 4096:
        _shared.clear()
    _shared[value] = value
    return value


def record(prim, inputs: tuple, attrs: dict, result: Any) -> None:
    """Attach ``prim``'s backward to ``result`` (called by dispatch when a gradient may flow)."""
    if result._dtype.category != FLOATING:  # (the is_floating_point property costs a call)
        return  # integer and bool results carry no gradient
    # The node's fields written here, without a constructor's call, and unary and binary ops
    # unrolled: this runs for every recorded op, where each call, loop or generator is a visible
    # part of its time. An input that does not require grad has no edge (a tensor with a grad_fn
    # requires grad); a leaf that does, or its node for a first output, stands for its edge until
    # the edges are read (see next_edges): the node itself where the input is no view (whose
    # history may need a refresh) and no later output, without _pending_history's call (~40 ns
    # of an op on an input with history).
    node = _new_object(PrimBackward)
    arity = len(inputs)
    shapes: tuple
    if arity == 2:
        a, b = inputs
        node._edges = (
            (a if a.grad_fn is None else a.grad_fn if a._output_nr == 0 and a._base is None else _pending_history(a))
            if a._requires_grad
            else None,
            (b if b.grad_fn is None else b.grad_fn if b._output_nr == 0 and b._base is None else _pending_history(b))
            if b._requires_grad
            else None,
        )
        shapes = (a._data.shape, b._data.shape)
        # Most ops' inputs have one dtype: kept as that dtype, with no tuple to build and share
        # (~50 ns of a one-element add's node).
        dtype = a._dtype
        node.input_dtypes = dtype if b._dtype is dtype else _shared_tuple((dtype, b._dtype))
    elif arity == 1:
        a = inputs[0]
        node._edges = (
            (a if a.grad_fn is None else a.grad_fn if a._output_nr == 0 and a._base is None else _pending_history(a))
            if a._requires_grad
            else None,
        )
        shapes = (a._data.shape,)
        node.input_dtypes = a._dtype
    else:
        node._edges = tuple(
            [(t if t.grad_fn is None else _pending_history(t)) if t._requires_grad else None for t in inputs]
        )
        shapes = tuple([t._data.shape for t in inputs])
        dtypes = tuple([t._dtype for t in inputs])
        node.input_dtypes = dtypes[0] if dtypes.count(dtypes[0]) == arity else _shared_tuple(dtypes)
    # One shared tuple of shapes (a tuple kept per node is an object the collector walks): the last
    # node's where equal (consecutive ops mostly meet one shape: ~40 ns less than hashing the
    # nested tuple for the table), else the table's, as most ops meet shapes seen before.
    global _last_shapes
    last = _last_shapes
    if shapes == last:
        node.input_shapes = last
    else:
        node.input_shapes = _last_shapes = _shared.get(shapes) or _share(shapes)
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
