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
import traceback
import weakref
from typing import Any

from ...ir.dtypes import FLOATING
from ...ir.types import TensorType
from ..jit import state as _jit
from . import grad_mode
from .grad_mode import enable_grad, state

_next_seq = itertools.count().__next__  # a bound method: cheaper than next(counter)
_new_object = object.__new__
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


class SavedTensor:
    """A tensor saved for backward, with the version it had then.

    An output is saved as its array and version counter, not as the tensor, so that the
    tensor -> grad_fn -> saved tensor path is no reference cycle; unpacking rebuilds a tensor
    whose ``grad_fn`` is the saving node (needed for higher-order gradients).
    """

    __slots__ = ("tensor", "data", "device", "counter", "version", "node_ref", "output_nr", "trace")

    def __init__(self, tensor, node: Node | None = None, output_nr: int = 0) -> None:
        if tensor._inference:
            raise RuntimeError(
                "Inference tensors cannot be saved for backward. Make a normal tensor from it "
                "(x.clone() outside kiln.inference_mode()) before using it in autograd."
            )
        self.counter = tensor._version
        self.version = tensor._version[0]
        if node is None:
            self.tensor = tensor
        else:
            self.tensor = None
            self.data, self.device = tensor._data, tensor._device
            self.node_ref, self.output_nr = weakref.ref(node), output_nr
            self.trace = tensor._trace  # a traced output keeps its IR value when unpacked

    def unpack(self, node: Node):
        if self.counter[0] != self.version:
            raise version_error(node, self.version, self.counter[0])
        if self.tensor is not None:
            return self.tensor
        from ..tensor import make_tensor  # noqa: PLC0415 - tensor imports this module

        t = make_tensor(self.data, self.device)
        t._version = self.counter
        t._requires_grad = True
        t.grad_fn, t._output_nr = self.node_ref(), self.output_nr
        if self.trace is not None:
            t._trace = self.trace
        return t


def version_error(node: Node, saved: int, now: int) -> RuntimeError:
    """The error for a tensor that ``node`` saved at version ``saved`` and finds at ``now``."""
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an "
        f"inplace operation: it was saved by {node.name()} at version {saved} and "
        f"is now at version {now}. Hint: clone it before the inplace "
        "operation, or run with kiln.autograd.set_detect_anomaly(True) to see the forward op."
    )


@functools.lru_cache(maxsize=4096)
def _tensor_type(shape: tuple, dtype, device) -> TensorType:
    """A ``TensorType`` (frozen, so shared): ~75 ns from the cache against ~300 ns to construct, and
    a binary op's VJP reads two."""
    return TensorType(shape, dtype, device)


class _VjpContext:
    """What a primitive's VJP rule sees as ``ctx``: its node (a ``PrimBackward``) read through these
    properties, with no object of its own per call."""

    __slots__ = ()
    saved_inputs: tuple[SavedTensor, ...] | None
    saved_output: SavedTensor | bool | None
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
        saved = self.saved_output
        if saved is None:
            raise _freed_error(self)  # type: ignore[arg-type]
        return saved.unpack(self)  # type: ignore[union-attr,arg-type]

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        device = self.device
        return tuple([_tensor_type(s, d, device) for s, d in zip(self.input_shapes, self.input_dtypes, strict=True)])

    @property
    def needs_input_grad(self) -> tuple[bool, ...]:
        # (a leaf input whose edge is still pending stands in _edges for that edge: not None either)
        return tuple([e is not None for e in self._edges])


class _SavedInputs:
    """The saved inputs, unpacked (and version-checked) one at a time as the VJP reads them: a
    rule that does not read an input is not stopped by an in-place change to it, as in PyTorch."""

    __slots__ = ("saved", "node")

    def __init__(self, saved: tuple, node: Node) -> None:
        self.saved, self.node = saved, node

    def __getitem__(self, i: int):
        return self.saved[i].unpack(self.node)

    def __len__(self) -> int:
        return len(self.saved)

    def __iter__(self):
        return (s.unpack(self.node) for s in self.saved)


class FreedGraphError(RuntimeError):
    """A backward reached a node whose saved values were freed by an earlier backward (run the
    first one with ``retain_graph=True`` to keep them). A ``RuntimeError``, as PyTorch raises."""


def _freed_error(node: Node) -> FreedGraphError:
    return FreedGraphError(
        f"Trying to backward through the graph a second time (through {node.name()}): its saved "
        "tensors were freed after the first backward. Pass retain_graph=True to the first "
        "backward() or autograd.grad() call if you need to backward through it again."
    )


