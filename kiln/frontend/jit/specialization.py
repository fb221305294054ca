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
from ..tensor import Tensor, make_tensor
from .layouts import in_layout
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
    out_leaves: list  # ("value", i) | ("born_view", i, root strides, shape, strides, offset) | ("external", k)
    #                   | ("view", k, shape, strides, offset) | ("grad", k) | ("same", earlier leaf) | ("python", v)
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
    arg_aliases: list = field(default_factory=list)  # (argument position, weakref): arguments that are state
    guards: object = None  # hazards.Guards: attributes of the objects read, containers of captured tensors
    calls: int = 0

    def __post_init__(self) -> None:
        # The results the program makes, (position, output, device, born view or None), and those
        # made after the write-backs: tensors from before the call, their views, new .grad values,
        # repeats and plain values.
        self._made_results = [
            (position, payload, self.graph.outputs[payload].type.device, tuple(view) if kind == "born_view" else None)
            for position, (kind, payload, *view) in enumerate(self.out_leaves) if kind in ("value", "born_view")
        ]  # fmt: skip
        self._late_results = [(position, kind, payload, view) for position, (kind, payload, *view)
                              in enumerate(self.out_leaves) if kind not in ("value", "born_view")]  # fmt: skip

    # ------------------------------------------------------------------ guards
    def state_miss(self, fn_globals: dict | None, closure_values: dict, leaves: list) -> str | None:
        """Why the captured state no longer matches this specialization (None when it does)."""
        for position, ref in self.arg_aliases:
            if leaves[position] is not ref():
                return f"argument {position} is no longer the tensor that the function also reads as state"
        arg_roots = None
        for source in self.sources:
            if source.kind != "capture":
                continue
            t = source.ref()
            if t is None:
                return f"captured tensor {source.name} was freed"
            now = tensor_state(t)
            if now != source.snapshot:
                return f"captured tensor {source.name} changed: {_describe_state(source.snapshot, now)}"
            if arg_roots is None:
                arg_roots = {id(a._base if a._base is not None else a) for a in leaves if isinstance(a, Tensor)}
            if id(t._base if t._base is not None else t) in arg_roots:
                return f"an argument shares memory with captured tensor {source.name}"
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
        # Every tensor handed out owns its memory unless eager's would share it: an output that is
        # an input's memory (read before its write-back below), or memory already handed out in
        # this call (one value returned twice after the passes merged two results), is copied.
        owned = owned_memory(arrays)
        claimed = set(owned) if self.writebacks else owned
        results: list = [None] * len(self.out_leaves)  # the rest are made after the write-backs
        roots: dict[int, object] = {}  # output index -> the tensor that results sharing its memory view
        for position, payload, device, view in self._made_results:
            if view is None:
                results[position] = claim(outputs[payload], claimed, device)
                continue
            root = roots.get(payload)
            if root is None:
                root = roots[payload] = claim(in_layout(outputs[payload], view[0]), claimed, device)
            results[position] = view_of(root, *view[1:])
        grads = []
        for index, action in self.grads:
            if action is not None and action[0] == "value":
                device = self.external(index, leaves)._device
                grads.append(claim(outputs[action[1]], claimed, device))
            else:
                grads.append(None)
        # A new value that is another input's memory (``a.copy_(b)`` before ``b`` changes) is read
        # before any write-back writes that memory.
        updates = []
        for index, out in self.writebacks:
            t, array = self.external(index, leaves), outputs[out]
            if array is not t._data and id(_root(array)) in owned:
                array = array.copy()
            updates.append((t, array))
        for t, array in updates:
            if array is not t._data:  # else the program wrote it in place
                t._data[...] = array
            t._version[0] += 1
        for (index, action), grad in zip(self.grads, grads, strict=True):
            t = self.external(index, leaves)
            if action is None:
                t._grad = None
            elif action[0] == "external":
                t._grad = self.external(action[1], leaves)
            else:
                t._grad = grad
        for position, kind, payload, view in self._late_results:
            if kind == "external":
                results[position] = self.external(payload, leaves)
            elif kind == "view":
                results[position] = view_of(self.external(payload, leaves), *view[:3])
            elif kind == "grad":
                results[position] = self.external(payload, leaves)._grad
            elif kind == "same":
                results[position] = results[payload]
            elif kind == "python":
                results[position] = payload
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
    """The memory owners of a program's input arrays (see ``claim``)."""
    return {id(_root(a)) for a in arrays}


def claim(array, claimed: set[int], device):
    """A new tensor on ``array``, copied when its memory is already ``claimed`` (an input's, or
    handed out earlier in this call) or when it is read-only (a broadcast view); its memory is
    claimed from then on."""
    if array.__class__ is not np.ndarray:
        array = np.asarray(array)
    owner = array.base is None  # memory of its own: writeable (the program copies out its constants)
    root = id(array if owner else _root(array))
    if root in claimed or not (owner or array.flags.writeable):
        array = np.array(array, order="K")
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
