"""Snapshots of the Python state a trace read, compared with the live state at each call.

``reads.reach`` finds the containers a traced call reaches (dicts, lists, sets, the attribute tables
of the user's objects and classes, numpy arrays); ``snapshot`` copies what each held, in a form
``same`` compares in C (a dict's entries and their order, a set's members, an array's bytes), and
``changed_entry`` names the entry that differs. ``guards.Guards`` checks them before each compiled
call; ``hazards.Watch`` compares them after the traced call, to see what it stored.

State held in neither a dict, a list, a set nor an array is a ``View``: what it holds read out as a
list (or as bytes) by a reader of its kind (``viewed``) -- a ``deque`` (a window of recent losses),
an ``array.array`` or a ``bytearray`` (by their bytes), a ``ContextVar`` (its value in the current
context), a function's closure cells and default values (``lambda: x * alpha`` where ``alpha`` is
rebound), the slots of an object without a ``__dict__`` (``@dataclass(slots=True)``), a
``threading.local``'s attributes (in the calling thread).
"""

from __future__ import annotations

import array
import collections
import contextvars
import ctypes
import sys
import threading
import types

import numpy as np

from ..tensor import Tensor

_SCALARS = (int, float, str, bytes, complex, type(None))
_BY_VALUE = (*_SCALARS, tuple, frozenset)
_CONTAINERS = (dict, list, set)


class _Is:
    """A snapshot entry compared by identity (tensors, arrays, objects whose ``==`` is not identity-safe)."""

    __slots__ = ("obj",)

    def __init__(self, obj) -> None:
        self.obj = obj

    def __eq__(self, other) -> bool:
        return other is self.obj

    __hash__ = None  # type: ignore[assignment]


class _AnyFloat:
    """A snapshot entry that any float matches: an entry of Python state whose float a program reads
    at each call (``state_floats.py``). Compared first (the snapshot's side of ``dict.__eq__``)."""

    __slots__ = ()

    def __eq__(self, other) -> bool:
        return type(other) is float

    def __ne__(self, other) -> bool:
        return type(other) is not float

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "any float"


ANY_FLOAT = _AnyFloat()


def _entry(v):
    """How a snapshot holds ``v`` so that ``==`` against the live value is right and cheap: the
    object itself where ``==`` is identity or a value comparison that cannot mislead (the C
    identity shortcut makes the usual case free), a copy of a container of plain values (changed
    in place), and an identity check for the rest: tensors and arrays compare elementwise, and a
    container of other objects replaced by an equal one is not the container the guards watch (an
    optimizer's per-parameter state made again after ``opt.state.clear()``)."""
    if isinstance(v, _BY_VALUE) and not isinstance(v, Tensor):
        return v
    if type(v) in (list, dict, set):
        items = v.values() if type(v) is dict else v
        if all(isinstance(x, _BY_VALUE) for x in items):
            return type(v)(v)
        return _Is(v)
    if not isinstance(v, _CONTAINERS) and type(v).__eq__ is object.__eq__:
        return v
    return _Is(v)


