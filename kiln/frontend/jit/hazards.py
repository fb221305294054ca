"""Tracing hazards: Python state a traced graph would silently freeze, found while tracing.

A compiled call replays tensor operations only. Whatever else the traced call did or read must
either be guarded (checked on each call, a new trace when it changed) or make the call run
eagerly with the reason said. This module does both for the compiler:

- **watching the traced call** (``Watch``): a ``sys.setprofile`` hook, active only in the tracing
  thread and only while the call is traced, scans the bytecode of each user code object that runs
  (once per code object) for stores into globals (``STORE_GLOBAL``) and closures (``STORE_DEREF``
  on a free variable), and sees calls into Python's and numpy's random generators; the attributes
  of the objects the call reads are compared before and after (a store into ``self.count``); an
  iterator or generator among the arguments is consumed by the call. Each is a trace break.
- **guards** (``Guards``): the plain attributes (and the parameter, buffer, submodule and hook
  tables) of the modules called and of the objects the function names, and the dicts and lists
  that hold a captured tensor, found by walking from what the function names when the trace
  ends: a captured tensor is found by identity, so the *path* by which the function reached it
  is guarded, e.g. ``model.w = Parameter(...)`` or ``d["w"] = other``; so is ``t.grad`` where it
  held a captured tensor (``p.grad = new`` while the old gradient is still alive elsewhere).
"""

from __future__ import annotations

import operator
import os
import random
import sys
import types
import weakref
from itertools import chain
from operator import is_

import numpy as np

from ..tensor import Tensor
from .signature import call
from .trace import _KILN_DIR, TraceBreak

_LIBRARIES: tuple = ()  # the standard library's and installed packages' folders (set on first use)
_MISSING = object()
_SKIP_TYPES = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, Tensor)
_RANDOM_OWNERS: tuple = ()  # Python's and numpy's generator types (set on first use: numpy.random imports slowly)


