"""The calling convention of a compiled program: where its inputs come from and what its outputs become.

Like torch.export's graph signature, a ``Signature`` says per graph input where a call reads it
(the *input kinds*: an argument, a captured tensor, an exported parameter, a backward's seed
gradient or saved forward value) and per flattened result leaf how a call produces it (the
*output kinds*), with the inputs the call mutates (written back) and the ``.grad`` values it sets.
A compiled call (``Specialization.run``), the compiled backward (``CompiledBackward.apply``) and an
exported program (``ExportedProgram.__call__``) all run their program the same way:

>>> import kiln
>>> from kiln.ir.types import CPU
>>> sig = Signature([Argument(0)], [Result(0), ExternalResult(0), Repeat(0)], devices=(CPU,))
>>> x = kiln.ones(2)
>>> arrays = bind(sig, [x])  # the program's inputs
>>> a, b, c = apply(sig, [arrays[0] + 1], arrays, [x])  # its outputs -> the call's results
>>> a.tolist(), b is x, c is a
([2.0, 2.0], True, True)

While a trace is turned into a graph (``TraceResult`` in ``trace.py``) the output kinds hold IR
``Value``s where a signature holds graph output indices; ``number_outputs`` makes the graph's
output list and the signature from them.

Ownership, as eager's: every tensor ``apply`` hands out owns its memory unless eager's would
share it. An output that is an input's memory, or memory already handed out in this call (one
value returned twice), is copied (``claim``); results that share memory made in the call (``a``
and ``a[0]``) share one buffer (``BornView``); results that are inputs or their views are the
input tensors themselves; mutated inputs are written back after the results are made, reading a
new value that is another input's memory before any write-back, and bump their version counters.
"""

from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass, field, replace
from operator import attrgetter, is_, methodcaller
from typing import Any, ClassVar

import numpy as np

from ...ir.graph import Value
from ..tensor import make_tensor
from . import state as _jit
from .layouts import in_layout

# f -> f() in C: operator.call (Python 3.11+) dereferences a weak reference in 20 ns, the
# methodcaller of older Pythons in 75 ns (an optimizer step's guards dereference 500 a call, 3 times)
call = getattr(operator, "call", None) or methodcaller("__call__")

# A graph output's index; the IR Value itself while a trace is being numbered (number_outputs
# turns the one into the other), so its static type is Any.
Output = Any


# ---------------------------------------------------------------------- input kinds
@dataclass(frozen=True)
class Argument:
    """The tensor at ``position`` in the call's flattened arguments."""

    position: int
    kind: ClassVar[str] = "arg"

    @property
    def name(self) -> str:
        return f"argument {self.position}"

    def tensor(self, arguments, parameters):
        return arguments[self.position]


@dataclass(frozen=True)
class Captured:
    """A tensor the function reads from outside its arguments (a module's parameter, a tensor in a
    closure, optimizer state), held weakly; ``snapshot`` is its (shape, strides, dtype,
    requires_grad, .grad is set, hooks) when traced, which the guards compare."""

    ref: weakref.ref
    snapshot: tuple = ()
    name: str = ""
    kind: ClassVar[str] = "capture"

    def tensor(self, arguments, parameters):
        return self.ref()


@dataclass(frozen=True)
class Parameter:
    """An exported program's own tensor, by its name in ``ExportedProgram.parameters``."""

    name: str
    kind: ClassVar[str] = "param"

    def tensor(self, arguments, parameters):
        return parameters[self.name]


@dataclass(frozen=True)
class Seed:
    """A compiled backward's incoming gradient for differentiable result ``index`` (an array)."""

    index: int
    kind: ClassVar[str] = "seed"


@dataclass(frozen=True)
class Saved:
    """A forward value the compiled backward reads: entry ``index`` of what the forward saved (an array)."""

    index: int
    kind: ClassVar[str] = "saved"


InputKind = Argument | Captured | Parameter | Seed | Saved


# ---------------------------------------------------------------------- output kinds
@dataclass(frozen=True)
class Result:
    """A new tensor holding graph output ``output``."""

    output: Output
    kind: ClassVar[str] = "value"


@dataclass(frozen=True)
class BornView:
    """A view (shape, byte strides, byte offset) of the tensor made from graph output ``output``
    laid out with ``root_strides``: results that share memory made in the call (``a`` and ``a[0]``)
    share it in compiled calls too. ``own_value``: the view's own IR value, while tracing (for a
    consumer that returns views as values of their own)."""

    output: Output
    root_strides: tuple
    shape: tuple
    strides: tuple
    offset: int
    own_value: Value | None = None
    kind: ClassVar[str] = "born_view"


