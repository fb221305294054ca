"""One compiled specialization: the graph of one traced call, its guards, and how to run it.

Running a specialization binds its inputs (arguments by position, captured tensors through weak
references), runs the program, and applies its outputs (``signature.py``): mutated externals are
written back into their memory (bumping their version counters, as the in-place ops would have),
the ``.grad`` values the call left behind are set, and the nested result is rebuilt. When the
result needs gradients, a ``CompiledBackward`` node (see ``backward.py``) connects it to the
externals' autograd edges.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter, is_, is_not
from typing import TYPE_CHECKING

from ...ir.graph import Graph, SourceLocation
from ..autograd.node import RemovableHandle, hook_state
from ..tensor import Tensor, make_tensor
from .layouts import memory_owner, overlaps
from .pytree import unflatten
from .scalar_args import as_inputs
from .signature import Argument, Captured, Signature, apply, bind, call, made_fresh
from .snapshots import ANY_FLOAT

if TYPE_CHECKING:
    from ...codegen.backend import Program
    from .backward import BackwardPlan
    from .guards import Guards


@dataclass(frozen=True)
class PythonRead:
    """One Python value a specialization depends on, for ``kiln.explain``'s table: ``what`` in words
    (``cfg['scale'] == 2.0``), ``kind`` ``"input"`` (read on each call) or ``"guard"`` (checked on each
    call; a change makes a new trace), and the user's line that read it (None where unknown).
    Whatever makes a Python value a graph input or a guard appends a record to
    ``Specialization.python_reads``."""

    what: str
    kind: str
    loc: SourceLocation | None = None

    def __str__(self) -> str:
        return f"{self.kind:<5}  {self.what}{f'  (read at {self.loc})' if self.loc is not None else ''}"


def tensor_state(t) -> tuple:
    return (t._data.shape, t._data.strides, t._dtype, t._requires_grad, t._grad is not None, hook_state(t))


# ``tensor_state`` over many tensors in C: the first four fields, then whether ``.grad`` is set
_LAYOUT = attrgetter("_data.shape", "_data.strides", "_dtype", "_requires_grad")
_GRAD, _BASE = attrgetter("_grad"), attrgetter("_base")
_DATA, _REQUIRES_GRAD = attrgetter("_data"), attrgetter("_requires_grad")
_NOT_NONE = partial(is_not, None)


@dataclass
class Specialization:
    """A traced call, ready to run on calls whose guards match."""

    graph: Graph
    program: Program  # runs the graph: program(list of arrays) -> list of arrays
    signature: Signature  # its inputs are Argument and Captured kinds, one per external of the trace
    out_tree: object
    modules: list[tuple[weakref.ref, bool, str]]
    prologues: list
    globals_guard: list[tuple[str, object]]
    backward: BackwardPlan | None = None  # when the results carry gradients
    key: tuple = ()
    passes_record: list = field(default_factory=list)
    traced_graph: Graph | None = None
    report: object = None  # the backend's LoweringReport (kernels, declined kernels, memory plan)
    arg_aliases: list = field(default_factory=list)  # (argument position, weakref): arguments that are state
    # (argument position, hook_state): arguments whose hooks a backward inside the call ran (the key
    # holds how many hooks an argument has; these must be the very ones)
    arg_hooks: list = field(default_factory=list)
    guards: Guards | None = None  # the Python containers and attributes read, paths to captured tensors
    checks: list = field(default_factory=list)  # state.guard's checks: None while they hold, else why not
    python_reads: list[PythonRead] = field(default_factory=list)  # the Python values it reads per call or guards
    calls: int = 0
    background_seconds: float | None = None  # from the trace to ready, when compiled in the background
    sizes_source: Graph | tuple | None = (
        None  # the traced graph(s) a trace at other sizes is compared with (dynamic.py)
    )
    dynamic: list[tuple[int, int]] | None = None  # (argument position, dim) of each symbolic size, if any
    size_guards: list = field(default_factory=list)  # watched_sizes.SizeGuard: comparisons its sizes keep
    not_dynamic: str | None = None  # why a trace at other sizes did not make it dynamic
    scalar_arguments: tuple[int, ...] = ()  # leaf positions of the float arguments it reads (scalar_args.py)
    scalar_program: tuple | None = None  # (traced graph, Python results): what another value's trace must match
    # floats of Python state it reads through holders (state_floats.py): (id of the dict or list, key) each,
    # and the holders' names by their ids
    state_float_slots: frozenset = frozenset()
    state_float_names: dict = field(default_factory=dict)
    value_guards: list = field(default_factory=list)  # float_guards.FloatGuard: comparisons its dynamic floats keep

    def __post_init__(self) -> None:
        self._captured = [s for s in self.signature.inputs if isinstance(s, Captured)]
        self._refs = [s.ref for s in self._captured]
        self._layouts = [s.snapshot[:4] for s in self._captured]
        self._requires_grad = [s.snapshot[3] for s in self._captured]
        # whether .grad is set, for the captured tensors whose .grad the call read (None: not guarded)
        self._grad_positions = [k for k, s in enumerate(self._captured) if s.snapshot[4] is not None]
        self._grads = [self._captured[k].snapshot[4] for k in self._grad_positions]
        # Their hooks (a compiled call would not run one registered later): compared whenever a hook
        # was registered or removed anywhere since the last matching call (-1: at the first call)
        self._hooks = [s.snapshot[5] for s in self._captured]
        self._hooks_seen = -1
        self._all_grads = len(self._grads) == len(self._captured)
        self._nones = [None] * len(self._captured)
        self._matched_arrays: list | None = None  # weak references to the arrays of the last matching call
        self._captured_ids: frozenset[int] | None = None  # see ``_ids_of``
        # the positions of the captured arrays of the last matching call by the id of their memory's owner
        self._owners: dict[int, list[int]] | None = None
        self._fresh_results = _fresh_results(self.signature, self.program.fresh_outputs)
        # every result the program makes is new memory (a training step's loss): ``apply`` need not
        # find the inputs' memory owners to tell whether one of them is an input's
        self._made_fresh = made_fresh(self.signature, self.program.fresh_outputs)
        # Every input an argument or a captured tensor: the call's key holds each argument's shape,
        # strides and dtype, and the guards compared every captured tensor's (``_captures_match``)
        # before each run, so the program need not check them again.
        self._inputs_checked = all(isinstance(s, Argument | Captured) for s in self.signature.inputs)

    @property
    def sources(self) -> list:
        """Where each graph input comes from (the signature's input kinds)."""
        return self.signature.inputs

    def external(self, index: int, leaves: list):
        """The tensor graph input ``index`` reads at a call with these flattened arguments."""
        return self.signature.tensor(
            index, as_inputs(leaves, self.scalar_arguments) if self.scalar_arguments else leaves
        )

    # ------------------------------------------------------------------ guards
    def state_miss(self, fn_globals: dict | None, closure_values: dict, leaves: list) -> str | None:
        """Why the captured state no longer matches this specialization (None when it does)."""
        miss = self.miss_before_values(leaves)
        if miss is not None:
            return miss
        for name, value in self.globals_guard:
            now = closure_values.get(name, _MISSING) if name.startswith("closure:") else (
                fn_globals.get(name, _MISSING) if fn_globals is not None else _MISSING)  # fmt: skip
            if not same_global(now, value):
                return f"{name.removeprefix('closure:')} now refers to a different object ({_short(now)})"
        miss = self.guards.miss() if self.guards is not None else None
        return miss if miss is not None else first_miss(self.value_guards, leaves)

    def miss_before_values(self, leaves: list) -> str | None:
        """Why this call misses for anything but the Python values that the names the function reads
        and its guards compare: its tensors, modules' training flags, ``kiln.jit.guard`` checks, sizes."""
        for position, ref in self.arg_aliases:
            if leaves[position] is not ref():
                return f"argument {position} is no longer the tensor that the function also reads as state"
        for position, hooks in self.arg_hooks:
            if hook_state(leaves[position]) != hooks:
                return f"argument {position} has other hooks than those the traced backward ran"
        if self._refs and not self._captures_match(leaves):
            miss = self._capture_miss(leaves)
            if miss is not None:
                return miss
        for ref, training, name in self.modules:
            module = ref()
            if module is None:
                return f"module {name} was freed"
            if module.training != training:
                return f"module {name}.training changed from {training} to {module.training}"
        for check in self.checks:
            miss = check()
            if miss is not None:
                return miss
        return first_miss(self.size_guards, leaves)

    def _captures_match(self, leaves: list) -> bool:
        """Every captured tensor alive, in its traced state and sharing no memory with an argument:
        ``tensor_state`` compared for all of them in C loops (the usual call)."""
        tensors = list(map(call, self._refs))
        if any(map(is_, tensors, self._nones)):
            return False
        # The same array objects as at the last matching call have its shapes, strides and dtypes
        # (an optimizer's hundreds of parameters): only requires_grad can differ then.
        arrays = list(map(_DATA, tensors))
        matched = self._matched_arrays
        if matched is None or not all(map(is_, arrays, map(call, matched))):
            if list(map(_LAYOUT, tensors)) != self._layouts:
                return False
            self._owners = None  # other arrays: their memory's owners are found again when needed
            try:
                self._matched_arrays = [weakref.ref(a) for a in arrays]
            except TypeError:  # an array type without weak references: compare layouts every call
                self._matched_arrays = None
        elif list(map(_REQUIRES_GRAD, tensors)) != self._requires_grad:
            return False
        grads = tensors if self._all_grads else [tensors[k] for k in self._grad_positions]
        if list(map(_NOT_NONE, map(_GRAD, grads))) != self._grads:
            return False
        changes = RemovableHandle.changes
        if changes != self._hooks_seen:
            if list(map(hook_state, tensors)) != self._hooks:
                return False
            self._hooks_seen = changes
        arg_roots = {id(a._base if a._base is not None else a) for a in leaves if isinstance(a, Tensor)}
        if not arg_roots:
            return True
        if not arg_roots.isdisjoint(self._captured_ids or self._ids_of(tensors)):
            return False  # (a captured view's own id is never a root: roots have no _base)
        return self._memory_shared_with(leaves, arrays) is None

    def _ids_of(self, tensors: list) -> frozenset[int]:
        """The ids of the captured tensors and of the tensors they view, kept: the same at every call
        while they live (a weak reference gives the same object or None, checked first, and a
        tensor's ``_base`` is set when it is made), and no other object has them meanwhile."""
        self._captured_ids = frozenset(map(id, tensors)) | frozenset(map(id, filter(_NOT_NONE, map(_BASE, tensors))))
        return self._captured_ids

    def _memory_shared_with(self, leaves: list, arrays: list) -> int | None:
        """The position of a captured tensor whose memory an argument's overlaps with no kiln view
        relation between them (``from_numpy`` of one array twice), else None."""
        by_owner = self._owners
        if by_owner is None or self._matched_arrays is None:  # (the arrays of the last matching call)
            by_owner = self._owners = owners_of(arrays)
        return _shared_with(leaves, arrays, by_owner)

    def _capture_miss(self, leaves: list) -> str | None:
        """Which captured tensor fails ``_captures_match``, in words."""
        arg_roots = {id(a._base if a._base is not None else a) for a in leaves if isinstance(a, Tensor)}
        for source in self._captured:
            t = source.ref()
            if t is None:
                return f"captured tensor {source.name} was freed"
            now = tensor_state(t)
            if source.snapshot[4] is None:  # whether .grad is set is no guard here
                now = (*now[:4], None, now[5])
            if now != source.snapshot:
                return f"captured tensor {source.name} changed: {_describe_state(source.snapshot, now)}"
            if id(t._base if t._base is not None else t) in arg_roots:
                return f"an argument shares memory with captured tensor {source.name}"
        arrays = [s.ref()._data for s in self._captured]  # type: ignore[union-attr]  # alive: checked above
        k = _shared_with(leaves, arrays, owners_of(arrays))
        if k is not None:
            return f"an argument shares memory with captured tensor {self._captured[k].name}"
        return None

    # ------------------------------------------------------------------ running
    def run(self, leaves: list):
        for fn, args, kwargs in self.prologues:
            fn(*args, **kwargs)
        if self.scalar_arguments:
            leaves = as_inputs(leaves, self.scalar_arguments)
        arrays = bind(self.signature, leaves)
        program = self.program
        outputs = program.run_checked_inputs(arrays) if self._inputs_checked else program(arrays)
        if self._fresh_results is not None:  # every result is new memory of its own: wrap it
            results = [make_tensor(outputs[output], device) for output, device in self._fresh_results]
        else:
            results = apply(self.signature, outputs, arrays, leaves, fresh=self._made_fresh)
        if self.backward is not None:
            self.backward.attach(self, results, outputs, leaves)
        self.calls += 1
        return unflatten(self.out_tree, results)


_MISSING = object()


def owners_of(arrays: list) -> dict[int, list[int]]:
    """The positions of ``arrays`` by the id of the object that owns each one's memory."""
    by_owner: dict[int, list[int]] = {}
    for k, a in enumerate(arrays):
        by_owner.setdefault(id(memory_owner(a)), []).append(k)
    return by_owner


def _shared_with(leaves: list, arrays: list, by_owner: dict[int, list[int]]) -> int | None:
    """The position in ``arrays`` of one whose memory a tensor of ``leaves`` overlaps, else None."""
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            for k in by_owner.get(id(memory_owner(leaf._data)), ()):
                if overlaps(leaf._data, arrays[k]):
                    return k
    return None


def _fresh_results(sig, fresh: frozenset) -> list | None:
    """(output, device) per result, in order, when every result is one of the program's ``fresh``
    outputs (new memory, handed out once) and the call writes nothing back and sets no grads:
    then ``apply`` has nothing to check or copy. None otherwise."""
    made = sig._made
    if not fresh or sig._new_grads or sig.writebacks or sig.grads or sig._late or len(made) != len(sig.results):
        return None
    if any(view is not None or output not in fresh for _, output, _, view in made):
        return None
    if [position for position, _, _, _ in made] != list(range(len(made))):
        return None
    if len({output for _, output, _, _ in made}) != len(made):  # one output handed out twice: copies
        return None
    return [(output, device) for _, output, device, _ in made]


def first_miss(guards: list, leaves: list) -> str | None:
    """The first of ``guards``' misses at a call with these flattened arguments (their ``miss(leaves)``)."""
    for guard in guards:
        miss = guard.miss(leaves)
        if miss is not None:
            return miss
    return None


def same_global(now, value) -> bool:
    """Whether a name the function reads still holds what it held (``ANY_FLOAT``: any float, read per call)."""
    return _same(now, value) or (value is ANY_FLOAT and type(now) is float)


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
    parts = [f"{n} {b} -> {a}" for n, b, a in zip(names, before[:5], after[:5], strict=True) if b != a]
    for kind, b, a in zip(("hooks", "post-accumulate hooks"), before[5], after[5], strict=True):
        if b != a:
            parts.append(f"{kind} {len(b)} -> {len(a)}" if len(b) != len(a) else f"{kind} replaced")
    return ", ".join(parts)