def _first_use() -> None:
    global _LIBRARIES, _RANDOM_OWNERS
    if not _RANDOM_OWNERS:
        import sysconfig  # noqa: PLC0415

        # Their module-level caches and registries are not the user's state.
        paths = sysconfig.get_paths()
        _LIBRARIES = tuple(
            {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        )
        _RANDOM_OWNERS = (random.Random, np.random.RandomState, np.random.Generator, np.random.BitGenerator)


# code object -> tuple of (what, line) stores it makes into globals or enclosing functions' variables
_STORES: dict = {}


def _user_code(code) -> bool:
    name = code.co_filename
    return not name.startswith(_KILN_DIR) and not name.startswith(_LIBRARIES) and not name.startswith("<frozen")


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
_KILN_LOWER = tuple(_KILN_DIR + layer + os.sep for layer in ("ir", "passes", "codegen", "runtime"))


def _for_the_user(frame) -> bool:
    """Whether the code running ``frame`` was called for the user's program rather than for kiln's
    own work: the nearest caller that is not library code is user code or kiln's frontend (the
    user's program calls ``random.randint``; ``Module.__call__`` calls a forward from an installed
    package), not kiln's lower layers (an eager kernel or a code generator whose library names a
    temporary file with a generator of its own)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_KILN_DIR):
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
        if ins.positions is not None and ins.positions.lineno is not None:
            line = ins.positions.lineno
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
            if ins.positions is not None and ins.positions.lineno is not None:
                line = ins.positions.lineno
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
    if isinstance(obj, _SKIP_TYPES) or not hasattr(obj, "__dict__"):
        return False
    from ...nn.modules.module import Module  # noqa: PLC0415

    return isinstance(obj, Module) or not type(obj).__module__.startswith("kiln")


def _attrs(obj) -> dict:
    try:
        d = vars(obj)
    except TypeError:
        return {}
    return d if isinstance(d, dict) else {}


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


def _rng_states() -> tuple:
    """The states of Python's and numpy's global random generators."""
    legacy = np.random.get_state(legacy=False)
    return random.getstate(), (legacy["state"]["pos"], legacy["state"]["key"].tobytes(), legacy["has_gauss"])


class Watch:
    """What a traced call does besides tensor ops; ``stop()`` returns the first hazard (or None)."""

    def __init__(self, objects: list, leaves: list, named: list = (), code=None) -> None:
        self.objects = objects
        self.code = code  # the compiled function's own code, scanned when another profiler runs
        self.leaves = leaves
        self.iterators = [v for v in named if _is_iterator(v)]  # iterators the globals and closure name
        self.hazard: TraceBreak | None = None
        self.codes: list = []  # user code objects that ran (for the line of an attribute store)
        self._seen: set = set()
        self._previous = None
        self._before: list = []
        self._outer: frozenset = frozenset()  # ids of the frames below the traced call (set by start)

    def start(self) -> Watch:
        from ...ir.graph import SourceLocation  # noqa: PLC0415

        _first_use()
        self._outer = frozenset(map(id, _stack(sys._getframe(1))))
        for i, leaf in enumerate(self.leaves):
            if _is_iterator(leaf):
                self.hazard = TraceBreak(f"argument {i} is an iterator, which each call consumes", None)
        self._before = [(obj, _tables(obj)) for obj in self.objects]
        self._positions = [_iterator_position(it) for it in self.iterators]
        self._rng = _rng_states()
        self._location = SourceLocation
        self._previous = sys.getprofile()
        if self._previous is None:
            sys.setprofile(self._profile)
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
            code = frame.f_code
            if code in self._seen:
                return
            if _user_code(code) and _importing(frame, self._outer):
                return  # not marked seen: a call of the same code after the import is scanned
            self._seen.add(code)
            if not _user_code(code):
                return
            self.codes.append(code)
            stores = _STORES.get(code)
            if stores is None:
                stores = _STORES[code] = _scan(code)
            if stores:
                what, line = stores[0]
                self.hazard = TraceBreak(f"the call {what}", self._location(code.co_filename, line, code.co_name))
        elif event == "c_call" and isinstance(getattr(arg, "__self__", None), _RANDOM_OWNERS) and _for_the_user(frame):
            owner = "numpy's" if type(arg.__self__).__module__.startswith("numpy") else "Python's"
            caller = frame.f_code
            where = self._location(caller.co_filename, frame.f_lineno, caller.co_name) if _user_code(caller) else None
            self.hazard = TraceBreak(f"the call draws from {owner} random generator ({arg.__name__})", where)

    def stop(self) -> TraceBreak | None:
        if self._previous is None:
            sys.setprofile(None)
        if self.hazard is not None:
            return self.hazard
        for it, before in zip(self.iterators, self._positions, strict=True):
            if before is None or _iterator_position(it) != before:
                return TraceBreak(f"the call may consume the {type(it).__name__} iterator it names", None)
        rng = _rng_states()
        for before, now, name in zip(self._rng, rng, ("Python's", "numpy's"), strict=True):
            if before != now:
                return TraceBreak(f"the call draws from {name} global random generator", None)
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


class _Is:
    """A snapshot entry compared by identity (tensors, arrays, objects whose ``==`` is not identity-safe)."""

    __slots__ = ("obj",)

    def __init__(self, obj) -> None:
        self.obj = obj

    def __eq__(self, other) -> bool:
        return other is self.obj

    __hash__ = None  # type: ignore[assignment]


_SCALARS = (int, float, str, bytes, complex, type(None))
_BY_VALUE = (*_SCALARS, tuple, frozenset)
_CONTAINERS = (dict, list, set)


def _entry(v):
    """How a snapshot holds ``v`` so that ``==`` against the live value is right and cheap: the
    object itself where ``==`` is identity or a value comparison that cannot mislead (the C
    identity shortcut makes the usual case free), a copy of a container of plain values (changed
    in place), and an identity check for the rest (tensors and arrays compare elementwise)."""
    if isinstance(v, _BY_VALUE) and not isinstance(v, Tensor):
        return v
    if type(v) in (list, dict, set):
        items = v.values() if type(v) is dict else v
        if all(isinstance(x, _BY_VALUE) for x in items):
            return type(v)(v)
        return v
    if isinstance(v, _CONTAINERS) or type(v).__eq__ is object.__eq__:
        return v
    return _Is(v)


def _snapshot(container):
    """A copy of a dict's or list's entries that ``snapshot == live`` compares in C."""
    if isinstance(container, dict):
        return {k: _entry(v) for k, v in container.items()}
    return [_entry(v) for v in container]


class Guards:
    """Checks, per call, that the Python paths to the traced state still lead to the same objects."""

    __slots__ = ("pairs", "dicts", "dict_snaps", "lists", "list_snaps", "same_dicts", "same_lists", "_expected",
                 "grad_owners", "grads")  # fmt: skip

    def __init__(self) -> None:
        self.pairs: list = []  # (snapshot, live container, weakref to the owner or None, description)
        self.dicts: list = []
        self.dict_snaps: list = []
        self.lists: list = []
        self.list_snaps: list = []
        # Containers of objects compared by identity alone (a list of parameters, an optimizer's
        # per-parameter state): checked in C without a Python ``_Is.__eq__`` per entry.
        self.same_dicts: list = []
        self.same_lists: list = []
        self._expected: tuple = ([], (), (), [], ())  # dict sizes, keys, values, list sizes, items
        # ``t.grad`` paths to captured tensors: weak references to each tensor ``t`` and to the
        # captured ``.grad`` it held (``p.grad = new`` while the old one lives must miss)
        self.grad_owners: list = []
        self.grads: list = []

    def add(self, owner, name: str, live) -> None:
        snap = _snapshot(live)
        self.pairs.append((snap, live, owner, name))
        entries = snap.values() if isinstance(snap, dict) else snap
        if entries and all(type(e) is _Is for e in entries):
            (self.same_dicts if isinstance(live, dict) else self.same_lists).append(live)
            sizes, keys, values, lengths, items = self._expected
            if isinstance(live, dict):
                self._expected = ([*sizes, len(snap)], (*keys, *snap), (*values, *(e.obj for e in entries)), lengths,
                                  items)  # fmt: skip
            else:
                self._expected = (sizes, keys, values, [*lengths, len(snap)], (*items, *(e.obj for e in entries)))
        elif isinstance(live, dict):
            self.dicts.append(live)
            self.dict_snaps.append(snap)
        else:
            self.lists.append(live)
            self.list_snaps.append(snap)

    def miss(self) -> str | None:
        # The usual case in C loops: dict.__eq__(snapshot, live) compares the snapshot's entries
        # first (no reflection to an OrderedDict's __eq__), so an _Is entry decides by identity;
        # the identity containers hold the same keys and objects in the same order.
        sizes, keys, values, lengths, items = self._expected
        if (
            list(map(len, self.same_dicts)) == sizes
            and list(map(len, self.same_lists)) == lengths
            and all(map(is_, chain.from_iterable(self.same_dicts), keys))
            and all(map(is_, chain.from_iterable(map(dict.values, self.same_dicts)), values))
            and all(map(is_, chain.from_iterable(self.same_lists), items))
            and all(map(dict.__eq__, self.dict_snaps, self.dicts))
            and all(map(list.__eq__, self.list_snaps, self.lists))
            and self._same_grads()
        ):
            return None
        for owner, grad in zip(self.grad_owners, self.grads, strict=True):
            t = owner()
            if t is not None and t._grad is not grad():
                return f"the .grad of a tensor of shape {tuple(t._data.shape)} is another tensor now"
        for snap, live, owner, name in self.pairs:
            equal = dict.__eq__ if isinstance(live, dict) else list.__eq__
            if equal(snap, live) is True:
                continue
            if owner is not None and owner() is None:
                continue  # the object is gone: nothing reaches the traced state through it any more
            return f"{name} changed{_difference(live, snap)}"
        return None

    def _same_grads(self) -> bool:
        try:
            grads = list(map(_GRAD, map(call, self.grad_owners)))
        except AttributeError:  # a tensor is gone (None._grad): said by the loop in ``miss``
            return False
        return all(map(is_, grads, map(call, self.grads)))

    def add_grad_paths(self, tensors, captured: dict) -> None:
        """Guard ``t.grad`` for each of ``tensors`` whose ``.grad`` is one of ``captured`` (id -> tensor)."""
        seen: set[int] = set()
        for t in tensors:
            grad = t._grad
            if grad is not None and captured.get(id(grad)) is grad and id(t) not in seen:
                seen.add(id(t))
                self.grad_owners.append(weakref.ref(t))
                self.grads.append(weakref.ref(grad))


_GRAD = operator.attrgetter("_grad")


def _difference(live, snap) -> str:
    if isinstance(live, dict):
        for key in [*snap, *live]:
            if key not in live or key not in snap or not snap[key] == live[key]:
                return f" ({key!r})"
    return ""


def _is_module_dict(d: dict) -> bool:
    module = sys.modules.get(d.get("__name__")) if isinstance(d.get("__name__"), str) else None
    return module is not None and getattr(module, "__dict__", None) is d


def _walk(roots: list, depth: int = 5, limit: int = 20000):
    """``(container, its values)`` for the dicts, lists, tuples and objects reachable from ``roots``
    (the objects, globals and closure values the function names) through dicts, lists, tuples and
    instance attributes, ``depth`` levels down -- the paths by which the function reaches state."""
    seen: set[int] = set()
    level = list(roots)
    for _ in range(depth):
        following = []
        for obj in level:
            if id(obj) in seen or isinstance(obj, (Tensor, *_SCALARS)) or len(seen) > limit:
                continue
            seen.add(id(obj))
            if isinstance(obj, dict):
                if _is_module_dict(obj):
                    continue  # a module's globals: the names the function reads are guarded one by one
                values = list(obj.values())
            elif isinstance(obj, list | tuple):
                values = list(obj)
            elif isinstance(obj, types.ModuleType | types.FunctionType | type | np.ndarray):
                continue
            else:
                values = list(_attrs(obj).values())
            yield obj, values
            following.extend(v for v in values if not isinstance(v, Tensor))
        level = following


def _holders(refs: dict, roots: list) -> list:
    """The dicts and lists that hold one of the tensors ``refs`` (id -> tensor)."""
    if not refs:
        return []
    # `v is not None`: refs.get() answers None for a missing id, which would match a None value.
    return [obj for obj, values in _walk(roots)
            if isinstance(obj, dict | list) and any(v is not None and refs.get(id(v)) is v for v in values)]  # fmt: skip


def reachable_tensors(roots: list) -> dict[int, Tensor]:
    """The memory owners (by id) of the tensors reachable from ``roots`` (see ``_walk``)."""
    found = {}
    for t in [r for r in roots if isinstance(r, Tensor)] + [
        v for _, values in _walk(roots) for v in values if isinstance(v, Tensor)
    ]:
        root = t._base if t._base is not None else t
        found[id(root)] = root
    return found


def build_guards(objects: list, modules: list, captured: list, named: list = ()) -> Guards:
    """Guards of a new specialization: the attribute tables of the watched objects and called
    modules, and the dicts and lists holding each captured tensor when the trace ended."""
    guards = Guards()
    seen: set[int] = set()
    roots = [*objects, *(ref() for ref, *_ in modules)]
    roots += [v for obj in list(roots) if obj is not None for v in list(_attrs(obj).values()) if _watchable(v)]
    for obj in roots:
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            owner = weakref.ref(obj)
        except TypeError:
            owner = None
        for live, _ in _tables(obj):
            seen.add(id(live))
            guards.add(owner, type(obj).__name__, live)
    refs = {id(t): t for t in captured if t is not None}
    reachable = [v for _, values in _walk([*roots, *named]) for v in values if isinstance(v, Tensor)]
    guards.add_grad_paths([*refs.values(), *(v for v in named if isinstance(v, Tensor)), *reachable], refs)
    for holder in _holders(refs, [*roots, *named]):
        if id(holder) not in seen:
            seen.add(id(holder))
            what = "a dict" if isinstance(holder, dict) else "a list"
            guards.add(None, f"{what} holding a captured tensor", holder)
    return guards
