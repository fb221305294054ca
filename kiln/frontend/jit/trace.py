"""Tracing during a real eager run: every primitive that executes is also recorded as an IR node.

A tensor met by the trace is *bound*: ``tensor._trace = (trace, value, version)`` says which IR
value holds its contents at that version of its memory. Tensors come in three kinds:

- **externals**: tensors that existed before the call (arguments, parameters, tensors in
  closures, optimizer state, the generator's state). Each becomes a graph input, read at every
  call, never a constant.
- **born** tensors: made during the call. Results of primitives are bound to the node's output;
  tensors made from Python data (``kiln.tensor([...])``) become constants at their first use.
- **views** of either: their value is derived from the value of the tensor whose memory they
  share, at the positions read off their strides (the mechanism of ``ops/inplace.py``).

In-place ops are functionalized: ``commit_inplace`` reports each write, the written tensor is
rebound to the new value (a view's base to "base with the view's positions replaced"), and
every other view of that memory sees its version counter move and re-derives its value.
Externals whose final value differs from their input value are written back after each call.

Anything that needs a concrete value (``bool(t)``, ``.item()``, data-dependent shapes...)
stops the trace: the call simply finishes eagerly (it *is* an eager run), and the reason and
the user's source line are kept; ``fullgraph=True`` raises instead.
"""

from __future__ import annotations

import contextvars
import weakref
from dataclasses import dataclass, field, replace

import numpy as np

from ...ir.graph import GraphBuilder, Node, SourceLocation, Value
from ...ir.primitives import P
from ...ir.types import TensorType
from ..autograd.node import hook_state
from ..tensor import Tensor
from . import state
from .layouts import SharedMemory, contains, dense_order
from .locations import user_location
from .outcomes import TraceBreak, TraceBreakError
from .signature import (
    BornView,
    ClearGrad,
    ExternalResult,
    ExternalView,
    NewGrad,
    PythonValue,
    Repeat,
    Result,
    SetGrad,
    ShareGrad,
    WriteBack,
)
from .specialization import PythonRead

_PERMUTE = P["permute"]
_new, _set = object.__new__, object.__setattr__


@dataclass
class External:
    """A tensor from outside the call: a graph input."""

    tensor: Tensor
    value: Value
    kind: str  # "arg" (position in the flattened arguments) or "capture"
    arg_index: int | None = None
    state: tuple = ()  # (shape, strides, dtype, requires_grad, has .grad, hooks) before the call touched it
    grad_fn: object = None  # its autograd history before the call
    hooks_ran: bool = False  # a backward inside the call ran its hooks (``state.ran_hooks``)


@dataclass
class TraceResult:
    """What a finished trace hands to the compiler (the graph's inputs are the externals' values).

    Its results, write-backs and ``.grad`` assignments are the kinds of a ``Signature`` (see
    ``signature.py``), holding IR values where a signature holds output indices and external
    indices where it holds input indices; ``number_outputs`` turns them into a signature."""

    builder: GraphBuilder
    externals: list[External]
    outputs: list  # per flattened result leaf: Result, BornView, ExternalResult, ExternalView, NewGrad, Repeat
    #                or PythonValue
    writebacks: list[WriteBack]  # externals changed in place, with their final values
    grads: list  # SetGrad, ShareGrad or ClearGrad per external whose .grad the call changed
    modules: list[tuple[weakref.ref, bool]]
    prologues: list
    escaped: list[str] = field(default_factory=list)


#: One ``TensorType`` per distinct type met by ``type_of``: a trace of 70k nodes makes a few dozen
#: types, not 70k objects that the collector walks while the specialization keeps its traced graph.
_TYPES: dict[tuple, TensorType] = {}
_MAX_TYPES = 4096  # past this many (a process seeing ever new shapes), the table starts again


def type_of(t) -> TensorType:
    """``t``'s IR type (equal types are one object)."""
    key = (t._data.shape, t._dtype, t._device)
    found = _TYPES.get(key)
    if found is None:
        if len(_TYPES) >= _MAX_TYPES:
            _TYPES.clear()
        found = _TYPES[key] = TensorType(tuple(key[0]), key[1], key[2])
    return found


