"""The guards of a specialization: Python paths to the traced state, checked on every call.

A compiled call replays tensor operations only; a specialization holds while the Python state its
trace depended on is as it was. ``build_guards`` collects, when a trace ends:

- the **Python containers the call reached** (``reads.reach``: dicts, lists and sets, and the
  user's objects' attribute tables, from the function's globals, closure and arguments), each
  under its path: their plain values (numbers, strings, None, tuples of them) by value, anything
  else by identity -- ``cfg['scale'] = 3.0`` or ``layers.append(...)`` between calls is a new trace,
  whose reason names the entry;
- the plain attributes (and the parameter, buffer, submodule and hook tables) of the modules called
  and of the objects the function names (``hazards.watched_objects``); on the user's objects, and
  their classes and slots, only the attributes whose names the code that ran spells, where names
  tell what it read (``attr_reads``: ``self.iter_num += 1`` between the steps of a loop whose
  compiled step never reads it makes no new trace);
- the dicts and lists that hold a captured tensor, and those holding them: a captured tensor is
  found by identity, so the *path* by which the function reached it is guarded
  (``model.w = Parameter(...)``, ``d["w"] = other``, ``opt.state.clear()``), and ``t.grad`` where
  it held a captured tensor.

``Guards.miss()`` is the per-call check: identity and value comparisons in C loops.
"""

from __future__ import annotations

import operator
import sys
import types
import weakref
from collections.abc import Sequence
from itertools import chain
from operator import is_

from ..tensor import Tensor
from . import attr_reads
from .hazards import _tables, _watchable
from .paths import _attrs, _walk
from .reads import _users_class, selector, short
from .signature import call
from .snapshots import ANY_FLOAT, MISSING, Contents, View, _entry, _Is, changed_entry, same, snapshot

_GRAD = operator.attrgetter("_grad")
_MODULES_GET = sys.modules.get  # (bound once: the interpreter keeps one sys.modules)