@dataclass(frozen=True)
class ExternalResult:
    """Input ``input``'s tensor itself (returned untouched, or after an in-place change)."""

    input: int
    kind: ClassVar[str] = "external"

    def rebuild(self, sig: Signature, results: list, arguments, parameters):
        return sig.tensor(self.input, arguments, parameters)


@dataclass(frozen=True)
class ExternalView:
    """A view of input ``input``'s memory (shape, byte strides, byte offset), sharing its version
    counter, as eager's result would. ``own_value`` as for ``BornView``."""

    input: int
    shape: tuple
    strides: tuple
    offset: int
    own_value: Value | None = None
    kind: ClassVar[str] = "view"

    def rebuild(self, sig: Signature, results: list, arguments, parameters):
        return view_of(sig.tensor(self.input, arguments, parameters), self.shape, self.strides, self.offset)


@dataclass(frozen=True)
class NewGrad:
    """The ``.grad`` the call set on input ``input``: the same tensor, as eager returns it."""

    input: int
    kind: ClassVar[str] = "grad"

    def rebuild(self, sig: Signature, results: list, arguments, parameters):
        return sig.tensor(self.input, arguments, parameters)._grad


@dataclass(frozen=True)
class Repeat:
    """The same object as the result leaf at ``position`` (one tensor returned twice)."""

    position: int
    kind: ClassVar[str] = "same"

    def rebuild(self, sig: Signature, results: list, arguments, parameters):
        return results[self.position]


@dataclass(frozen=True)
class PythonValue:
    """A plain Python value the traced call returned (the same on every call)."""

    value: object
    kind: ClassVar[str] = "python"

    def rebuild(self, sig: Signature, results: list, arguments, parameters):
        return self.value


ResultKind = Result | BornView | ExternalResult | ExternalView | NewGrad | Repeat | PythonValue


@dataclass(frozen=True)
class WriteBack:
    """Input ``input`` was changed in place: graph output ``output`` is written into its memory."""

    input: int
    output: Output
    kind: ClassVar[str] = "writeback"


@dataclass(frozen=True)
class SetGrad:
    """Input ``input``'s ``.grad`` becomes a new tensor holding graph output ``output``."""

    input: int
    output: Output
    kind: ClassVar[str] = "set_grad"


@dataclass(frozen=True)
class ShareGrad:
    """Input ``input``'s ``.grad`` becomes input ``source``'s tensor (``p.grad = q``)."""

    input: int
    source: int
    kind: ClassVar[str] = "share_grad"


@dataclass(frozen=True)
class ClearGrad:
    """Input ``input``'s ``.grad`` becomes None."""

    input: int
    kind: ClassVar[str] = "clear_grad"


GradKind = SetGrad | ShareGrad | ClearGrad


# ---------------------------------------------------------------------- the signature
@dataclass(eq=False)
class Signature:
    """How a program is called: ``inputs`` per graph input, ``results`` per flattened result leaf,
    the ``writebacks`` and ``.grad`` assignments of each call, and per graph output the device of
    the tensors made from it."""

    inputs: list[InputKind]
    results: list[ResultKind]
    writebacks: list[WriteBack] = field(default_factory=list)
    grads: list[GradKind] = field(default_factory=list)
    devices: tuple = ()

    def __post_init__(self) -> None:
        # Per-kind lists, so that a call loops only over what it has to do.
        inputs = list(enumerate(self.inputs))
        self._arguments = [(i, s.position) for i, s in inputs if isinstance(s, Argument)]
        self._captured = [(i, s.ref) for i, s in inputs if isinstance(s, Captured)]
        self._only_captured = bool(inputs) and len(self._captured) == len(inputs)
        self._captured_refs = [ref for _, ref in self._captured]
        self._parameters = [(i, s.name) for i, s in inputs if isinstance(s, Parameter)]
        self._seeds = [(i, s.index) for i, s in inputs if isinstance(s, Seed)]
        self._saved = [(i, s.index) for i, s in inputs if isinstance(s, Saved)]
        # The results the program makes, (position, output, device, born view or None); the rest
        # (inputs, their views, new .grad values, repeats, plain values) are made after the write-backs.
        self._made = [
            (position, r.output, self.devices[r.output],
             (r.root_strides, r.shape, r.strides, r.offset) if isinstance(r, BornView) else None)
            for position, r in enumerate(self.results) if isinstance(r, Result | BornView)
        ]  # fmt: skip
        self._late = [(position, r) for position, r in enumerate(self.results) if not isinstance(r, Result | BornView)]
        self._new_grads = [(g.output, self.devices[g.output]) for g in self.grads if isinstance(g, SetGrad)]
        # Write-backs into captured tensors alone (an optimizer step): their weak references, in order.
        written = [self.inputs[w.input] for w in self.writebacks]
        self._written_refs = [s.ref for s in written] if all(isinstance(s, Captured) for s in written) else None  # type: ignore[union-attr]  # all Captured: checked
        self._written_outputs = [w.output for w in self.writebacks]

    def tensor(self, index: int, arguments, parameters=None):
        """The tensor input ``index`` reads at a call with these arguments (and parameters)."""
        return self.inputs[index].tensor(arguments, parameters)  # type: ignore[union-attr]  # asked of a forward input only


