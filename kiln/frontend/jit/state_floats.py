"""Floats read from Python state made per-call inputs: one program for every value (PyTorch's unspecialized floats).

A compiled call guards the plain values its trace read from Python state (``guards.py``), so a float
the user changes between calls -- a KL weight annealed in ``self.beta``, ``cfg["w"]``, a module-level
``TEMPERATURE``, a module's ``momentum`` -- made a new trace and compile per value, up to the
recompile limit, and eager calls after it. ``torch.compile`` makes such a float a graph input once it
sees a second value; kiln does too, with the machinery of float arguments (``scalar_args.py``):

1. A call whose guards miss only because such entries hold other floats (``changed``: a dict's entry,
   a list's item, an object's attribute or slot, a module's global, a closure variable of the function
   or of a helper it runs, a deque's item; never a class attribute, whose table is read-only, nor a
   ``ContextVar``'s value, which is set by tokens) is **traced watched**: for the duration of the call each entry holds a
   ``WatchedScalar`` (its comparisons, truth tests and conversions tell the trace; its arithmetic
   becomes ops of the program), and an op that takes it reads a 0-d float64 tensor of the function's
   (``holder``), which a prologue fills from the entry before every call of the program.
2. Such a program still guards the entries by value: the first trace read them as constants, so there
   is no earlier program to compare with. The next value's call is traced watched too, and when
   nothing was told and the two programs are the same (``scalar_args.same_program``), the newer one's
   guards accept **any float** there (``ANY_FLOAT``): one program serves every value. Otherwise the
   entries stay guarded by value, and where the reason holds at every value (Python compares the
   float, or the results need gradients outside the call), no later trace watches them.

Three traces rather than PyTorch's two; in exchange a float that reaches the program only through
C code (``math.exp(self.t)``: a constant that follows the value) is caught by the comparison.
"""

from __future__ import annotations

import collections
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir.types import CPU
from ..tensor import Tensor, make_tensor
from . import state
from .reads import selector
from .scalar_args import WatchedScalar
from .snapshots import ANY_FLOAT, Contents, View, same
from .specialization import same_global


class Cell:
    """A closure variable's cell as a table of one entry (``cell["cell_contents"]``): the function's
    closure variable is then an entry like a dict's (``beta = ...`` in the enclosing function)."""

    __slots__ = ("cell",)

    def __init__(self, cell) -> None:
        self.cell = cell

    def __getitem__(self, key: str):
        return self.cell.cell_contents

    def __setitem__(self, key: str, value) -> None:
        self.cell.cell_contents = value


class Slot:
    """An object's slots as a table (``slots["beta"]``: ``obj.beta``), for an object without a ``__dict__``
    (``@dataclass(slots=True)``) whose slot holds the float."""

    __slots__ = ("obj",)

    def __init__(self, obj) -> None:
        self.obj = obj

    def __getitem__(self, key: str):
        return getattr(self.obj, key)

    def __setitem__(self, key: str, value) -> None:
        setattr(self.obj, key, value)


def _owner(table):
    """What an entry's identity is kept by: the dict, list or deque, a closure variable's cell, or the
    object whose slot it is."""
    kind = type(table)
    return table.cell if kind is Cell else table.obj if kind is Slot else table


@dataclass(frozen=True, eq=False)
class Change:
    """An entry of Python state (``table[key]``: a dict, a list or a ``Cell``) that holds another float
    than the one a specialization's trace read: ``before``, ``now``, and its name in the user's words."""

    table: Any  # a dict, a list or a Cell
    key: Any
    before: float
    now: float
    name: str

    @property
    def slot(self) -> tuple[int, object]:
        return id(_owner(self.table)), self.key


def changed(spec, fn_globals: dict | None, cells: dict, leaves: list) -> list[Change] | None:
    """The float entries whose values alone make ``spec`` miss this call, or None when anything else
    differs (or nothing does). ``cells``: the function's closure cells by ``"closure:" + name``. A spec
    still compiling in the background (a ``PendingSpecialization``) has its Python values compared only:
    the new trace's program must equal its program anyway."""
    if hasattr(spec, "miss_before_values") and spec.miss_before_values(leaves) is not None:
        return None
    found: list[Change] = []
    for name, value in spec.globals_guard:
        cell = cells.get(name)
        table = (fn_globals if fn_globals is not None else {}) if cell is None else Cell(cell)
        try:
            now = table[name]
        except (KeyError, ValueError):  # (a name deleted, an empty cell)
            return None
        if same_global(now, value):
            continue
        if type(value) is not float or type(now) is not float:
            return None
        found.append(Change(table, name, value, now, name.removeprefix("closure:")))
    if spec.guards is not None and not _guard_changes(spec.guards, found):
        return None
    # an entry reached by two paths (``cfg`` named as a global and as ``self.cfg``) is one entry
    return list({change.slot: change for change in reversed(found)}.values())[::-1] or None


