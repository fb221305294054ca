"""Tracing hazards: what a traced call does to Python state that a compiled call would not repeat.

A compiled call replays tensor operations only. Whatever else the traced call did must make the
call run eagerly with the reason said; what it read is guarded (``guards.py``). ``Watch`` follows
the traced call:

- a ``sys.setprofile`` hook, active only in the tracing thread and only while the call is traced,
  scans the bytecode of each user code object that runs (once per code object) for stores into
  globals (``STORE_GLOBAL``) and closures (``STORE_DEREF`` on a free variable), sees calls into
  Python's and numpy's random generators and the user's code's reads of a clock (``time.time()``,
  ``datetime.now()``) or of ``os.urandom`` -- a value a compiled call would replay as it was read at
  the trace --, and sees the user's code call a mutating method
  (``append``, ``update``, ``add``...) of a dict, list or set from outside the call. It is paused
  while kiln's own work runs (an op, the backward engine, a ``kiln_only`` Function or node:
  ``state.unwatched``): a profile function makes every Python call slower, and a traced op took
  about twice as long under it;
- the attributes of the objects the call reads, and the dicts, lists and sets reachable from its
  globals, closure and arguments -- through the user's functions' closures and the tensors' and
  modules' hooks too (``reads.reach``) -- are compared before and after: a store into
  ``self.count`` or ``counter["step"]``, with the path and the user's line;
- an iterator or generator among the arguments is consumed by the call, or one the call reaches in a
  container or an attribute table (``next(self.batches)``; one whose position cannot be told counts
  where the code that ran spells the name it is held by);
- a global of the user's modules that the function names (or a function it runs names, or imports,
  or can find by a computed name: ``sys.modules[name]``, ``reads.finds_modules``) is set
  (``config.step += 1``: the module's globals, compared before and after as an object's attributes
  are); a module first imported inside the call is compared from where its import left it (``_imported``);
- an object's ``__class__`` is set (``obj.__class__ = Other``: its methods are another class's).

Each is a trace break. The profile hook also gathers the names the code that runs spells, by which
it can read the user's objects' attributes: the guards compare only those (``attr_reads``).
"""

from __future__ import annotations

import datetime
import io
import operator
import os
import random
import sys
import time
import types
from collections.abc import Callable, Sequence

import numpy as np

from ..tensor import Tensor
from . import attr_reads, reads, snapshots
from . import state as _state
from .locations import KILN_DIR
from .outcomes import TraceBreak
from .paths import _attrs, reachable_tensors  # noqa: F401 - (reachable_tensors: build.py reads it here)

_LIBRARIES: tuple = ()  # the standard library's and installed packages' folders (set on first use)
_MISSING = object()
_SKIP_TYPES = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, Tensor)
_RANDOM_OWNERS: tuple = ()  # Python's and numpy's generator types (set on first use: numpy.random imports slowly)
#: The C functions whose every call reads a new value from outside the program: by the ``id`` of the
#: object that owns them (a module or a class: they live as long as the process), the name the user
#: knows it by and the functions' names -- a clock, or the system's entropy.
_VOLATILE = {
    id(owner): (known_as, frozenset(names.split()))
    for owner, known_as, names in (
        (time, "time", "time time_ns perf_counter perf_counter_ns monotonic monotonic_ns process_time "
                       "process_time_ns thread_time thread_time_ns clock_gettime clock_gettime_ns"),
        (datetime.datetime, "datetime", "now utcnow today"),
        (datetime.date, "date", "today"),
        (os.urandom.__self__, "os", "urandom getrandom"),  # type: ignore[attr-defined]  # (posix or nt, not os)
    )
}  # fmt: skip
_NONE: tuple = (None, ())


def _first_use() -> None:
    global _LIBRARIES, _RANDOM_OWNERS
    # Their module-level caches and registries are not the user's state (read at each trace: a folder of
    # packages put on ``sys.path`` later counts too)
    _LIBRARIES = reads.library_folders()
    if not _RANDOM_OWNERS:
        _RANDOM_OWNERS = (random.Random, np.random.RandomState, np.random.Generator, np.random.BitGenerator)


# code object -> tuple of (what, line) stores it makes into globals or enclosing functions' variables
_STORES: dict = {}


def _user_code(code) -> bool:
    name = code.co_filename
    return not name.startswith(KILN_DIR) and not name.startswith(_LIBRARIES) and not name.startswith("<frozen")