def bind(signature: Signature, arguments=(), parameters=None, seeds=(), saved=()) -> list:
    """The program's input arrays for a call: ``arguments`` are the call's flattened arguments,
    ``parameters`` an exported program's tensors by name, ``seeds`` and ``saved`` a backward's arrays."""
    if _jit.tracing:
        _reads_outside_ops()
    if signature._only_captured:  # an optimizer step's hundreds of tensors: in C loops
        return list(map(_DATA, map(call, signature._captured_refs)))
    arrays: list = [None] * len(signature.inputs)
    for i, position in signature._arguments:
        arrays[i] = arguments[position]._data
    for i, ref in signature._captured:
        arrays[i] = ref()._data  # type: ignore[union-attr]  # a freed capture fails the guards first
    for i, name in signature._parameters:
        arrays[i] = parameters[name]._data
    for i, k in signature._seeds:
        arrays[i] = seeds[k]
    for i, k in signature._saved:
        arrays[i] = saved[k]
    return arrays


def _reads_outside_ops() -> None:
    """A program is about to read its tensors' memory directly: a trace running now would see none
    of it (it would freeze what the program returns into constants), so the trace stops here."""
    trace = _jit.current.get()
    if trace is not None:
        trace.break_here("a compiled program reads its tensors' memory outside kiln's ops")


def apply(signature: Signature, outputs: list, arrays: list, arguments=(), parameters=None, *,
          fresh: bool = False) -> list:  # fmt: skip
    """The flattened results of a call whose program read ``arrays`` and returned ``outputs``, after
    writing mutated inputs back and setting the ``.grad`` values the call sets (see the module's
    docstring for who owns which memory). ``fresh``: every result and new ``.grad`` the program
    makes is new memory of its own (``made_fresh``), so none is an input's."""
    sig = signature
    # the memory owners are read only when something could be an input's memory (results, new grads)
    owned = owned_memory(arrays) if (sig._made or sig._new_grads) and not fresh else None
    claimed = set(owned) if sig.writebacks and owned is not None else owned  # the write-backs read the inputs' alone
    if claimed is None:
        claimed = set()  # what this call hands out (a fresh output's views must be copies)
    results: list = [None] * len(sig.results)
    roots: dict[int, object] = {}  # output index -> the tensor that results sharing its memory view
    for position, output, device, view in sig._made:
        if view is None:
            results[position] = claim(outputs[output], claimed, device)
            continue
        root = roots.get(output)
        if root is None:
            root = roots[output] = claim(in_layout(outputs[output], view[0]), claimed, device)
        results[position] = view_of(root, *view[1:])
    new_grads = [claim(outputs[output], claimed, device) for output, device in sig._new_grads]
    if sig.writebacks:
        _write_back(sig, outputs, arrays, owned, arguments, parameters)
    if sig.grads:
        _set_grads(sig, iter(new_grads), arguments, parameters)
    for position, r in sig._late:
        results[position] = r.rebuild(sig, results, arguments, parameters)
    return results


def made_fresh(signature: Signature, fresh_outputs: frozenset) -> bool:
    """Whether every result and new ``.grad`` the program makes is one of its ``fresh_outputs``
    (memory it allocated in the call and hands out once): ``apply``'s ``fresh``."""
    made = [output for _, output, _, _ in signature._made] + [output for output, _ in signature._new_grads]
    return bool(made) and all(output in fresh_outputs for output in made)