class Trace:
    """The recording of one call. Enter with ``start()``, leave with ``finish()`` or ``abandon()``."""

    numpy_shadows: dict  # set by the compiler when a call has numpy arrays to shadow (see on_numpy)

    def __init__(self, *, fullgraph: bool = False, parent: Trace | None = None) -> None:
        self.builder = GraphBuilder()
        self.fullgraph = fullgraph
        self.parent = parent  # a backward trace reads the forward trace's values as inputs
        self.externals: list[External] = []
        self._external_index: dict[int, int] = {}  # id(tensor) -> index in externals
        self._roots = SharedMemory()  # the externals by the memory they share
        self._written: set[int] = set()  # ids of the roots of the externals the call changed in place
        self.foreign: list[Value] = []  # parent values read by this trace, parallel to their inputs here
        self._foreign_index: dict[Value, Value] = {}
        self.born: list[weakref.ref] = []
        self.grads: dict[int, tuple] = {}  # id(tensor) -> (tensor, .grad before the trace touched it)
        self.grad_reads: set[int] = set()  # ids of the tensors whose .grad the call read before changing it
        self.modules: dict[int, tuple[weakref.ref, bool]] = {}
        self.seconds = 0.0  # how long the traced call ran (set by the compiler: the compile's first stage)
        self.made_modules: set[int] = set()  # ids of the modules constructed during the trace (state.module_made)
        self.prologues: list = []
        self.checks: list = []  # callables checked before each call of the specialization (state.guard)
        self.python_reads: list[PythonRead] = []  # the Python values read: on_python_read
        self.regions: list = []  # composite ops called during the trace (regions.py; kiln.onnx reads them)
        # values that library code derives from tensors once per call rather than once per use (a
        # cell's biases, a weight's transpose: nn/_derived.py); dropped when the call returns,
        # so that they count as no tensors the call stored
        self.derived: dict = {}
        self._permuted: dict[Value, tuple] = {}  # a permute's output -> (its perm, the value it read)
        self.broken: TraceBreak | None = None
        self.new_arrays: list[tuple] = []  # (id, where) of the numpy arrays first shadowed by this call: on_numpy
        # The user's line of the ops recorded now, while kiln's own code runs (``state.unwatched``): None
        # outside such code (each op finds its line), [] until its first op, then [that op's line].
        self.pin: list | None = None
        self._token: contextvars.Token | None = None
        # Dynamic sizes (dynamic.py): the sizes Python reads as WatchedSize, and the first comparison of one
        self.watched_sizes: frozenset[int] | dict[int, int | None] = frozenset()  # (a dict: each with its shadow)
        self.size_compared: str | None = None
        self.size_guards: list[tuple] = []  # (size, comparison, int, result, where): on_size_guard
        # float arguments read as inputs (scalar_args.py): id -> (float, its input, position); a watched one's use
        self.scalar_args: dict[int, tuple] = {}
        self.scalar_compared: str | None = None
        # comparisons of watched floats kept as guards (float_guards.py), and the first one that came out
        # otherwise at the earlier trace's values
        self.scalar_guards: list[tuple] = []
        self.scalar_split: str | None = None

    # ------------------------------------------------------------------ entering and leaving
    def start(self) -> Trace:
        self._token = state.current.set(self)
        state.tracing += 1
        return self

    def _leave(self) -> None:
        if self._token is not None:
            state.current.reset(self._token)
            state.tracing -= 1
            self._token = None

    def stop(self, reason: str, loc: SourceLocation | None) -> None:
        """Stop recording; the call goes on eagerly."""
        if self.broken is None:
            self.broken = TraceBreak(reason, loc)
        # Later ops of this call run untraced: detach this context from the trace.
        state.current.set(None)

    def abandon(self) -> None:
        self._leave()
        self.release()

    def release(self) -> None:
        """Unbind every tensor this trace bound, and drop the trace's references to them."""
        for ext in self.externals:
            if ext.tensor._trace is not None and ext.tensor._trace[0] is self:
                ext.tensor._trace = None
        for ref in self.born:
            t = ref()
            if t is not None and t._trace is not None and t._trace[0] is self:
                t._trace = None
        self.externals, self.born, self.grads, self.derived, self._permuted = [], [], {}, {}, {}
        self._external_index, self._roots, self._written = {}, SharedMemory(), set()

    # ------------------------------------------------------------------ hooks from eager code
    def on_new_tensor(self, t) -> None:
        t._trace = (self, None, -1)
        self.born.append(weakref.ref(t))

    def on_value_access(self, t, what: str) -> None:
        self.break_here(f"{what} reads a tensor's values, which a traced graph cannot depend on")

    def break_here(self, reason: str) -> None:
        loc = user_location(3)
        if self.fullgraph:
            self._leave()
            where = f"\n  at {loc}" if loc else ""
            raise TraceBreakError(
                f"kiln.compile(fullgraph=True): {reason}{where}\n"
                "Move that code out of the compiled function, or drop fullgraph=True to run such calls eagerly."
            )
        self.stop(reason, loc)

    def on_grad_change(self, t) -> None:
        key = id(t)
        if key not in self.grads:
            self.grads[key] = (t, t._grad)

    def on_grad_read(self, t) -> None:
        if id(t) not in self.grads:  # a read of what the call itself set is no read of the state before it
            self.grad_reads.add(id(t))

    def on_module_call(self, module) -> None:
        if id(module) not in self.made_modules:  # a module made by the call itself is no state
            self.modules.setdefault(id(module), (weakref.ref(module), module.training))

    def run_prologue(self, fn, args, kwargs):
        self.prologues.append((fn, args, kwargs))
        token = state.current.set(None)  # the prologue runs eagerly, outside the graph
        try:
            return fn(*args, **kwargs)
        finally:
            state.current.reset(token)

    def on_python_read(self, what: str, kind: str) -> None:
        """The traced call read a Python value that becomes a graph input (``kind="input"``, read at
        each call) or a guard (``"guard"``); ``kiln.explain`` lists it with the user's line."""
        assert kind in ("input", "guard"), f"a Python read is an input or a guard, not {kind!r}"
        self.python_reads.append(PythonRead(what, kind, user_location(2)))

    def on_size_guard(self, size: int, comparison: str, other: int, result: bool, where: str) -> None:
        """Python compared a size as read (``T <= 16``) with an int: a guard of a dynamic program."""
        self.size_guards.append((size, comparison, other, result, where))

    def on_size_compared(self, what: str) -> None:
        """Python compared a watched size (``dynamic.WatchedSize``): this call's sizes stay static."""
        if self.size_compared is None:
            self.size_compared = what

    def on_guard(self, check, reads) -> None:
        """``state.guard``: keep ``check`` for the specialization, note ``reads`` ((what, kind) pairs)."""
        if check is not None:
            self.checks.append(check)
        for what, kind in reads:
            self.on_python_read(what, kind)

    # ------------------------------------------------------------------ recording ops
    def record(self, prim, inputs, attrs: dict, result) -> None:
        """Dispatch ran ``prim`` eagerly; record the node and bind the result to its output (the
        result is born in this trace: ``on_new_tensor``'s work, done here once for both)."""
        self.born.append(weakref.ref(result))
        # ``value_of``'s first case inline, the one nearly every input takes (a value of this trace at
        # its tensor's version): only another case may break the trace
        values = []
        for t in inputs:
            binding = t._trace
            if binding is not None and binding[0] is self and binding[1] is not None and binding[2] == t._version[0]:
                values.append(binding[1])
                continue
            values.append(self.value_of(t))
            if state.current.get() is not self:  # reading an input broke the trace
                result._trace = (self, None, -1)
                return
        if self.watched_sizes:  # sizes Python computed stay ints in the graph
            from .watched_sizes import plain_ints  # noqa: PLC0415

            attrs = plain_ints(attrs)
        if prim is _PERMUTE and self._undone(values[0], attrs["perm"], result):
            return
        # GraphBuilder.node's work without its copy of ``attrs`` (dispatch's own dict, which the
        # autograd node shares and nobody changes) and its type rule: a few us of each traced op
        builder = self.builder
        out_type = _TYPES.get((result._data.shape, result._dtype, result._device))  # (type_of's hit, inline)
        # The frozen dataclasses' fields set as their ``__init__`` sets them, without its frame (~0.2 us each)
        out = _new(Value)
        _set(out, "id", builder._next_id)
        _set(out, "type", out_type if out_type is not None else type_of(result))
        builder._next_id += 1
        pin = self.pin
        if pin:
            loc = pin[0]
        else:
            loc = user_location(3)
            if pin is not None:
                pin.append(loc)
        node = _new(Node)
        _set(node, "op", prim.name)
        _set(node, "inputs", tuple(values))
        _set(node, "attrs", attrs)
        _set(node, "outputs", (out,))
        _set(node, "loc", loc)
        builder.nodes.append(node)
        result._trace = (self, out, result._version[0])
        if prim is _PERMUTE:
            self._permuted[out] = (attrs["perm"], values[0])

    def _undone(self, value: Value, perm: tuple, result) -> bool:
        """Whether a permute by ``perm`` of ``value`` undoes the permute that made ``value``; then it
        records no node and ``result`` is bound to the value that permute read. (The backward of
        ``x @ W^T`` transposes ``W^T`` back: a Linear looped over T time steps made T such pairs.)"""
        found = self._permuted.get(value)
        if found is None or len(found[0]) != len(perm) or any(found[0][p] != i for i, p in enumerate(perm)):
            return False
        result._trace = (self, found[1], result._version[0])
        return True

    def value_of(self, t) -> Value:
        """The IR value holding ``t``'s current contents (making it an input or constant if new)."""
        binding = t._trace
        if binding is not None:
            owner, value, version = binding
            if owner is self:
                if value is not None and version == t._version[0]:
                    return value
                if t._base is not None:
                    return self._derive_view(t)
                if value is None:
                    return self._constant(t)
                self.break_here("a tensor's memory was changed outside kiln's ops (for example through .numpy())")
                return self._constant(t)
            if owner is self.parent and owner is not None and value is not None and version == t._version[0]:
                return self._from_parent(value, t)
        return self.add_external(t, "capture")

    def is_bound(self, t) -> bool:
        return t._trace is not None and t._trace[0] is self

    def is_born(self, t) -> bool:
        """Made inside this call (bound here and not an external)."""
        return self.is_bound(t) and id(t) not in self._external_index

    def on_numpy(self, array, t, shares_memory: bool, users: bool = True) -> None:
        """``t`` was made from the numpy array ``array``: bind it to a graph input that is the array's
        memory, so each call reads what the array holds then (never a constant of the traced call).
        ``users``: the user's code made the tensor (kiln's own tables follow the shapes: not checked).

        The input is a *shadow* tensor on the array, one per array and compiled function
        (``numpy_shadows``, set by the compiler), which also keeps the array alive: a shadow found
        by identity on later calls is always that same array's memory.
        """
        from ...ir import dtypes as dt  # noqa: PLC0415
        from ..autograd.grad_mode import no_grad  # noqa: PLC0415
        from ..tensor import make_tensor  # noqa: PLC0415

        shadows = getattr(self, "numpy_shadows", None)
        if shadows is None or array.dtype not in dt._BY_NUMPY or t._device.type != "cpu":
            return  # a constant, as before (traces outside kiln.compile, unusual dtypes)
        entry = shadows.get(id(array))
        if entry is None:
            token = state.current.set(None)  # made outside the trace: not a born tensor
            try:
                shadow = make_tensor(array, t._device, dt.from_numpy_dtype(array.dtype))
            finally:
                state.current.reset(token)
            entry = shadows[id(array)] = (array, shadow)
            if users:  # (numpy_inputs.made_in_call looks at these after the call)
                self.new_arrays.append((id(array), user_location(3)))
        shadow = entry[1]
        value = self.value_of(shadow)
        if state.current.get() is not self:
            return
        if shares_memory:  # t is the array's memory too: a view of the shadow, writes go back
            t._base, t._version = shadow, shadow._version
            t._trace = (self, value, t._version[0])
            return
        if t._dtype is not shadow._dtype or tuple(t._data.shape) != tuple(shadow._data.shape):
            with no_grad():
                converted = shadow.to(t._dtype).reshape(tuple(t._data.shape))
            value = self.value_of(converted)
        t._trace = (self, value, t._version[0])

    def add_external(self, t, kind: str, arg_index: int | None = None) -> Value:
        value = self.builder.input(type_of(t))
        index = len(self.externals)
        touched = self.grads.get(id(t))
        grad = touched[1] if touched is not None else t._grad  # .grad as it was before this call changed it
        state = (t._data.shape, t._data.strides, t._dtype, t._requires_grad, grad is not None, hook_state(t))
        self.externals.append(External(t, value, kind, arg_index, state, t.grad_fn))
        self._external_index[id(t)] = index
        root = t._base if t._base is not None else t
        if id(root) in self._written:  # (an input reads the memory as it was when the call began)
            self.break_here("a tensor read after the call changed another tensor sharing its memory in place")
        self._roots.add(root, t._data, index)
        t._trace = (self, value, t._version[0])
        return value

    def _from_parent(self, parent_value: Value, t) -> Value:
        value = self._foreign_index.get(parent_value)
        if value is None:
            value = self._foreign_index[parent_value] = self.builder.input(parent_value.type)
            self.foreign.append(parent_value)
        return value

    def _constant(self, t) -> Value:
        value = self.builder.constant(np.array(t._host(), copy=True), type_of(t), user_location(4))
        t._trace = (self, value, t._version[0])
        return value

    # ------------------------------------------------------------------ views and mutation
    def _anchor(self, t):
        """The tensor whose value ``t``'s value is derived from: its base, or the one external that
        holds ``t``'s memory when the base itself is unknown to the trace (a view of an argument)."""
        base = t._base
        binding = base._trace
        if binding is not None and binding[0] is self:
            return base
        sharing = [self.externals[i].tensor for i in self._roots.members(base)]
        inside = [e for e in sharing if e is not t and contains(e._data, t._data)]
        return inside[0] if len(inside) == 1 else base

    def _derive_view(self, t) -> Value:
        anchor = self._anchor(t)
        out = self._gather(anchor, t)
        t._trace = (self, self.value_of(out), t._version[0])
        return t._trace[1]

    def _gather(self, anchor, view):
        """A born tensor holding ``view``'s elements taken from ``anchor`` (recorded ops)."""
        from ..autograd.grad_mode import no_grad  # noqa: PLC0415
        from ..ops.inplace import gather_positions, view_positions  # noqa: PLC0415

        with no_grad():
            return gather_positions(anchor, view_positions(anchor._data, view._data))

    def on_inplace(self, target, value) -> None:
        """``commit_inplace`` is about to write ``value`` into ``target``: rebind, functionally."""
        new_value = self.value_of(value)
        if state.current.get() is not self:
            return
        version = target._version[0] + 1  # commit_inplace bumps the shared counter after writing
        if not self.is_bound(target):
            # A tensor from before the call whose first use is a write (``G.copy_(x)``, ``p.grad.zero_()``,
            # ``view.fill_(0)``): an external like any other, its new value written back, itself returned.
            self.add_external(target, "capture")
        index = self._external_index.get(id(target))
        # Inputs sharing the written memory would each need the write (a view of a common base
        # that is no input of the trace, as ``a = base.detach()`` and ``b = a.t()`` are, has no
        # input to write back to): the call finishes eagerly.
        root = target._base if target._base is not None else target
        sharing = self._roots.members(root)
        if len(sharing) > 1:
            what = "an input" if index is not None else "a view of an input"
            self.break_here(f"an in-place change of {what} that shares memory with another input")
            return
        if sharing:  # an input's memory (kept alive by the trace: its id stays its own)
            self._written.add(id(root))
        if index is not None or target._base is None:
            target._trace = (self, new_value, version)
            return
        anchor = self._anchor(target)
        updated = self._scatter(anchor, target, value)
        if state.current.get() is not self:
            return
        anchor._trace = (self, self.value_of(updated), version)
        target._trace = (self, new_value, version)

    def _scatter(self, anchor, view, value):
        """A born tensor: ``anchor``'s value with ``view``'s positions replaced by ``value``."""
        from ..autograd.grad_mode import no_grad  # noqa: PLC0415
        from ..ops.inplace import scatter_positions, view_positions  # noqa: PLC0415

        with no_grad():
            return scatter_positions(anchor, view_positions(anchor._data, view._data), value)

    # ------------------------------------------------------------------ the end
    def finish(self, leaves: list, values_only: bool = False) -> TraceResult:
        """Close the trace over the call's flattened results (``values_only``: every tensor result
        is a ``Result`` of its own value, even an external or a tensor returned twice, as the
        gradients a backward returns must be)."""
        self.derived.clear()
        grads: list[ClearGrad | ShareGrad | SetGrad] = []
        new_grads: dict[int, int] = {}  # id(new .grad tensor) -> index of the external it belongs to
        returned = {id(leaf) for leaf in leaves}
        for key, (t, before) in list(self.grads.items()):
            after = t._grad
            # A tensor the call made and does not return (checkpoint's detached inputs, an input made
            # a leaf for its gradient) is gone after the call: its .grad is no state to write back.
            if self.is_born(t) and id(t) not in returned:
                del self.grads[key]  # (nor kept alive by the trace, which would read as an escape)
                continue
            # Unchanged: nothing to do, unless the call set it to None without reading it first (then
            # that .grad is no guard, and a later call may start with one set: it is cleared).
            if after is before and (after is not None or id(t) in self.grad_reads):
                continue
            index = self._external_index.get(id(t))
            if index is None:
                self.add_external(t, "capture")
                index = len(self.externals) - 1
            if after is None:
                grads.append(ClearGrad(index))
            elif id(after) in self._external_index and self.externals[self._external_index[id(after)]].tensor is after:
                grads.append(ShareGrad(index, self._external_index[id(after)]))
            else:
                grads.append(SetGrad(index, self.value_of(after)))
                new_grads[id(after)] = index
        outputs: list = []  # one output kind per leaf
        positions: dict[int, int] = {}
        for position, leaf in enumerate(leaves):
            if not isinstance(leaf, Tensor):
                outputs.append(PythonValue(leaf))
                continue
            if id(leaf) in positions and not values_only:  # one tensor returned twice comes back as one object
                outputs.append(Repeat(positions[id(leaf)]))
                continue
            positions[id(leaf)] = position
            if id(leaf) in new_grads and not values_only:  # a new .grad returned: the same tensor
                outputs.append(NewGrad(new_grads[id(leaf)]))
                continue
            if not values_only and not self.is_bound(leaf) and not self._is_parent_value(leaf):
                self.add_external(leaf, "capture")  # returned untouched: the caller gets the tensor itself
            index = self._external_index.get(id(leaf))
            view = None if values_only or index is not None else self._view_of_external(leaf)
            if index is not None and self.externals[index].tensor is leaf and not values_only:
                outputs.append(ExternalResult(index))
            elif view is not None:
                outputs.append(replace(view, own_value=self.value_of(leaf)))
            else:
                outputs.append(Result(self.value_of(leaf)))
        if not values_only:
            self._share_born_memory(leaves, outputs)
        writebacks = []
        for index, ext in enumerate(self.externals):
            binding = ext.tensor._trace
            current = binding is not None and binding[0] is self and binding[2] == ext.tensor._version[0]
            if not current:  # (``==``: a ``!=`` on a version is a saved tensor's check, ``eager_checks``)
                if ext.tensor._base is not None:
                    continue  # a view of an anchor that is written back
                self.break_here("a tensor's memory was changed outside kiln's ops")
                continue
            if binding[1] is not ext.value:
                writebacks.append(WriteBack(index, binding[1]))
        result = TraceResult(
            self.builder, self.externals, outputs, writebacks, grads,
            list(self.modules.values()), self.prologues,
        )  # fmt: skip
        self._leave()
        return result

    def _share_born_memory(self, leaves: list, outputs: list) -> None:
        """Results that share the memory of a tensor made in the call (``a`` and ``a[0]``, or two
        views of one ``a``) share it in compiled calls too: each becomes a ``BornView`` of one output
        holding the root (laid out as eager's root was)."""
        groups: dict[int, list[int]] = {}
        for position, (leaf, item) in enumerate(zip(leaves, outputs, strict=True)):
            if isinstance(item, Result):
                root = leaf._base if leaf._base is not None else leaf
                groups.setdefault(id(root), []).append(position)
        for members in groups.values():
            first = leaves[members[0]]
            root = first._base if first._base is not None else first
            if len(members) < 2 or not self.is_bound(root) or dense_order(root._data) is None:
                continue
            root_value = self.value_of(root)
            start = root._data.__array_interface__["data"][0]
            for position in members:
                data = leaves[position]._data
                offset = data.__array_interface__["data"][0] - start
                view = (tuple(data.shape), tuple(data.strides), offset)
                outputs[position] = BornView(root_value, tuple(root._data.strides), *view, outputs[position].output)

    def _is_parent_value(self, t) -> bool:
        binding = t._trace
        return binding is not None and self.parent is not None and binding[0] is self.parent

    def _view_of_external(self, t) -> ExternalView | None:
        """An ``ExternalView`` when the result ``t`` shares an external's memory, as eager's result
        would: the compiled call returns the same view."""
        if t._base is None:
            return None
        for index in self._roots.members(t._base):
            e = self.externals[index].tensor
            if contains(e._data, t._data) and e._device is t._device and e._dtype is t._dtype:
                offset = t._data.__array_interface__["data"][0] - e._data.__array_interface__["data"][0]
                return ExternalView(index, tuple(t._data.shape), tuple(t._data.strides), offset)
        return None