def array_owner(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (``a`` itself, or the base its views lead to)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def not_inputs(reached: list, shadows: dict) -> list:
    """``reached`` without the numpy arrays whose memory a trace made a graph input (a tensor made from
    one: ``Trace.on_numpy``, ``shadows`` by array id): a program reads those at each call, so a buffer
    the caller refills keeps its program."""
    owners = {id(array_owner(a)) for a, _ in shadows.values()}
    return [r for r in reached if r[2] != "array" or id(array_owner(r[1])) not in owners]


class Contents:
    """A numpy array's contents when snapshot: its memory is changed in place (``table[0] = 2.0``,
    ``np.random.shuffle(data)``) where a container's entries would be replaced, and a value Python
    reads out of it (``float(table[i])``, ``kiln.tensor(data[:8])``) is the trace's constant.

    Compared bit for bit (a NaN matches itself; ``-0.0`` does not match ``0.0``: a retrace, never a
    wrong result) by ``memcmp`` against a copy where the array is one contiguous block: 0.26 ms for
    8 MB, against 1.1 ms through ``tobytes`` (2-core machine). An object array's elements are
    compared as a list's. The copy doubles the array's memory: the price of a trace that reads a
    dataset held in Python state rather than passed in as its argument. Two kinds are not copied:

    - an array nothing can write (its memory's owner is read-only: ``np.load(..., mmap_mode="r")``,
      ``flags.writeable = False``): identity is guard enough;
    - one of more than ``GUARDED_BYTES`` that can change (``too_large``): it never holds, and a call
      whose trace reads it runs eagerly, said (``hazards.Watch``), rather than copying gigabytes."""

    __slots__ = ("obj", "dtype", "shape", "strides", "data", "too_large")

    def __init__(self, a: np.ndarray) -> None:
        self.obj, self.dtype, self.shape, self.strides = a, a.dtype, a.shape, a.strides
        self.too_large = False
        if not _may_change(a):
            self.data: object = None
        elif a.nbytes > GUARDED_BYTES:
            self.data, self.too_large = None, True
        elif a.dtype.hasobject:
            self.data = a.ravel().tolist()
        elif _contiguous(a):
            self.data = np.array(a, order="K", copy=True)
        else:
            self.data = a.tobytes()

    def holds(self, live=None) -> bool:
        """Whether ``live`` (None: the array snapshot) holds these contents."""
        a = self.obj if live is None else live
        if a is not self.obj or a.dtype != self.dtype or a.shape != self.shape or a.strides != self.strides:
            return False
        data = self.data
        if data is None:
            return not self.too_large
        if type(data) is np.ndarray:
            return a.nbytes == 0 or _memcmp(a.ctypes.data, data.ctypes.data, a.nbytes) == 0
        if type(data) is list:
            return a.ravel().tolist() == data
        return a.tobytes() == data


#: The most bytes of an array that can change which a guard copies (and compares at each call: about
#: 5 ms for 64 MiB).
GUARDED_BYTES = 64 << 20


def _may_change(a: np.ndarray) -> bool:
    """Whether ``a``'s memory can be written: its owner is writeable (a read-only view of a writeable
    array changes with it; numpy makes no view writeable over a read-only owner)."""
    return bool(array_owner(a).flags.writeable)


def _contiguous(a: np.ndarray) -> bool:
    return bool(a.flags.c_contiguous or a.flags.f_contiguous)


def _c_memcmp():
    """The C library's ``memcmp`` (None where ctypes cannot find it: ``tobytes`` compares then)."""
    try:
        library = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
        memcmp = library.memcmp
    except (OSError, AttributeError):
        return None
    memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    memcmp.restype = ctypes.c_int
    return memcmp


def _memcmp_by_bytes(p: int, q: int, n: int) -> int:
    return 0 if ctypes.string_at(p, n) == ctypes.string_at(q, n) else 1


_memcmp = _c_memcmp() or _memcmp_by_bytes


class View:
    """What a container that is no dict, list or set holds when snapshot, as its ``viewed`` reader reads
    it: a list of entries (compared as a list's, ``_entry``) or bytes; ``names`` names the entries
    (a closure's variables, the slots: ``path.name``), else they are numbered (``path[i]``)."""

    __slots__ = ("obj", "read", "data", "names")

    def __init__(self, obj, read, names: tuple | None) -> None:
        self.obj, self.read, self.names = obj, read, names
        data = read(obj)
        self.data = data if type(data) is bytes else [_entry(v) for v in data]

    def holds(self, live=None) -> bool:
        """Whether ``live`` (None: the object snapshot) holds these entries."""
        return self.data == self.read(self.obj if live is None else live)

    def key(self, i: int):
        return i if self.names is None else self.names[i]


def _cells(fn: types.FunctionType) -> list:
    """A function's closure variables' values (MISSING for one not yet assigned) and default values."""
    values = []
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:
            values.append(MISSING)
    # (keyword defaults as a tuple of pairs, compared by value with identity first: a copy of their dict
    # holding a class or a tensor would be compared by identity, and a new copy is another object)
    return [*values, fn.__defaults__, None if fn.__kwdefaults__ is None else tuple(fn.__kwdefaults__.items())]


def _context_value(var: contextvars.ContextVar) -> list:
    return [var.get(MISSING)]


def slot_names(cls) -> tuple:
    """The names of the slots of ``cls`` and its bases (their member descriptors)."""
    return tuple(name for base in reversed(cls.__mro__) for name, value in base.__dict__.items()
                 if isinstance(value, types.MemberDescriptorType))  # fmt: skip


def _slot_reader(names: tuple):
    def read(obj) -> list:
        return [getattr(obj, name, MISSING) for name in names]

    return read


_READERS: dict = {
    collections.deque: (list, None),
    array.array: (array.array.tobytes, None),
    bytearray: (bytes, None),
    contextvars.ContextVar: (_context_value, ("value",)),
}


#: A ``threading.local``'s class: its attribute table is the calling thread's, so a guard holding the
#: table it saw would compare the tracing thread's values at every thread's call.
THREAD_LOCAL = type(threading.local())


def _local_view(obj) -> View:
    """The attributes of a ``threading.local`` (and how many it has), read in the calling thread."""
    names = tuple(vars(obj))

    def read(local) -> list:
        table = vars(local)
        return [*(table.get(name, MISSING) for name in names), len(table)]

    return View(obj, read, (*names, "<number of attributes>"))


def viewed(obj) -> bool:
    """Whether ``obj`` is state that a ``View`` snapshots (``reads.reach`` finds it as a container)."""
    return isinstance(obj, tuple(_READERS)) or isinstance(obj, types.FunctionType | THREAD_LOCAL)


def _view(obj) -> View:
    if isinstance(obj, THREAD_LOCAL):
        return _local_view(obj)
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        return View(obj, _cells, (*(f"<closure>.{n}" for n in code.co_freevars), "__defaults__", "__kwdefaults__"))
    for kind, (read, names) in _READERS.items():
        if isinstance(obj, kind):
            return View(obj, read, names)
    names = slot_names(type(obj))  # an object with slots and no __dict__ (``reads.reach``)
    return View(obj, _slot_reader(names), names)


def snapshot(container):
    """A copy of a dict's, list's or set's entries (or a class's attributes) that ``same`` compares in
    C; a numpy array's ``Contents``; a ``View`` of any other container."""
    if isinstance(container, np.ndarray):
        return Contents(container)
    if not isinstance(container, dict | types.MappingProxyType | set | list):
        return _view(container)
    if isinstance(container, dict | types.MappingProxyType):
        return {k: _entry(v) for k, v in container.items()}
    if isinstance(container, set):
        return frozenset(container)
    return [_entry(v) for v in container]


def same(snap, live) -> bool:
    """Whether ``live`` still holds what ``snapshot`` took (the C comparison of the snapshot's type)."""
    if type(snap) is Contents or type(snap) is View:
        return snap.holds(live)
    if isinstance(snap, dict):
        if type(live) is types.MappingProxyType:  # a class's attributes: their order is no program's
            return dict.__eq__(snap, dict(live)) is True
        # in the same order too: a loop over ``d.items()`` meets them in it
        return dict.__eq__(snap, live) is True and (len(snap) < 2 or list(snap) == list(live))
    if isinstance(snap, frozenset):
        return frozenset.__eq__(snap, live) is True
    return list.__eq__(snap, live) is True


def changed_entry(live, snap):
    """``(key, before, after)`` of the first entry of ``live`` that differs from ``snap`` (``_MISSING``
    for an entry absent on one side), or None where no single entry tells (a set, a reordered list,
    a numpy array)."""
    if isinstance(snap, frozenset | Contents):
        return None
    if type(snap) is View:
        if type(snap.data) is bytes:
            return None
        now = snap.read(live)
        for i in range(max(len(snap.data), len(now))):
            before = snap.data[i] if i < len(snap.data) else MISSING
            after = now[i] if i < len(now) else MISSING
            if before is MISSING or after is MISSING or not before == after:
                return snap.key(i), _unwrap(before), after
        return None
    if isinstance(snap, dict):
        for key in [*snap, *(k for k in live if k not in snap)]:
            before, after = snap.get(key, MISSING), live.get(key, MISSING)
            if before is MISSING or after is MISSING or not before == after:
                return key, _unwrap(before), after
        return None
    for i in range(max(len(snap), len(live))):
        before = snap[i] if i < len(snap) else MISSING
        after = live[i] if i < len(live) else MISSING
        if before is MISSING or after is MISSING or not before == after:
            return i, _unwrap(before), after
    return None


MISSING = object()


def _unwrap(entry):
    return entry.obj if type(entry) is _Is else entry