class PrimBackward(Node, _VjpContext):
    """The backward of one primitive call: runs the primitive's VJP rule (which reads the node as its
    ``ctx``: saved inputs and output, attributes, input types). Made by ``record``."""

    __slots__ = ("prim", "attrs", "input_shapes", "input_dtypes", "device", "saved_inputs", "saved_output",
                 "view_version", "_edges", "_leaves_pending")  # fmt: skip
    prim: Any  # the Primitive
    attrs: dict
    input_shapes: tuple
    input_dtypes: tuple
    device: Any
    saved_inputs: tuple[SavedTensor, ...] | None  # None once released
    saved_output: SavedTensor | bool | None  # False: not saved; None: released
    view_version: int  # the version of a view's memory when this node became its history (-1: not a view's)
    _edges: tuple  # the next edges, where a leaf input stands for its own edge until they are read
    _leaves_pending: bool  # whether _edges may hold leaf tensors

    @property
    def next_edges(self) -> tuple[Edge, ...]:  # type: ignore[override]  # Node's slot, made lazy here
        """One edge per input. A leaf input's edge, to its AccumulateGrad, is made when the edges are
        first read (by backward): the node holds the leaf itself until then, as the accumulator
        would, and a graph dropped unused (``y = w * x`` in a loop) makes no accumulator at all.
        PyTorch makes one per op there, which is ~0.15 us of a one-element op's ~1.3 us."""
        if self._leaves_pending:  # (the leaf's edge whatever became of it since, as if made at once)
            self._edges = tuple(
                [e if e is None or e.__class__ is tuple else (grad_accumulator(e), 0) for e in self._edges]
            )
            self._leaves_pending = False
        return self._edges

    def name(self) -> str:
        return "".join(part.capitalize() for part in self.prim.name.split("_")) + "Backward"

    def apply(self, grads: list) -> tuple:
        return self.prim.vjp(_ops.module or _ops.load(), self, grads[0])

    def release(self) -> None:
        self.saved_inputs = None
        self.saved_output = None


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
            accumulate_into_grad(self.variable, grads[0])
        hooks = self.variable._post_accumulate_hooks
        if hooks and grads[0] is not None:
            for hook in list(hooks):
                hook(self.variable)
        return ()


def accumulate_into_grad(leaf, grad) -> None:
    if grad is None:
        return
    if _jit.tracing:
        _jit.grad_change(leaf)
    if leaf._grad is None:
        # Copy unless the graph is being kept for a higher order: the incoming gradient may be
        # the same tensor as another leaf's (add passes its gradient through unchanged).
        leaf._grad = grad if state.grad_enabled else grad.detach().clone()
    elif state.grad_enabled:
        leaf._grad = leaf._grad + grad  # create_graph: keep the sum differentiable
    elif _jit.tracing:  # a trace sees the accumulation as an op
        from ..ops import add, commit_inplace  # noqa: PLC0415

        commit_inplace(leaf._grad, add(leaf._grad, grad), op="gradient accumulation")
    else:
        leaf._grad._data += grad._data
        leaf._grad._version[0] += 1


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
    if version != -1 and version != view._version[0]:
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
        # a leaf that does stands for its edge until the edges are read (see next_edges).
        node._edges = (
            (a if a.grad_fn is None else _edge_of(a)) if a._requires_grad else None,
            (b if b.grad_fn is None else _edge_of(b)) if b._requires_grad else None,
        )
        node.input_shapes = (a._data.shape, b._data.shape)
        node.input_dtypes = (a._dtype, b._dtype)
    else:
        node._edges = tuple([(t if t.grad_fn is None else _edge_of(t)) if t._requires_grad else None for t in inputs])
        node.input_shapes = tuple([t._data.shape for t in inputs])
        node.input_dtypes = tuple([t._dtype for t in inputs])
    node._leaves_pending = True
    node.seq = _next_seq()
    node.pre_hooks = node.hooks = None
    node.forward_stack = _forward_stack(1) if grad_mode.anomaly_used and state.anomaly else None  # less record
    node.prim, node.attrs = prim, attrs
    node.device = result._device
    node.saved_inputs = tuple([SavedTensor(t) for t in inputs]) if prim.save_inputs else ()
    node.saved_output = SavedTensor(result, node) if prim.save_output else False
    node.view_version = result._version[0] if prim.is_view else -1
    result.grad_fn = node
    result._output_nr = 0
    result._requires_grad = True