def _importing(frame, outer: frozenset) -> bool:
    """Whether ``frame`` runs for a module's first import begun inside the traced call: the module's
    body, or code it calls (what they store into globals is stored once, by the import, not at each
    call). ``outer``: the ids of the frames below the call (a module whose body calls the compiled
    function while it is imported is the caller, not an import inside the call)."""
    while frame is not None and id(frame) not in outer:
        if frame.f_code.co_name == "<module>":
            module = sys.modules.get(frame.f_globals.get("__name__", ""))
            spec = getattr(module, "__spec__", None)
            if getattr(module, "__dict__", None) is frame.f_globals and getattr(spec, "_initializing", False):
                return True
        frame = frame.f_back
    return False


def _stack(frame) -> list:
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


#: kiln's layers below the frontend (DESIGN.md): their code never calls the user's (kiln.nn, the
#: autograd and the frontend do: a module's forward, a hook, a custom Function)
_KILN_LOWER = tuple(KILN_DIR + layer + os.sep for layer in ("ir", "passes", "codegen", "runtime"))


def _for_the_user(frame) -> bool:
    """Whether the code running ``frame`` was called for the user's program rather than for kiln's
    own work: the nearest caller that is not library code is user code or kiln's frontend (the
    user's program calls ``random.randint``; ``Module.__call__`` calls a forward from an installed
    package), not kiln's lower layers (an eager kernel or a code generator whose library names a
    temporary file with a generator of its own)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(KILN_DIR):
            return not name.startswith(_KILN_LOWER)
        if _user_code(frame.f_code):
            return True
        frame = frame.f_back
    return True


def _scan(code) -> tuple:
    """Stores into globals and closures in ``code`` (nested code objects run as their own frames)."""
    import dis  # noqa: PLC0415

    found = []
    line = code.co_firstlineno
    for ins in dis.get_instructions(code):
        if ins.positions is not None and ins.positions.lineno is not None:  # type: ignore[attr-defined]  # 3.11+
            line = ins.positions.lineno  # type: ignore[attr-defined]
        if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            found.append((f"stores into the global variable {ins.argval!r}", line))
        elif ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in code.co_freevars:
            found.append((f"stores into the variable {ins.argval!r} of an enclosing function (nonlocal)", line))
    return tuple(found)


def _attr_line(codes: list, name: str):
    """The first line of the traced user code that stores attribute ``name``."""
    import dis  # noqa: PLC0415

    for code in codes:
        line = code.co_firstlineno
        for ins in dis.get_instructions(code):
            if ins.positions is not None and ins.positions.lineno is not None:  # type: ignore[attr-defined]  # 3.11+
                line = ins.positions.lineno  # type: ignore[attr-defined]
            if ins.opname in ("STORE_ATTR", "DELETE_ATTR") and ins.argval == name:
                return code.co_filename, line, code.co_name
    return None


def named_values(compiled, closure_values: dict) -> list:
    return [value for _, value in compiled.guarded_names(closure_values)]


def watched_objects(compiled, leaves: list, closure_values: dict) -> list:
    """Objects whose attributes the function can read: the non-tensor arguments and the instances
    its globals and closure name (not modules, functions, classes or kiln's own objects), one level
    into their attributes."""
    roots = [leaf for leaf in leaves if not isinstance(leaf, Tensor)]
    roots += [value for _, value in compiled.guarded_names(closure_values)]
    roots += [compiled.fn, getattr(compiled.fn, "__self__", None)]  # a module compiled, a bound method's object
    out: dict[int, object] = {}
    for obj in roots:
        if obj is not None and _watchable(obj):
            out.setdefault(id(obj), obj)
            for value in list(_attrs(obj).values()):
                if _watchable(value):
                    out.setdefault(id(value), value)
    return list(out.values())


def _watchable(obj) -> bool:
    if isinstance(obj, _SKIP_TYPES):
        return False
    if not hasattr(obj, "__dict__"):  # the user's object with slots only: guarded by its slots' values
        return hasattr(type(obj), "__slots__") and reads._users_class(type(obj))
    from ...nn.modules.module import Module  # noqa: PLC0415

    return isinstance(obj, Module) or not reads.kilns(type(obj))


def _tables(obj) -> list[tuple[dict, dict]]:
    """``(live dict, snapshot)`` pairs for an object: its ``__dict__``, and, for a module, the
    dicts in it (parameters, buffers, submodules, hooks) -- compared by identity and value."""
    d = _attrs(obj)
    pairs = [(d, dict(d))]
    for value in d.values():
        if type(value) is dict or (isinstance(value, dict) and type(value).__module__ == "collections"):
            pairs.append((value, dict(value)))
    return pairs


def _same_table(live: dict, snap: dict) -> bool:
    if len(live) != len(snap):
        return False
    for key, value in snap.items():
        now = live.get(key, _MISSING)
        if now is value:
            continue
        if type(now) is not type(value) or not isinstance(value, int | float | str | bytes | complex | type(None)):
            return False
        if now != value and not (value != value and now != now):  # nan equals nan here
            return False
    return True


def _is_iterator(obj) -> bool:
    return isinstance(obj, types.GeneratorType) or (hasattr(type(obj), "__next__") and hasattr(type(obj), "__iter__"))


def _iterator_position(it):
    """Where an iterator stands, to see whether a call advanced it (None when it cannot be told)."""
    if isinstance(it, types.GeneratorType):
        return ("generator", None if it.gi_frame is None else it.gi_frame.f_lasti)
    hint = operator.length_hint(it, -1)
    return None if hint < 0 else ("hint", hint)


def _generator_frames(named: list, containers: list) -> frozenset[int]:
    """The ids of the frames of the generators the call reaches (named, or held by a container or an
    attribute table it reaches), not yet finished: the call resuming one consumes state from outside
    it (a position in a loop, which ``_iterator_position`` cannot tell apart from the last one)."""
    held = [
        v
        for _, live, _, _ in containers
        if isinstance(live, dict | list)
        for v in (live.values() if isinstance(live, dict) else live)
    ]
    return frozenset(
        id(g.gi_frame) for g in (*named, *held) if isinstance(g, types.GeneratorType) and g.gi_frame is not None
    )


def _held_iterators(containers: list) -> list[tuple]:
    """``(path, key, iterator, position)`` for the iterators (not generators: ``_generator_frames``, nor
    files, nor the user's own classes', whose ``__next__`` runs watched) held by the dicts, lists and
    attribute tables the call reaches (``self.batches = iter(loader)``, ``{"ids": itertools.count()}``)."""
    found = []
    for path, live, kind, _ in containers:
        if isinstance(live, dict | list):
            for key, v in list(live.items() if isinstance(live, dict) else enumerate(live)):
                if _is_iterator(v) and not isinstance(v, types.GeneratorType | io.IOBase) and not _users_next(v):
                    found.append((f"{path}{reads.selector(kind, key)}", key, v, _iterator_position(v)))
    return found


def _users_next(it) -> bool:
    """Whether ``it``'s ``__next__`` is the user's Python code (what it changes, the watch sees)."""
    step = getattr(type(it), "__next__", None)
    return isinstance(step, types.FunctionType) and _user_code(step.__code__)


def _rng_states() -> tuple:
    """The states of Python's and numpy's global random generators."""
    legacy = np.random.get_state(legacy=False)
    return random.getstate(), (legacy["state"]["pos"], legacy["state"]["key"].tobytes(), legacy["has_gauss"])


def _numpy_generator(obj) -> bool:
    """numpy's generators: their methods are Cython's, which a profiler never sees called, so a draw
    from one is seen by its state (``Watch.stop``) rather than as it happens (Python's ``random.Random``)."""
    return isinstance(obj, _RANDOM_OWNERS) and type(obj).__module__.startswith("numpy")


def _generator_state(obj):
    """A numpy generator's state as a comparable value (its bit generator's, arrays as bytes)."""
    state = obj.get_state(legacy=False) if isinstance(obj, np.random.RandomState) else None
    if state is None:
        state = (obj.bit_generator if isinstance(obj, np.random.Generator) else obj).state
    return _comparable(state)


def _comparable(value):
    if isinstance(value, dict):
        return tuple((k, _comparable(v)) for k, v in value.items())
    return value.tobytes() if isinstance(value, np.ndarray) else value


class Watch:
    """What a traced call does besides tensor ops; ``stop()`` returns the first hazard (or None)."""

    def __init__(self, objects: list, leaves: list, named: Sequence = (), code=None, roots: Sequence = (),
                 numpy_shadows: dict | None = None) -> None:  # fmt: skip
        self.objects = objects
        self.numpy_shadows = {} if numpy_shadows is None else numpy_shadows  # the arrays that are graph inputs
        self.roots = roots  # (name, object): what the function reaches Python containers through (reads.roots)
        self.code = code  # the compiled function's own code, scanned when another profiler runs
        self.leaves = leaves
        self.iterators = [v for v in named if _is_iterator(v)]  # iterators the globals and closure name
        self.hazard: TraceBreak | None = None
        self.codes: list = []  # user code objects that ran (for the line of an attribute store)
        # The names that the code that ran (any code: the user's, kiln's, the libraries') spells, and why
        # every attribute of the user's objects counts instead, if it does (``attr_reads``)
        self.names: set = set()
        self.whole: str | None = None
        self.read_whole: dict = {}  # id -> an object the call read by computed names (guarded whole)
        self._readers: set = set()  # libraries' code objects that read attributes by computed names
        self._reads_arguments: set = set()  # the user's code objects reading their arguments by computed names
        self.globals_read: list = []  # (globals, the names read there) per other user function that ran
        self._seen: set = set()
        self._previous: Callable | None = None
        self._hook: Callable | None = None
        self._before: list = []
        self._classes: list = []
        self._outer: frozenset = frozenset()  # ids of the frames below the traced call (set by start)

    def start(self) -> Watch:
        from ...ir.graph import SourceLocation  # noqa: PLC0415

        _first_use()
        self._outer = frozenset(map(id, _stack(sys._getframe(1))))
        for i, leaf in enumerate(self.leaves):
            if _is_iterator(leaf):
                self.hazard = TraceBreak(f"argument {i} is an iterator, which each call consumes", None)
        self._before = [(obj, _tables(obj)) for obj in self.objects]
        # The containers from outside the call, by path: a store into one is a hazard (see stop and
        # _profile, which sees their mutating methods called from the user's code as they happen).
        owners: dict = {}
        reached = reads.reach(self.roots, optimizers=True, owners=owners)
        # the objects' classes (``obj.__class__ = Other`` in the call: a store a compiled call would not make)
        self._classes = [(obj, type(obj)) for obj in [*self.objects, *owners.values()] if not isinstance(obj, type)]
        self._containers = [(path, live, kind, snapshots.snapshot(live)) for path, live, kind in reached]
        self._outside = {id(live): (path, live) for path, live, kind, _ in self._containers if kind == "item"}
        self._known = {id(live) for _, live, _, _ in self._containers}  # (kept alive by _containers)
        self._resumed = _generator_frames(self.iterators, self._containers)
        self._positions = [_iterator_position(it) for it in self.iterators]
        self._held = _held_iterators(self._containers)
        # The user's modules the function names (``import config`` then ``config.step += 1`` in the call):
        # their globals, compared after the call as an object's attributes are
        self._modules: dict[int, tuple] = {}
        self._every_module = False  # (all the user's modules watched: code that ran can find them by name)
        self._watch_modules(self.roots)
        self._rng = _rng_states()
        self._generators: dict[int, tuple] = {}  # id -> (a numpy generator the call reaches, its name, its state)
        self._watch_generators([*self.roots, *((type(obj).__name__, obj) for obj in self.objects)])
        self._location = SourceLocation
        self._previous = sys.getprofile()
        if self._previous is None:
            self._hook = self._profile  # (one bound method: kiln's own work pauses it by identity)
            _state.watch_hooks.add(self._hook)
            sys.setprofile(self._hook)
        elif self.code is not None and _user_code(self.code):
            # A profiler (cProfile, a debugger) holds the hook: leave it in place and read the
            # function's own code for stores instead (the functions it calls go unwatched).
            stores = _STORES.get(self.code)
            if stores is None:
                stores = _STORES[self.code] = _scan(self.code)
            if stores:
                what, line = stores[0]
                self.hazard = TraceBreak(
                    f"the call {what}", SourceLocation(self.code.co_filename, line, self.code.co_name)
                )
        return self

    def _profile(self, frame, event, arg) -> None:
        if self.hazard is not None:
            return
        if event == "call":
            if self._resumed and id(frame) in self._resumed:
                self.hazard = TraceBreak(
                    f"the call resumes the generator {frame.f_code.co_name}() from outside it, which each call consumes",
                    None,
                )
                return
            code = frame.f_code
            if code in self._seen:
                if code in self._readers and self.whole is None:  # (each call: its arguments differ)
                    self.whole = attr_reads.passes_users_object(frame)
                elif code in self._reads_arguments:
                    self.read_whole.update((id(obj), obj) for obj in attr_reads.computed_reads(frame)[1])
                return
            if _user_code(code) and _importing(frame, self._outer):
                return  # not marked seen: a call of the same code after the import is scanned
            self._seen.add(code)
            self.names.update(attr_reads.code_names(code))
            if not _user_code(code):
                if not code.co_filename.startswith(KILN_DIR) and attr_reads.spells_reader(code):
                    self._readers.add(code)
                    self.whole = self.whole or attr_reads.passes_users_object(frame)
                return
            self.codes.append(code)
            # the modules it imports (``import config`` then ``config.step += 1``; one imported for the
            # first time: ``_imported``), or may find by a computed name (``sys.modules[name].step += 1``)
            if not self._every_module:
                self._every_module = reads.finds_modules([code])
                self._watch_modules(reads.imported([code]))
            if self.whole is None:
                self.whole, objects = attr_reads.computed_reads(frame)
                if objects:
                    self._reads_arguments.add(code)
                    self.read_whole.update((id(obj), obj) for obj in objects)
            if code is not self.code:
                self._helper_globals(code, frame.f_globals)
            stores = _STORES.get(code)
            if stores is None:
                stores = _STORES[code] = _scan(code)
            if stores:
                what, line = stores[0]
                self.hazard = TraceBreak(f"the call {what}", self._location(code.co_filename, line, code.co_name))
        elif event == "c_call" and self._outside and id(getattr(arg, "__self__", None)) in self._outside:
            self._container_call(frame, arg)
        elif event == "c_call" and arg.__name__ in _VOLATILE.get(id(getattr(arg, "__self__", None)), _NONE)[1]:
            if _user_code(frame.f_code):  # (a library's own clock, logging's timestamp, stays its own)
                caller, known_as = frame.f_code, _VOLATILE[id(arg.__self__)][0]
                self.hazard = TraceBreak(
                    f"the call reads {known_as}.{arg.__name__}(), a value a compiled call would replay as the trace read it",
                    self._location(caller.co_filename, frame.f_lineno, caller.co_name),
                )
        elif event == "c_call" and isinstance(getattr(arg, "__self__", None), _RANDOM_OWNERS) and _for_the_user(frame):
            owner = "numpy's" if type(arg.__self__).__module__.startswith("numpy") else "Python's"
            caller = frame.f_code
            where = self._location(caller.co_filename, frame.f_lineno, caller.co_name) if _user_code(caller) else None
            self.hazard = TraceBreak(f"the call draws from {owner} random generator ({arg.__name__})", where)
        elif event == "return" and frame.f_code.co_name == "<module>" and _user_code(frame.f_code):
            self._imported(frame)

    def _imported(self, frame) -> None:
        """A module of the user's imported for the first time inside the call (its body, ``frame``, has
        run): its globals as the import left them, compared after the call as those of the modules the
        function names are (``import config`` then ``config.step += 1``: the import is done once, the
        store at every call)."""
        module = sys.modules.get(frame.f_globals.get("__name__", ""))
        if module is not None and vars(module) is frame.f_globals and _importing(frame, self._outer):
            self._modules.setdefault(id(module), (module, reads.module_name(frame.f_globals), dict(frame.f_globals)))

    def read_names(self) -> frozenset | None:
        """The names the traced call's code spells, by which it can read the user's objects'
        attributes; None where every attribute counts (``attr_reads``): code read attributes by
        computed names, or the watch did not see the code that ran (another profiler held the hook,
        or the user's code ran with the watch paused)."""
        if self._hook is None or self.whole is not None:
            return None
        return attr_reads.Spelled(self.names, self.read_whole)

    def _watch_generators(self, named) -> None:
        """Keep the state of the numpy generators among ``named`` ((name, object) pairs), for ``stop``."""
        for name, value in named:
            if _numpy_generator(value) and id(value) not in self._generators:
                self._generators[id(value)] = (value, name, _generator_state(value))

    def _watch_modules(self, named) -> None:
        """Keep a copy of the globals of the user's modules among ``named`` ((name, object) pairs), for ``stop``."""
        for name, value in named:
            if isinstance(value, types.ModuleType) and id(value) not in self._modules and reads._users_module(value):
                self._modules[id(value)] = (value, name, dict(value.__dict__))

    def _helper_globals(self, code, fn_globals: dict) -> None:
        """A function the call runs reads globals of its own (``x * SCALE``, ``CFG["k"]`` in a helper):
        the containers they reach are watched from now on (before the function's first line runs)."""
        names = reads.global_names(code, fn_globals)
        self._watch_generators((name, fn_globals[name]) for name in names)
        self._watch_modules([(name, fn_globals[name]) for name in names])
        if names:
            self.globals_read.append((fn_globals, names))
            module = reads.module_name(fn_globals)
            for path, live, kind in reads.reach([(f"{module}.{name}", fn_globals[name]) for name in names]):
                if id(live) not in self._known:
                    self._known.add(id(live))
                    self._containers.append((path, live, kind, snapshots.snapshot(live)))
                    if kind == "item":
                        self._outside[id(live)] = (path, live)

    def _container_call(self, frame, method) -> None:
        """``method`` (a builtin method of a container from outside the call) is called from ``frame``."""
        path, live = self._outside[id(method.__self__)]
        if live is method.__self__ and method.__name__ in reads.MUTATORS and _user_code(frame.f_code):
            code = frame.f_code
            self.hazard = TraceBreak(
                f"the call changes {path} ({type(live).__name__}.{method.__name__}), a {type(live).__name__} from "
                "outside the call: a compiled call would not change it",
                self._location(code.co_filename, frame.f_lineno, code.co_name),
            )

    def _changed_container(self) -> TraceBreak | None:
        """A store the call made into a container from outside it (``d[k] = v``, ``del d[k]``)."""
        inputs = snapshots.not_inputs(self._containers, self.numpy_shadows)  # (a write into one is a program's)
        for path, live, kind, snap in inputs:
            if type(snap) is snapshots.Contents and snap.too_large:
                return TraceBreak(
                    f"the call reaches {path}, a numpy array of {live.nbytes / 2**20:.1f} MiB in Python state, "
                    "which a compiled call would have to copy to see it change: pass what the call reads from it "
                    "as an argument, or make it a tensor (kiln.from_numpy, whose memory a program reads)",
                    None,
                )
            if snapshots.same(snap, live):
                continue
            change = snapshots.changed_entry(live, snap)
            key = None if change is None else change[0]
            where = f"{path}{reads.selector(kind, key)}" if key is not None else path
            if kind == "attr":
                loc = _attr_line(self.codes, key)  # type: ignore[arg-type]  # an attribute change has a name
                where_line = self._location(*loc) if loc else None
            else:
                where_line = reads.store_line(self.codes, path, key)
            return TraceBreak(
                f"the call changed {where}, Python state from outside the call that a compiled call would not change",
                where_line,
            )
        return None

    def stop(self) -> TraceBreak | None:
        if self._previous is None:
            sys.setprofile(None)
            _state.watch_hooks.discard(self._hook)
        if self.hazard is not None:
            return self.hazard
        for it, before in zip(self.iterators, self._positions, strict=True):
            if before is None or _iterator_position(it) != before:
                return TraceBreak(f"the call may consume the {type(it).__name__} iterator it names", None)
        for path, key, it, before in self._held:
            # one whose position cannot be told counts where the code that ran spells the name it is held by
            if _iterator_position(it) != before if before is not None else key in self.names or type(key) is int:
                return TraceBreak(f"the call may consume {path}, a {type(it).__name__} iterator from outside the call",
                                  None)  # fmt: skip
        for module, name, before in self._modules.values():
            now = module.__dict__
            if not _same_table(now, before):
                key = next(k for k in {**before, **now} if now.get(k, _MISSING) is not before.get(k, _MISSING))
                loc = _attr_line(self.codes, key)
                return TraceBreak(
                    f"the call changed {name}.{key}, a global of a module that a compiled call would not change",
                    self._location(*loc) if loc else None,
                )
        rng = _rng_states()
        for before, now, name in zip(self._rng, rng, ("Python's", "numpy's"), strict=True):
            if before != now:
                return TraceBreak(f"the call draws from {name} global random generator", None)
        for generator, name, before in self._generators.values():
            if _generator_state(generator) != before:
                return TraceBreak(f"the call draws from numpy's random generator {name} (a {type(generator).__name__})",
                                  None)  # fmt: skip
        for obj, cls in self._classes:
            if type(obj) is not cls:
                return TraceBreak(f"the call set the __class__ of a {cls.__name__} object from outside the call "
                                  f"(a {type(obj).__name__} now), which a compiled call would not do", None)  # fmt: skip
        changed = self._changed_container()  # first: it names the path (``self.stats['calls']``)
        if changed is not None:
            return changed
        for obj, tables in self._before:
            for live, snap in tables:
                if _same_table(live, snap):
                    continue
                names = [k for k in set(live) | set(snap) if live.get(k, _MISSING) is not snap.get(k, _MISSING)]
                name = str(names[0]) if names else "?"
                loc = _attr_line(self.codes, name)
                return TraceBreak(
                    f"the call changed {type(obj).__name__}.{name}, Python state a compiled call would not change",
                    self._location(*loc) if loc else None,
                )
        return None