class Guards:
    """Checks, per call, that the Python paths to the traced state still lead to the same objects and values."""

    __slots__ = ("pairs", "dicts", "dict_snaps", "lists", "list_snaps", "sets", "set_snaps", "classes",
                 "class_snaps", "same_dicts", "same_lists", "_expected", "grad_owners", "grads",
                 "global_reads", "path_entries", "ordered", "orders", "arrays", "attr_reads", "views", "owners",
                 "owner_classes", "owner_paths", "module_names", "modules")  # fmt: skip

    def __init__(self) -> None:
        # (snapshot, live container, weakref to the owner or None, description, how entries are named:
        # "item" (path[key]), "attr" (path.name) or None (the description, then the key))
        self.pairs: list = []
        self.dicts: list = []
        self.dict_snaps: list = []
        # those of ``dicts`` with two or more keys, and their keys in order (a loop meets them in it)
        self.ordered: list = []
        self.orders: list = []
        self.arrays: list = []  # snapshots.Contents of the numpy arrays reached
        self.views: list = []  # snapshots.View of the other containers reached (a deque, a closure...)
        self.lists: list = []
        self.list_snaps: list = []
        self.sets: list = []
        self.set_snaps: list = []
        self.classes: list = []  # the user's classes' attribute tables (read-only proxies: copied to compare)
        self.class_snaps: list = []
        # Containers of objects compared by identity alone (a list of parameters, an optimizer's
        # per-parameter state): checked in C without a Python ``_Is.__eq__`` per entry.
        self.same_dicts: list = []
        self.same_lists: list = []
        self._expected: tuple = ([], (), (), [], ())  # dict sizes, keys, values, list sizes, items
        # ``t.grad`` paths to captured tensors: weak references to each tensor ``t`` and to the
        # captured ``.grad`` it held (``p.grad = new`` while the old one lives must miss)
        self.grad_owners: list = []
        self.grads: list = []
        # Globals that the other functions the call ran read (a helper's ``SCALE``): per module,
        # (itemgetter of the names, the module's globals, snapshot tuple, names, module name)
        self.global_reads: list = []
        # (dict or list, key, object): entries on the paths to captured tensors (``_holders``)
        self.path_entries: list = []
        # Attribute tables guarded by the names the call's code spells (``add_attributes``): (reader
        # of the guarded entries, the table (an object's or class's, or the object for its slots),
        # snapshot, the entries' types, the names guarded (None: slots), how many of the table's
        # names are guarded, owner, path, the names read)
        self.attr_reads: list = []
        # Weak references to the objects whose attributes are guarded, and their classes: a method or a
        # class attribute read through one comes from its class, which ``obj.__class__ = Other`` changes
        self.owners: list = []
        self.owner_classes: list = []  # (and their paths, to say which changed)
        self.owner_paths: list = []
        # The names in ``sys.modules`` of the modules whose globals are guarded, and the modules there
        self.module_names: list = []
        self.modules: list = []

    def add_class(self, owner, obj, path: str) -> None:
        """Guard that ``obj`` (``owner``: a weak reference to it; ``path``: its name) stays an instance of its class."""
        self.owners.append(owner)
        self.owner_classes.append(type(obj))
        self.owner_paths.append(path)

    def _same_classes(self) -> bool:
        return all(map(is_, map(type, map(call, self.owners)), self.owner_classes))

    def add_globals(self, fn_globals: dict, names: list[str], module: str) -> None:
        """Guard the objects (and plain values) that ``names`` refer to in a module's ``fn_globals``, and
        that the module is still the one ``sys.modules`` holds under its name: a module imported inside the
        call or found by name there (``import config``, ``sys.modules["config"]``) is another one once the
        program imports it anew (``del sys.modules["config"]`` then ``import config``)."""
        getter = operator.itemgetter(*names, *names[:1])  # twice the first: a tuple even for one name
        self.global_reads.append((getter, fn_globals, tuple(map(_entry, getter(fn_globals))), names, module))
        name = fn_globals.get("__name__")
        owner = sys.modules.get(name) if type(name) is str else None
        if owner is not None and getattr(owner, "__dict__", None) is fn_globals and name not in self.module_names:
            self.module_names.append(name)
            self.modules.append(owner)

    def _same_modules(self) -> bool:
        return all(map(is_, map(_MODULES_GET, self.module_names), self.modules))

    def _same_globals(self) -> bool:
        try:
            return all(snap == getter(g) for getter, g, snap, _, _ in self.global_reads)
        except KeyError:  # a name deleted from its module: said by the loop in ``miss``
            return False

    def add_attributes(self, owner, path: str, table, names: frozenset) -> None:
        """Guard the entries of an attribute ``table`` (an object's ``__dict__``, a class's) whose names
        ``names`` holds (``attr_reads.spelled``), and that no other such name appears in it."""
        present = tuple(k for k in table if attr_reads.spelled(k, names))
        extra = [k for k in present if k not in names]  # dunders
        watched = names.union(extra) if extra else names
        self._add_read(_getter(present), table, present, watched, owner, path)

    def add_slots(self, obj, path: str, descriptors: dict) -> None:
        """Guard the slot values ``descriptors`` (name -> member descriptor) of ``obj``."""
        self._add_read(_slot_reader(tuple(descriptors.values())), obj, tuple(descriptors), None, None, path)

    def _add_read(self, read, table, present: tuple, watched, owner, path: str) -> None:
        values = read(table)
        count = -1 if watched is None else sum(map(watched.__contains__, table))
        self.attr_reads.append((read, table, tuple(map(_entry, values)), tuple(map(type, values)), watched, count,
                                owner, path, present))  # fmt: skip

    def _same_attributes(self) -> bool:
        try:
            for read, table, snap, kinds, watched, count, *_ in self.attr_reads:
                values = read(table)
                # types first: ``1 == True``, and a plain number against a tensor would compare elementwise
                if tuple(map(type, values)) != kinds or snap != values:
                    return False
                if watched is not None and sum(map(watched.__contains__, table)) != count:
                    return False  # a name read was added (an instance attribute shadowing a class's)
        except KeyError:  # a name read was deleted
            return False
        return True

    def _attribute_change(self) -> str | None:
        """What changed among the attributes ``add_attributes`` and ``add_slots`` guard, in words."""
        for read, table, snap, _, watched, _, owner, path, present in self.attr_reads:
            if owner is not None and owner() is None:
                continue
            before = dict(zip(present, snap, strict=False))
            if watched is None:  # slots: an unset one reads as absent
                now = {k: v for k, v in zip(present, read(table), strict=False) if v is not MISSING}
                before = {k: v for k, v in before.items() if v is not MISSING}
            else:
                now = {k: table[k] for k in table if k in watched}
            for key in [*before, *(k for k in now if k not in before)]:
                b, a = before.get(key, MISSING), now.get(key, MISSING)
                if b is ANY_FLOAT and type(a) is float:
                    continue
                if b is MISSING or a is MISSING or type(a) is not type(_unwrap(b)) or not b == a:
                    if b is not MISSING and a is not MISSING and b == a:  # the type alone changed
                        return f"{path}.{key} changed: {short(a)} is a {type(a).__name__} now"
                    return _difference(path, "attr", {} if a is MISSING else {key: a}, {} if b is MISSING else {key: b})
        return None

    def add(self, owner, name: str, live, style: str | None = None) -> None:
        snap = snapshot(live)
        self.pairs.append((snap, live, owner, name, style))
        if type(snap) is Contents:
            self.arrays.append(snap)
            return
        if type(snap) is View:
            self.views.append(snap)
            return
        if isinstance(snap, frozenset):
            self.sets.append(live)
            self.set_snaps.append(snap)
            return
        if isinstance(live, types.MappingProxyType):
            self.classes.append(live)
            self.class_snaps.append(snap)
            return
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
            if len(snap) > 1:
                self.ordered.append(live)
                self.orders.append(list(snap))
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
            and list(map(list, self.ordered)) == self.orders
            and all(map(Contents.holds, self.arrays))
            and all(map(View.holds, self.views))
            and all(map(list.__eq__, self.list_snaps, self.lists))
            and all(map(frozenset.__eq__, self.set_snaps, self.sets))
            and all(map(dict.__eq__, self.class_snaps, map(dict, self.classes)))
            and self._same_grads()
            and (not self.global_reads or self._same_globals())
            and all(_holds(*entry) for entry in self.path_entries)
            and (not self.attr_reads or self._same_attributes())
            and (not self.owners or self._same_classes())
            and (not self.modules or self._same_modules())
        ):
            return None
        for name, module in zip(self.module_names, self.modules, strict=True):
            if sys.modules.get(name) is not module:
                return f"sys.modules[{name!r}] is another module now"
        for owner, cls, path in zip(self.owners, self.owner_classes, self.owner_paths, strict=True):
            obj = owner()
            if obj is not None and type(obj) is not cls:
                return f"{path} changed: a {cls.__name__} -> a {type(obj).__name__} (its __class__ was set)"
        for container, key, _ in (e for e in self.path_entries if not _holds(*e)):
            what = "a dict" if isinstance(container, dict) else "a list"
            return f"{what} on the way to a captured tensor changed ({short(key)})"
        for owner, grad in zip(self.grad_owners, self.grads, strict=True):
            t = owner()
            if t is not None and t._grad is not grad():
                return f"the .grad of a tensor of shape {tuple(t._data.shape)} is another tensor now"
        # Deepest first: the containers reached were added level by level, and a dict of plain values
        # is copied into its parent's snapshot too, so the parent would name the change less exactly.
        for snap, live, owner, name, style in reversed(self.pairs):
            if same(snap, live):
                continue
            if owner is not None and owner() is None:
                continue  # the object is gone: nothing reaches the traced state through it any more
            return _difference(name, style, live, snap)
        change = self._attribute_change()  # after the containers: a dict read is named by its own path
        if change is not None:
            return change
        for _, g, snap, names, module in self.global_reads:  # after the containers: they name the entry
            now = {name: g.get(name, MISSING) for name in names}
            if not same(dict(zip(names, snap)), now):
                return _difference(module, "attr", now, dict(zip(names, snap)))
        return None

    def paths_hold(self) -> bool:
        """Whether the ``.grad`` and container paths to the captured tensors hold (``miss`` checks them
        with the rest; ``state_floats.changed`` with the values compared its own way)."""
        return self._same_grads() and all(_holds(*entry) for entry in self.path_entries) and self._same_modules()

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