def _guard_changes(guards, found: list[Change]) -> bool:
    """Add to ``found`` the float entries that differ among ``guards``' containers, attribute tables and
    module globals; False when anything else differs (compared as ``Guards.miss`` compares it)."""
    if not guards.paths_hold():
        return False
    for snap, live, owner, name, style in guards.pairs:
        if owner is not None and owner() is None:
            continue
        if type(snap) is View:  # (a helper's closure variables, a deque: entries of their own)
            if not (snap.holds(live) or _view_entries(snap, live, name, found)):
                return False
            continue
        if type(snap) is Contents or isinstance(snap, frozenset) or not isinstance(live, dict | list):
            if not same(snap, live):
                return False
            continue
        if not _entries(snap, live, name, style, found):
            return False
    for read, table, snap, kinds, watched, count, _, path, present in guards.attr_reads:
        try:
            values = read(table)
        except KeyError:
            return False
        if tuple(map(type, values)) != kinds or (
            watched is not None and sum(map(watched.__contains__, table)) != count
        ):
            return False
        if watched is None and type(table) is not dict:  # an object's slots
            if not _values(Slot(table), present, snap, values, path, found):
                return False
            continue
        if type(table) is not dict and snap != values:  # (a class's table: not stored into)
            return False
        if not _values(table, present, snap, values, path, found):
            return False
    for getter, g, snap, names, module in guards.global_reads:
        try:
            values = getter(g)
        except KeyError:
            return False
        if not _values(g, names, snap, values, module, found):
            return False
    return True


def _view_entries(snap: View, live, name: str, found: list[Change]) -> bool:
    """``_entries`` for a ``View``'s entries: the closure variables of a function (each a ``Cell``) and
    the items of a deque; False when another entry (a default value, a ContextVar's) differs."""
    if type(snap.data) is not list or snap.obj is not live:
        return False
    now = snap.read(live)
    if len(now) != len(snap.data):
        return False
    if isinstance(live, collections.deque):
        tables: list = [live] * len(now)
    elif isinstance(live, types.FunctionType):
        tables = [Cell(cell) for cell in live.__closure__ or ()]
    else:
        return False
    for i, (before, after) in enumerate(zip(snap.data, now, strict=True)):
        if before == after:
            continue
        if i >= len(tables) or type(before) is not float or type(after) is not float:
            return False
        key = i if tables[i] is live else "cell_contents"
        where = f"{name}{selector('item' if key == i else 'attr', snap.key(i))}"
        found.append(Change(tables[i], key, before, after, where))
    return True


def _values(table, names, snap: tuple, values: tuple, path: str, found: list[Change]) -> bool:
    """``_entries`` for a getter's snapshot tuple of ``table``'s entries ``names`` (``path.name`` each)."""
    for key, before, now in zip(names, snap, values, strict=False):
        if before == now:
            continue
        if type(before) in (dict, list) and type(now) is type(before) and type(table) is dict:  # a nested copy
            if not _entries(before, now, f"{path}.{key}", "item", found):
                return False
        elif type(before) is float and type(now) is float:
            found.append(Change(table, key, before, now, f"{path}.{key}"))
        else:
            return False
    return True


def _entries(snap, live, name: str, style: str | None, found: list[Change]) -> bool:
    """Add the float entries of ``live`` that differ from ``snap`` (a snapshot's copy of it, whose nested
    copies of plain containers are walked too); False when another entry differs."""
    if isinstance(snap, dict):
        if not isinstance(live, dict) or not _same_keys(snap, live):
            return False
        items: Iterable[tuple[Any, Any]] = snap.items()
    else:
        if not isinstance(live, list) or len(snap) != len(live):
            return False
        items = enumerate(snap)
    for key, before in items:
        now = live[key]
        if before == now:
            continue
        where = f"{name}{selector(style or ('attr' if isinstance(key, str) and key.isidentifier() else 'item'), key)}"
        if type(before) in (dict, list) and type(now) is type(before):  # a copy of a nested plain container
            if not _entries(before, now, where, "item", found):
                return False
        elif type(before) is float and type(now) is float:
            found.append(Change(live, key, before, now, where))
        else:
            return False
    return True


#: Keys compared by value as well as by identity; any other key (a tensor: an optimizer's ``state`` is
#: keyed by parameters, whose ``==`` is elementwise) must be the very object.
_PLAIN_KEYS = (str, int, bool, bytes, type(None))


def _same_keys(snap: dict, live: dict) -> bool:
    """Whether ``live`` has ``snap``'s keys in its order (never comparing a key with another's ``==``
    unless both are plain)."""
    if len(snap) != len(live):
        return False
    return all(a is b or (type(a) is type(b) and type(a) in _PLAIN_KEYS and a == b) for a, b in zip(snap, live))