def _write_back(sig: Signature, outputs: list, arrays: list, owned: set[int] | None, arguments, parameters) -> None:
    refs = sig._written_refs
    if refs is not None:
        # The usual optimizer step: the program wrote every captured tensor in place; only the
        # version counters move.
        tensors = list(map(call, refs))
        if all(map(is_, map(outputs.__getitem__, sig._written_outputs), map(_DATA, tensors))):
            for version in map(_VERSION, tensors):
                version[0] += 1
            return
    # A new value that is another input's memory (``a.copy_(b)`` before ``b`` changes) is read
    # before any write-back writes that memory.
    updates = []
    for w in sig.writebacks:
        t, array = sig.tensor(w.input, arguments, parameters), outputs[w.output]
        if array is not t._data:
            owned = owned_memory(arrays) if owned is None else owned
            if id(_root(array)) in owned:
                array = array.copy()
        updates.append((t, array))
    for t, array in updates:
        if array is not t._data:  # else the program wrote it in place
            t._data[...] = array
        t._version[0] += 1


_DATA, _VERSION = attrgetter("_data"), attrgetter("_version")


def _set_grads(sig: Signature, new_grads, arguments, parameters) -> None:
    for g in sig.grads:
        t = sig.tensor(g.input, arguments, parameters)
        if isinstance(g, SetGrad):
            t._grad = next(new_grads)
        elif isinstance(g, ShareGrad):
            t._grad = sig.tensor(g.source, arguments, parameters)
        else:
            t._grad = None


# ---------------------------------------------------------------------- from a trace
def number_outputs(inputs: list, results: list, writebacks=(), grads=(), *, views: bool = True):
    """``(Signature, graph outputs)`` from a trace's kinds, which hold IR values where a signature
    holds output indices: the graph outputs the results' values, then the values written back, then
    the new ``.grad`` values. Results that view one root share one output. Without ``views`` every
    view is a value of its own (export returns copies)."""
    outputs: list[Value] = []

    def output(value: Value) -> int:
        outputs.append(value)
        return len(outputs) - 1

    roots: dict[Value, int] = {}
    numbered = []
    for r in results:
        if isinstance(r, Result):
            r = Result(output(r.output))
        elif isinstance(r, BornView | ExternalView) and not views:
            r = Result(output(r.own_value))  # type: ignore[arg-type]  # a view made while tracing has its own value
        elif isinstance(r, BornView):
            root = roots.get(r.output)
            if root is None:
                root = roots[r.output] = output(r.output)
            r = replace(r, output=root, own_value=None)
        elif isinstance(r, ExternalView):
            r = replace(r, own_value=None)
        numbered.append(r)
    numbered_writebacks = [WriteBack(w.input, output(w.output)) for w in writebacks]
    numbered_grads = [SetGrad(g.input, output(g.output)) if isinstance(g, SetGrad) else g for g in grads]
    devices = tuple(v.type.device for v in outputs)
    return Signature(list(inputs), numbered, numbered_writebacks, numbered_grads, devices), outputs


# ---------------------------------------------------------------------- memory
def _root(array):
    """The array that owns ``array``'s memory."""
    # numpy's ndarray (subclasses included) or cupy's: a base of another kind owns no array memory
    kind = np.ndarray if isinstance(array, np.ndarray) else array.__class__
    while isinstance(array.base, kind):
        array = array.base
    return array


def owned_memory(arrays: list) -> set[int]:
    """The memory owners of a program's input arrays (see ``claim``)."""
    return {id(_root(a)) for a in arrays}


def claim(array, claimed: set[int], device):
    """A new tensor on ``array``, copied when its memory is already ``claimed`` (an input's, or
    handed out earlier in this call) or when it is read-only (a broadcast view); its memory is
    claimed from then on."""
    if array.__class__ is not np.ndarray and device.type == "cpu":
        array = np.asarray(array)
    owner = array.base is None  # memory of its own: writeable (the program copies out its constants)
    root = id(array if owner else _root(array))
    # cupy's arrays have no read-only flag: none of them is read-only
    if root in claimed or not (owner or getattr(array.flags, "writeable", True)):
        array = array.copy(order="K")
        root = id(array)
    claimed.add(root)
    return make_tensor(array, device)


class _Interface:
    """Exposes a strided window of memory to numpy; holds the owning array alive."""

    def __init__(self, owner, pointer: int, shape: tuple, strides: tuple) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "data": (pointer, False), "shape": shape, "strides": strides, "typestr": owner.dtype.str, "version": 3,
        }  # fmt: skip


def view_of(tensor, shape: tuple, strides: tuple, offset: int):
    """A tensor viewing ``tensor``'s memory at ``offset`` bytes with ``shape``/``strides`` (in bytes),
    sharing its version counter: the view an eager call would have returned."""
    data = tensor._data
    pointer = data.__array_interface__["data"][0] + offset
    out = make_tensor(np.asarray(_Interface(data, pointer, shape, strides)), tensor._device, tensor._dtype)
    out._version = tensor._version
    out._base = tensor._base if tensor._base is not None else tensor
    return out