def _getter(names: tuple):
    """A reader of ``names`` from a table as a tuple (in C; a tuple for one name, or none, too)."""
    if not names:
        return _nothing
    return operator.itemgetter(*names, *names[:1])


def _nothing(table) -> tuple:
    return ()


def _slot_reader(descriptors: tuple):
    def read(obj) -> tuple:
        values = []
        for d in descriptors:
            try:
                values.append(d.__get__(obj, type(obj)))
            except AttributeError:  # an unset slot
                values.append(MISSING)
        return tuple(values)

    return read


def _unwrap(entry):
    return entry.obj if type(entry) is _Is else entry


def _difference(name: str, style: str | None, live, snap) -> str:
    """What changed, in words: ``cfg['scale'] changed: 2.0 -> 3.0``, ``layers changed (1 -> 2 entries)``."""
    if type(snap) is Contents:
        return f"{name} changed: a value of the numpy array"
    change = changed_entry(live, snap)
    if type(snap) is View:
        if change is None:
            return f"{name} changed: its contents ({type(snap.obj).__name__})"
        style = "item" if snap.names is None else "attr"
    if change is None:
        if isinstance(live, dict) and len(snap) == len(live) and set(snap) == set(live):
            return f"{name} changed: the order of its keys"
        return f"{name} changed" + (f" ({len(snap)} -> {len(live)} entries)" if len(snap) != len(live) else "")
    key, before, after = change
    if before is ANY_FLOAT:  # (a float read at each call, state_floats.py)
        return f"{name}{selector(style or 'item', key)} changed: {short(after)} is not a float"
    if style is None:
        return f"{name} changed ({short(key)})"
    where = f"{name}{selector(style, key)}"
    if before is not MISSING and after is not MISSING and not isinstance(before, _PLAIN):
        return f"{where} changed: another {type(after).__name__} object now"
    words = [short(v) if v is not MISSING else "(absent)" for v in (before, after)]
    return f"{where} changed: {words[0]} -> {words[1]}"


