"""One compiled specialization: the graph of one traced call, its guards, and how to run it.

Running a specialization reads every external (arguments by position, captured tensors through
weak references), runs the program, writes mutated externals back into their memory (bumping
their version counters, as the in-place ops would have), sets the ``.grad`` values the call
left behind, and rebuilds the nested result. When the result needs gradients, a
``CompiledBackward`` node (see ``backward.py``) connects it to the externals' autograd edges.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

from ...ir.graph import Graph
from ..tensor import make_tensor
from .pytree import unflatten


@dataclass
class Source:
    """Where one graph input comes from at run time."""

    kind: str  # "arg" | "capture"
    arg_index: int = -1
    ref: weakref.ref | None = None
    snapshot: tuple = ()  # (shape, strides, dtype, requires_grad, has_grad) when traced
    name: str = ""


def tensor_state(t) -> tuple:
    return (t._data.shape, t._data.strides, t._dtype, t._requires_grad, t._grad is not None)


@dataclass
class Specialization:
    """A traced call, ready to run on calls whose guards match."""

    graph: Graph
    program: object  # runs the graph: program(list of arrays) -> list of arrays
    sources: list[Source]
    out_tree: object
    out_leaves: list  # ("value", i) | ("external", k) | ("python", v)
    writebacks: list[tuple[int, int]]  # (external index, output index)
    grads: list[tuple[int, object]]  # (external index, None | ("external", k) | ("value", i))
    modules: list[tuple[weakref.ref, bool, str]]
    prologues: list
    globals_guard: list[tuple[str, object]]
    backward: object = None  # a BackwardPlan when the results carry gradients
    key: tuple = ()
    passes_record: list = field(default_factory=list)
    traced_graph: Graph | None = None
    report: object = None  # the backend's LoweringReport (kernels, declined kernels, memory plan)
    fresh_outputs: frozenset = frozenset()  # output indices the program always allocates anew
    guards: object = None  # hazards.Guards: attributes of the objects read, containers of captured tensors
    calls: int = 0

    # ------------------------------------------------------------------ guards
    def state_miss(self, fn_globals: dict | None, closure_values: dict) -> str | None:
        """Why the captured state no longer matches this specialization (None when it does)."""
        for source in self.sources:
            if source.kind != "capture":
                continue
            t = source.ref()
            if t is None:
                return f"captured tensor {source.name} was freed"
            now = tensor_state(t)
            if now != source.snapshot:
                return f"captured tensor {source.name} changed: {_describe_state(source.snapshot, now)}"
        for ref, training, name in self.modules:
            module = ref()
            if module is None:
                return f"module {name} was freed"
            if module.training != training:
                return f"module {name}.training changed from {training} to {module.training}"
        for name, value in self.globals_guard:
            now = closure_values.get(name, _MISSING) if name.startswith("closure:") else (
                fn_globals.get(name, _MISSING) if fn_globals is not None else _MISSING)  # fmt: skip
            if not _same(now, value):
                return f"{name.removeprefix('closure:')} now refers to a different object ({_short(now)})"
        if self.guards is not None:
            return self.guards.miss()
        return None

    # ------------------------------------------------------------------ running
    def inputs(self, leaves: list) -> list:
        return [(leaves[s.arg_index] if s.kind == "arg" else s.ref())._data for s in self.sources]

    def external(self, index: int, leaves: list):
        s = self.sources[index]
        return leaves[s.arg_index] if s.kind == "arg" else s.ref()

    def run(self, leaves: list):
        for fn, args, kwargs in self.prologues:
            fn(*args, **kwargs)
        arrays = self.inputs(leaves)
        outputs = self.program(arrays)
        owned = owned_memory(arrays)
        for index, out in self.writebacks:
            t = self.external(index, leaves)
            if outputs[out] is not t._data:  # else the program wrote it in place
                t._data[...] = outputs[out]
            t._version[0] += 1
        for index, action in self.grads:
            t = self.external(index, leaves)
            if action is None:
                t._grad = None
            elif action[0] == "external":
                t._grad = self.external(action[1], leaves)
            else:
                t._grad = fresh_tensor(outputs[action[1]], owned, t._device)
        results = []
        fresh = self.fresh_outputs
        for kind, payload, *view in self.out_leaves:
            if kind == "value":
                device = self.graph.outputs[payload].type.device
                if payload in fresh:  # memory the program allocated for this call
                    results.append(make_tensor(outputs[payload], device))
                else:
                    results.append(fresh_tensor(outputs[payload], owned, device))
            elif kind == "external":
                results.append(self.external(payload, leaves))
            elif kind == "same":
                results.append(results[payload])
            elif kind == "view":
                results.append(view_of(self.external(payload, leaves), *view[:3]))
            else:
                results.append(payload)
        if self.backward is not None:
            self.backward.attach(self, results, outputs, leaves)
        self.calls += 1
        return unflatten(self.out_tree, results)


_MISSING = object()


def _root(array):
    """The array that owns ``array``'s memory."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def owned_memory(arrays: list) -> set[int]:
    """The memory owners of a program's input arrays (see ``fresh_tensor``)."""
    return {id(_root(a)) for a in arrays}


def fresh_tensor(array, owned: set[int], device):
    """A new tensor on ``array``, copied when the array is an input's memory or a view of it (the
    program passed an input through): a result never aliases an argument unless eager's would."""
    if id(_root(array)) in owned:
        array = array.copy()
    elif not isinstance(array, np.ndarray):
        array = np.asarray(array)
    return make_tensor(array, device)


class _Interface:
    """Exposes a strided window of memory to numpy; holds the owning array alive."""

    def __init__(self, owner, pointer: int, shape: tuple, strides: tuple) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "data": (pointer, False), "shape": shape, "strides": strides, "typestr": owner.dtype.str, "version": 3,
        }  # fmt: skip


def view_of(external, shape: tuple, strides: tuple, offset: int):
    """A tensor viewing ``external``'s memory at ``offset`` bytes with ``shape``/``strides`` (in bytes),
    sharing its version counter: the view an eager call would have returned."""
    data = external._data
    pointer = data.__array_interface__["data"][0] + offset
    out = make_tensor(np.asarray(_Interface(data, pointer, shape, strides)), external._device, external._dtype)
    out._version = external._version
    out._base = external._base if external._base is not None else external
    return out


def _same(a, b) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, bool | int | str | bytes | type(None)):
        return a == b
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    return False


def _short(value) -> str:
    text = repr(value) if not hasattr(value, "_data") else f"tensor of shape {tuple(value._data.shape)}"
    return text if len(text) < 60 else text[:57] + "..."


def _describe_state(before: tuple, after: tuple) -> str:
    names = ("shape", "strides", "dtype", "requires_grad", ".grad is set")
    parts = [f"{n} {b} -> {a}" for n, b, a in zip(names, before, after, strict=True) if b != a]
    return ", ".join(parts)