def relax(spec, changes: list[Change], fn_globals: dict | None) -> None:
    """Make ``spec``'s guards accept any float at the entries ``changes`` names, wherever its snapshots
    hold them (nested copies of plain containers too)."""
    named = {change.key for change in changes if type(change.table) is Cell or change.table is fn_globals}
    spec.globals_guard = [(n, ANY_FLOAT if n in named else v) for n, v in spec.globals_guard]
    slots = {change.slot for change in changes}
    guards = spec.guards
    if guards is None:
        return
    for snap, live, *_ in guards.pairs:
        if isinstance(snap, dict | list) and isinstance(live, dict | list):
            _relax_entries(snap, live, slots)
        elif type(snap) is View and type(snap.data) is list:
            _relax_view(snap, live, slots)
    guards.attr_reads = [
        (read, table, _relaxed(snap, table, present, slots), kinds, *rest, present)
        for read, table, snap, kinds, *rest, present in guards.attr_reads
    ]
    guards.global_reads = [
        (getter, g, _relaxed(snap, g, names, slots), names, module)
        for getter, g, snap, names, module in guards.global_reads
    ]


def _relaxed(snap: tuple, table, names, slots: set) -> tuple:
    """A getter's snapshot tuple (its names, then the first again) with ``ANY_FLOAT`` at ``slots``; the
    nested copies of plain containers in it relaxed in place."""
    keys = (*names, *names[:1])
    out = []
    for key, entry in zip(keys, snap, strict=False):
        if (id(table), key) in slots and type(entry) is float:
            entry = ANY_FLOAT
        elif type(entry) in (dict, list) and isinstance(table, dict) and type(table.get(key)) is type(entry):
            _relax_entries(entry, table[key], slots)
        out.append(entry)
    return tuple(out)


def _relax_view(snap: View, live, slots: set) -> None:
    """``ANY_FLOAT`` at the entries of a ``View`` (a deque's items, a function's closure cells) in ``slots``."""
    cells = [id(cell) for cell in live.__closure__ or ()] if isinstance(live, types.FunctionType) else []
    assert type(snap.data) is list  # (a deque's or a closure's entries, not an array's bytes)
    for i, entry in enumerate(snap.data):
        owned = (cells[i], "cell_contents") if i < len(cells) else (id(live), i)
        if type(entry) is float and owned in slots:
            snap.data[i] = ANY_FLOAT


def _relax_entries(snap, live, slots: set) -> None:
    items = list(snap.items()) if isinstance(snap, dict) else list(enumerate(snap))
    for key, entry in items:
        if (id(live), key) in slots and type(entry) is float:
            snap[key] = ANY_FLOAT
        elif type(entry) in (dict, list):
            try:
                nested = live[key]
            except (KeyError, IndexError):
                continue
            if type(nested) is type(entry):
                _relax_entries(entry, nested, slots)


# ---------------------------------------------------------------------- the watched trace
def holder(holders: dict, change: Change) -> Tensor:
    """The function's 0-d float64 tensor for an entry (one per entry: every program reading it shares it),
    which ``fill`` sets from the entry before each call of a program that reads it."""
    found = holders.get(change.slot)
    if found is not None and found[0] is _owner(change.table):
        return found[1]
    token = state.current.set(None)  # made outside the trace: state the program reads, not a value it made
    try:
        tensor = make_tensor(np.array(change.now, dtype=np.float64), CPU, dt.float64)
    finally:
        state.current.reset(token)
    holders[change.slot] = (_owner(change.table), tensor)  # (kept alive: its id names the entry)
    return tensor


def fill(array: np.ndarray, table: dict | list | Cell, key) -> None:
    """A prologue: the entry's float (a guard checked it is one) into its holder's memory."""
    array[()] = table[key]


def install(changes: list[Change], trace, holders: dict) -> list[tuple[Change, WatchedScalar]]:
    """Put a ``WatchedScalar`` of ``trace`` in each changed entry (its shadow: the value the earlier trace
    read), read through the entry's holder; returns what ``restore`` puts back."""
    installed = []
    for change in changes:
        tensor = holder(holders, change)
        trace.run_prologue(fill, (tensor._data, change.table, change.key), {})
        watched = WatchedScalar(change.now, trace, change.before)
        trace.scalar_args[id(watched)] = (watched, tensor, None)
        change.table[change.key] = watched
        installed.append((change, watched))
    return installed


def restore(installed: list[tuple[Change, WatchedScalar]]) -> None:
    """The user's own floats back in the entries that still hold their ``WatchedScalar`` (a call that
    stored another value there keeps it: the trace's hazard watch has seen that)."""
    for change, watched in installed:
        try:
            if change.table[change.key] is watched:
                change.table[change.key] = change.now
        except (KeyError, IndexError, ValueError):  # (removed, or a cell emptied)
            pass


def names(changes: list[Change]) -> str:
    return ", ".join(change.name for change in changes)