_PLAIN = (int, float, str, bytes, complex, type(None), tuple, frozenset, list, dict, set)


def _holders(refs: dict, roots: list) -> tuple[list, list]:
    """The dicts and lists that hold one of the tensors ``refs`` (id -> tensor), and the paths to them
    through other dicts, lists and objects' attributes (``opt.state[p]['exp_avg']``: ``opt.state.clear()``
    and ``load_state_dict``'s new ``opt.state`` leave the per-parameter dicts as they were). A list or
    dict on such a path that holds only containers and objects is among the first list (guarded whole,
    by identity); one that holds plain values too (a ``param_groups`` dict: its learning rate is read
    per call, not guarded), and an object's attribute table, give ``(table, key, value)`` entries for
    the keys on the paths."""
    if not refs:
        return [], []
    walked = []  # (object, the dict or list of its entries, its values)
    for obj, values in _walk(roots):
        table = obj if isinstance(obj, dict | list) else _attrs(obj)
        if table:
            walked.append((obj, table, values))
    # `v is not None`: refs.get() answers None for a missing id, which would match a None value.
    holding = {id(obj) for obj, _, values in walked if any(v is not None and refs.get(id(v)) is v for v in values)}
    holders = [obj for obj, table, _ in walked if id(obj) in holding and table is obj]
    on_paths = set(holding)
    while True:  # up the paths, a level a round (the walk goes 5 levels down)
        more = {
            id(obj) for obj, _, values in walked if id(obj) not in on_paths and any(id(v) in on_paths for v in values)
        }
        if not more:
            break
        on_paths |= more
    entries = []
    guarded_whole = {id(h) for h in holders}
    for obj, table, values in walked:
        if id(obj) not in on_paths or id(obj) in guarded_whole:
            continue
        if table is obj and not any(isinstance(v, _PLAIN_VALUES) for v in values):
            holders.append(obj)
            continue
        items = table.items() if isinstance(table, dict) else enumerate(table)
        entries += [(table, k, v) for k, v in items if id(v) in on_paths or (v is not None and refs.get(id(v)) is v)]
    return holders, entries


_PLAIN_VALUES = (int, float, str, bytes, complex, type(None), tuple, frozenset)
_ABSENT = object()


def _holds(table, key, value) -> bool:
    if isinstance(table, dict):
        return table.get(key, _ABSENT) is value
    return key < len(table) and table[key] is value


def build_guards(objects: list, modules: list, captured: list, named: Sequence = (), reached: Sequence = (),
                 names: frozenset | None = None, owners: dict | None = None) -> Guards:  # fmt: skip
    """Guards of a new specialization: the containers ``reached`` (``reads.reach``: ``(path, container,
    kind)``), the attribute tables of the watched objects and called modules, and the dicts and
    lists holding each captured tensor when the trace ended. ``names``: the names the call's code
    spells (``hazards.Watch.read_names``; None: every attribute counts); ``owners``: the object of
    each attribute table among ``reached``, by the table's id (``reads.reach``)."""
    guards = Guards()
    seen: set[int] = set()
    owners = owners or {}
    for path, live, kind in reached:
        if id(live) not in seen:
            seen.add(id(live))
            obj = owners.get(id(live))
            if obj is None:
                guards.add(None, path, live, kind)
            else:
                _guard_object(guards, obj, path, names, seen, first=live, style=kind)
    roots = [*objects, *(ref() for ref, *_ in modules)]
    roots += [v for obj in list(roots) if obj is not None for v in list(_attrs(obj).values()) if _watchable(v)]
    for obj in roots:
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        _guard_object(guards, obj, type(obj).__name__, names, seen)
    refs = {id(t): t for t in captured if t is not None}
    reachable = [v for _, values in _walk([*roots, *named]) for v in values if isinstance(v, Tensor)]
    guards.add_grad_paths([*refs.values(), *(v for v in named if isinstance(v, Tensor)), *reachable], refs)
    holders, entries = _holders(refs, [*roots, *named])
    guards.path_entries = [e for e in entries if id(e[0]) not in seen]  # not in a table guarded whole
    for holder in holders:
        if id(holder) not in seen:
            seen.add(id(holder))
            what = "a dict" if isinstance(holder, dict) else "a list"
            guards.add(None, f"{what} on the way to a captured tensor", holder)
    return guards


def _guard_object(guards: Guards, obj, path: str, names: frozenset | None, seen: set, first=None,
                  style: str | None = None) -> None:  # fmt: skip
    """Guard ``obj``'s attribute table and the dicts in it (a module's tables; ``first``: the table
    alone, found by ``reads.reach``, whose ``style`` names a whole table's entries), its slots and its
    user's classes' tables: whole, or the entries ``names`` spells where ``attr_reads.guarded_names``
    allows it."""
    try:
        owner = weakref.ref(obj)
    except TypeError:
        owner = None
    allowed = attr_reads.guarded_names(obj, names)
    if owner is not None and not isinstance(obj, type):
        guards.add_class(owner, obj, path)
    tables = _tables(obj) if isinstance(getattr(obj, "__dict__", None), dict) else []
    attributes = tables[0][0] if tables else None
    for live, _ in tables:
        if id(live) in seen and live is not first or first is not None and live is not first:
            continue  # (the dicts in a table ``reads.reach`` found are among ``reached``, with their paths)
        seen.add(id(live))
        if allowed is None:
            guards.add(owner, path, live, style if live is attributes else None)
        elif live is attributes:
            guards.add_attributes(owner, path, live, allowed)
        elif any(v is live and attr_reads.spelled(k, allowed) for k, v in attributes.items()):  # type: ignore[union-attr]
            guards.add(owner, path, live)
    if isinstance(obj, type):  # a class reached (``reads.reach``): its own table
        seen.add(id(obj))
        table = obj.__dict__ if first is None else first
        if allowed is None:
            guards.add(None, path, table, style)
        else:
            guards.add_attributes(None, path, table, allowed)
        return
    slots = attr_reads.slots(type(obj))
    if slots:
        if allowed is not None:
            slots = {k: d for k, d in slots.items() if attr_reads.spelled(k, allowed)}
        guards.add_slots(obj, path, slots)
    for cls in type(obj).__mro__:
        if cls is not object and _users_class(cls) and id(cls) not in seen:
            seen.add(id(cls))
            if allowed is None:
                guards.add(None, cls.__name__, cls.__dict__, "attr")
            else:
                guards.add_attributes(None, cls.__name__, cls.__dict__, allowed)
