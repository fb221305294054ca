"""The Python containers a traced call reaches besides tensors, found with the paths that reach them.

A compiled call replays tensor operations only: the Python values its trace read are frozen into
the graph (``x * cfg["scale"]`` multiplies by the 2.0 read then), and what the traced call stored
into Python containers is not stored again. ``reach`` finds the dicts, lists and sets, and the
attribute tables of the user's objects, reachable from what the function names (its globals,
closure variables and arguments), each with its path (``cfg``, ``self.cfg['inner']``), so that
the compiler can

- **guard** them (``hazards.Guards``): each call checks that they hold the values and objects
  they held when traced; a changed entry makes a new trace, whose reason names the entry
  (``cfg['scale'] changed: 2.0 -> 3.0``);
- **watch** them while the call is traced (``hazards.Watch``): a store into one (``d[k] = v``,
  ``del d[k]``, ``lst.append(v)``...) is something a compiled call would not repeat, so the
  call runs eagerly, with the path and the user's line said;
- **list** them for ``kiln.explain`` (``records``: ``PythonRead`` per value guarded, with the
  line that read it).

What is entered: dicts, lists, tuples and sets; the attributes of objects whose class is the
user's (their slots where they have no ``__dict__``), those classes' own (``self.scale`` read from the
class) and their user's metaclasses' (a metaclass property); a kiln module's submodules (and a user
module's public attributes); the closures and default argument values of the user's functions --
plain values too, compared per call (``loss = make_loss(alpha)``: ``alpha`` rebound) --, the object
a bound method belongs to, and what a ``functools.partial`` was made with. Objects of kiln's other
classes (an optimizer: its hyperparameters are read per call through tensors), of the standard
library and of installed packages (their caches are not the program's state) are not, but for the
state containers the standard library makes for the program: a ``deque``, an ``array.array``, a
``bytearray``, a ``MappingProxyType``, a ``ContextVar`` (its value; ``snapshots.View``), a
``threading.local`` (the calling thread's attributes) and the
namespaces whose classes define no public attribute (``types.SimpleNamespace``, ``argparse.Namespace``:
``_attribute_bag``); the libraries' stores of settings (``_keyed_store``: an OmegaConf or ``ConfigDict``
config, which hands its values out by ``__getattr__``/``__getitem__``, or a library's dataclass), whole,
with the library objects they hold (a config's nodes); and the function a library's wrapper calls
(``functools.lru_cache``'s ``__wrapped__``). The user's modules the code imports while traced
(``import config`` inside the function) are read like those its globals name (``imported``), and every
one of them where the code can find a module by a computed name (``sys.modules[name]``,
``importlib.import_module(name)``, ``__import__``: ``finds_modules``); a module's globals are guarded by
the names the code spells, or all of them where it reads attributes by names it computes
(``getattr(config, name)``, ``vars(config)[key]``: ``users_modules``). Besides containers:

- a **numpy array** is guarded by its contents (``snapshots.Contents``: compared at each call, at
  memory speed), since a value Python reads out of it (``float(table[i])``, ``kiln.tensor(data[:8])``)
  is a constant of the trace -- unless a trace made its memory a graph input (``snapshots.not_inputs``):
  a buffer the caller refills then keeps its program;
- the **process's state** the call's code names (``os.environ``, ``sys.argv``: ``process_state``).

Not seen (a stale constant, said nowhere): state of a library object with methods that is none of
the above (a logger, a progress bar, a tokenizer held in a dict: its state is its own making; such an
object is guarded, by its attributes, only where the function's globals, closure or arguments name
it, ``hazards.watched_objects``); a module found by a computed name by a library's code rather than
the user's (only the user's code is read by ``finds_modules``); the cached results of an
``lru_cache``'d helper (the function it wraps is reached; a cache filled from state that changed
since is stale in eager calls too).
"""

from __future__ import annotations

import array
import collections
import collections.abc
import contextvars
import functools
import inspect
import os
import site
import sys
import sysconfig
import types
import weakref
from collections.abc import Sequence

import numpy as np

from ..tensor import Tensor
from .locations import KILN_DIR

# (the user's lines and kiln.explain's table, in read_records.py: reads' names for the guards and the watch)
from .read_records import (
    _LOADS,
    _NAME_LOADS,
    global_records,
    instructions,
    read_line,
    records,
    selector,
    short,
    store_line,
)
from .snapshots import _CONTAINERS, _SCALARS, THREAD_LOCAL, slot_names, viewed

__all__ = ["global_records", "instructions", "read_line", "records", "selector", "short", "store_line"]

_NOT_ENTERED = (Tensor, np.ndarray, *_SCALARS, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                types.MethodType, type)  # fmt: skip
#: the methods of dict, list and set that change them (a call of one from the user's code breaks)
MUTATORS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update", "setdefault", "popitem",
    "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update",
    "__setitem__", "__delitem__", "__iadd__", "__imul__", "__ior__", "__iand__", "__isub__", "__ixor__",
})  # fmt: skip


# ---------------------------------------------------------------------- whose objects are entered
#: The names of the folders that installers put packages in.
_PACKAGE_FOLDERS = frozenset({"site-packages", "dist-packages"})


def library_folders() -> tuple[str, ...]:
    """The standard library's and installed packages' folders: the interpreter's (``sysconfig``), the
    user's site packages, and any folder on ``sys.path`` named as installers name theirs (``pip install
    --target``, another environment's packages on ``PYTHONPATH``), whose code is a library's too."""
    path = tuple(sys.path)
    if path != _LAST_PATH[0]:  # (what the folders on the path add, worked out again where it changed)
        on_path = tuple(p for p in path if os.path.basename(p.rstrip(os.sep)) in _PACKAGE_FOLDERS)
        _LAST_PATH[:] = [path, _library_folders(on_path)]
    return _LAST_PATH[1]


_LAST_PATH: list = [None, ()]  # sys.path when last read, and the folders it gave


@functools.cache
def _library_folders(on_path: tuple[str, ...]) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    found += [*getattr(site, "getsitepackages", list)(), site.getusersitepackages(), *on_path]
    return tuple(dict.fromkeys(os.path.realpath(p) + os.sep for p in found))


_USERS_CLASSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _users_class(cls) -> bool:
    """Whether ``cls`` is defined by the user's program (not kiln, the standard library or a package)."""
    known = _USERS_CLASSES.get(cls)
    if known is None:
        module = sys.modules.get(cls.__module__)
        filename = os.path.realpath(getattr(module, "__file__", None) or "<none>")
        known = cls.__module__ != "builtins" and not filename.startswith((KILN_DIR, *library_folders()))
        _USERS_CLASSES[cls] = known
    return known


def kilns(cls) -> bool:
    """Whether ``cls`` is kiln's own (not a package whose name merely begins with ``kiln``)."""
    return cls.__module__ == "kiln" or cls.__module__.startswith("kiln.")


_BAGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _attribute_bag(cls) -> bool:
    """Whether ``cls`` (a library's) holds the program's state in its attribute table: a namespace,
    whose instances hold only what the program sets on them (``types.SimpleNamespace``,
    ``argparse.Namespace``: a config passed around; its classes define no public attribute), or a
    container written in Python, whose entries are in its attributes (``collections.UserDict``'s
    ``data``, ``ChainMap``'s ``maps``). Another library object with methods of its own (a logger, a
    progress bar) keeps state of its own making, which is not the program's; kiln's are its own."""
    known = _BAGS.get(cls)
    if known is None:
        names = [k for base in cls.__mro__ if base is not object for k in vars(base)]
        namespace = not any(not k.startswith("_") for k in names)
        container = issubclass(cls, collections.abc.Mapping | collections.abc.Sequence | collections.abc.Set)
        known = "__dict__" in dir(cls) and (namespace or container) and not kilns(cls)
        _BAGS[cls] = known
    return known


_KEYED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _keyed_store(cls) -> bool:
    """Whether ``cls`` (a library's) is a store of the program's values that hands them out by key or
    by field: a class of it defines ``__getattr__``, ``__getattribute__`` or ``__getitem__`` in Python
    (an OmegaConf or ``ml_collections`` config: its values in a private dict, read as ``cfg.lr`` or
    ``cfg["lr"]``), or it is a dataclass (a library's training arguments: ``args.lr``). What it holds
    is the program's settings, read by the call: its attribute table is followed and guarded whole,
    and the library objects in it too (a config's nodes, each holding a value). kiln's are its own."""
    known = _KEYED.get(cls)
    if known is None:
        readers = ("__getattr__", "__getattribute__", "__getitem__")
        known = not kilns(cls) and (
            "__dataclass_fields__" in dir(cls)
            or any(isinstance(base.__dict__.get(name), types.FunctionType) for base in cls.__mro__ for name in readers)
        )
        _KEYED[cls] = known
    return known


def _is_module_dict(d: dict) -> bool:
    module = sys.modules.get(d.get("__name__")) if isinstance(d.get("__name__"), str) else None  # type: ignore[arg-type]
    return module is not None and getattr(module, "__dict__", None) is d


def _entered(v) -> bool:
    if isinstance(v, type):
        return _users_class(v)  # the user's class: its attributes (``Config.scale``)
    if isinstance(v, types.FunctionType):
        return _users_function(v)
    if isinstance(v, types.MethodType):  # ``step = trainer.scaled``: the object it is bound to
        return _entered(v.__self__) or _entered(v.__func__)
    if isinstance(v, Tensor):  # its hooks, and the Python attributes set on it (``w.scale``; _WATCHING)
        return bool(v._hooks or v._post_accumulate_hooks or v.__dict__) or _WATCHING.get()
    if isinstance(v, np.ndarray | types.MappingProxyType) or viewed(v):
        return True
    if isinstance(v, (*_CONTAINERS, tuple)):
        return True
    return not isinstance(v, _NOT_ENTERED) and (hasattr(v, "__dict__") or _slots_only(v))


def _slots_only(obj) -> bool:
    """Whether ``obj`` is the user's object whose attributes are slots alone (no ``__dict__``)."""
    return not hasattr(obj, "__dict__") and bool(slot_names(type(obj))) and _users_class(type(obj))


def _users_function(fn: types.FunctionType) -> bool:
    """Whether ``fn`` is the user's function holding state of its own -- a closure, or default
    argument values (``def helper(x, cfg=CFG)``): what it reads or changes there is Python state
    from outside the call, though the compiled function names only ``fn``."""
    holds = fn.__closure__ is not None or fn.__defaults__ is not None or fn.__kwdefaults__ is not None
    return holds and not fn.__code__.co_filename.startswith((KILN_DIR, *library_folders()))


#: A module's tables of the functions it calls on the user's behalf (``register_forward_hook``...).
_MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")


def _called_for(path: str, obj) -> list:
    """The user's functions kiln calls on ``obj``'s behalf (a function's own closure values, a
    tensor's hooks), as children to follow: whatever they change is reached from the call too."""
    if isinstance(obj, types.FunctionType):
        cells = zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=True)
        return [(f"{path}.<closure>.{name}", cell.cell_contents) for name, cell in cells
                if _filled(cell) and _entered(cell.cell_contents)] + [
                (f"{path}.<{where}>", value) for where, value in _defaults(obj)]  # fmt: skip
    hooks = [*(obj._hooks or ()), *(obj._post_accumulate_hooks or ())]
    return [(f"{path}.<hook {i}>", hook) for i, hook in enumerate(hooks) if _entered(hook)]


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell (a variable not yet assigned) raises
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------- the walk
def roots(compiled, args: tuple, kwargs: dict, closure_values: dict) -> list[tuple[str, object]]:
    """``(name, object)`` for what a compiled function can reach Python state through: the globals and
    closure variables it names, the object it is a method of, and its arguments by parameter name."""
    out = named_roots(compiled, closure_values)
    fn = compiled.fn
    try:
        signature = inspect.signature(fn.forward if hasattr(fn, "forward") else fn)
        out.extend(signature.bind(*args, **kwargs).arguments.items())
    except (TypeError, ValueError):  # no signature to read: positions stand for names
        out.extend((f"argument {i}", a) for i, a in enumerate(args))
        out.extend(kwargs.items())
    return out


def named_roots(compiled, closure_values: dict, leaves: Sequence = ()) -> list[tuple[str, object]]:
    """The globals and closure variables a compiled function names, the object it is a method of
    and the objects among the flattened arguments ``leaves`` (``argument i``, as the call's key
    names them: the arguments' own tuples, lists and dicts are in the key already)."""
    out = [(name.removeprefix("closure:"), value) for name, value in compiled.guarded_names(closure_values)]
    fn = compiled.fn
    owner = fn if hasattr(fn, "forward") else getattr(fn, "__self__", None)
    if owner is not None:
        out.append(("self", owner))
    out.extend((f"argument {i}", leaf) for i, leaf in enumerate(leaves) if _entered(leaf))
    out.extend(_defaults(fn))
    return out


def _defaults(fn) -> list[tuple[str, object]]:
    """The containers and objects among a function's default argument values (``def f(x, cfg=CFG)``):
    state the call reaches like a global's, held by the function itself."""
    fn = getattr(fn, "__func__", fn)
    names = getattr(getattr(fn, "__code__", None), "co_varnames", ())
    defaults = getattr(fn, "__defaults__", None) or ()
    positional = getattr(getattr(fn, "__code__", None), "co_argcount", 0)
    found = list(zip(names[positional - len(defaults) : positional], defaults, strict=True)) if defaults else []
    found += list((getattr(fn, "__kwdefaults__", None) or {}).items())
    return [(f"default {name}", value) for name, value in found if _entered(value)]


def global_names(code, fn_globals: dict) -> list[str]:
    """The globals of ``fn_globals`` that ``code`` (not its nested functions) reads."""
    loads = dict.fromkeys(arg for _, op, arg in instructions(code) if op in ("LOAD_GLOBAL", "LOAD_NAME"))
    return [name for name in loads if name in fn_globals]


def module_name(fn_globals: dict) -> str:
    """How paths name a module's globals: the last part of its name (``helpers.SCALE``)."""
    return str(fn_globals.get("__name__", "?")).rsplit(".", 1)[-1]


def users_modules(named: Sequence, attr_names: frozenset | None) -> list[tuple[dict, list[str]]]:
    """``(module globals, names)`` for the user's modules among ``named`` (``(name, object)`` pairs)
    and the user's modules they hold, by the attribute names the call's code loads (``import config``
    then ``config.SCALE``): read like a helper's globals, so guarded name by name (``merged_globals``)."""
    found: list[tuple[dict, list[str]]] = []
    level, seen = [obj for _, obj in named if isinstance(obj, types.ModuleType)], set()
    # where the code reads attributes by computed names (``getattr(config, name)``), or was not seen, every
    # global of these modules counts (but their own ``__dunders__``: ``__warningregistry__``...)
    every = attr_names is None or getattr(attr_names, "computed", False)
    while level:
        following = []
        for module in level:
            if id(module) in seen or not _users_module(module):
                continue
            seen.add(id(module))
            table = module.__dict__
            names = [n for n in table if not _dunder(n)] if every else [n for n in attr_names or () if n in table]
            if names:
                found.append((table, names))
                following += [table[n] for n in names if isinstance(table[n], types.ModuleType)
                              and (attr_names is None or n in attr_names)]  # fmt: skip
        level = following
    return found


def _dunder(name) -> bool:
    return type(name) is not str or (name.startswith("__") and name.endswith("__"))


def _users_module(module: types.ModuleType, folders: tuple | None = None) -> bool:
    """Whether ``module`` is the user's program's (a file outside kiln, the standard library and packages:
    ``folders``, ``library_folders()`` where None)."""
    filename = getattr(module, "__file__", None)
    return type(filename) is str and _users_file(filename, library_folders() if folders is None else folders)


@functools.lru_cache(maxsize=4096)
def _users_file(filename: str, folders: tuple) -> bool:
    """(cached: every module of the program is asked about where the code finds modules by name, and
    ``realpath`` takes 20-40 us)"""
    return not os.path.realpath(filename).startswith((KILN_DIR, *folders))


def merged_globals(globals_read: list) -> list[tuple[dict, str, list[str]]]:
    """``(globals, module name, names read)`` per module, from ``(globals, names)`` pairs."""
    merged: dict[int, tuple[dict, dict]] = {}
    for fn_globals, names in globals_read:
        merged.setdefault(id(fn_globals), (fn_globals, {}))[1].update(dict.fromkeys(names))
    return [(g, module_name(g), list(names)) for g, names in merged.values()]


#: Set while ``reach`` collects what a trace's watch compares (``optimizers=True``): every tensor's attribute
#: table is then entered, an empty one too, since a store into it in the call (``w.n = 1``) changes the
#: caller's tensor; guards take only the tables that hold attributes (no per-call cost for the others).
_WATCHING = contextvars.ContextVar("reads_watching", default=False)


def reach(named: Sequence, attr_names: frozenset | None = None, depth: int = 5, limit: int = 5000,
          optimizers: bool = False, owners: dict | None = None) -> list:  # fmt: skip
    """``(path, container, kind)`` for the dicts, lists and sets and the user's objects' and classes'
    attribute tables reachable from ``named`` (``(name, object)`` pairs), ``depth`` levels down; ``kind`` is
    ``"item"`` (entries are ``[key]``) or ``"attr"`` (an object's ``__dict__``: entries are ``.name``).
    ``attr_names``: the attribute names the call read (None: all), the only ones followed.
    ``optimizers``: also each kiln optimizer's ``param_groups`` dicts, for watching stores (a warm-up
    written inside the compiled function: ``g["lr"] = ...``); never guarded by value, since their
    numbers are read at each call through tensors (a scheduler between calls makes no new trace).
    ``owners``: filled with the object (or class) of each of the user's objects' (and classes') tables
    found, by the table's id (the guards compare only the attributes the call's code names, ``attr_reads``)."""
    if optimizers and not _WATCHING.get():
        token = _WATCHING.set(True)
        try:
            return reach(named, attr_names, depth, limit, optimizers, owners)
        finally:
            _WATCHING.reset(token)
    found: list = []
    seen: set[int] = set()
    stores: set[int] = set()  # the ids of the library objects inside a keyed store (``_keyed_store``)
    level = [(path, obj) for path, obj in named if _entered(obj)]
    for _ in range(depth):
        following: list = []
        for path, obj in level:
            if id(obj) in seen or len(seen) >= limit:
                continue
            seen.add(id(obj))
            if isinstance(obj, dict):
                if not _is_module_dict(obj):
                    found.append((path, obj, "item"))
                    following += [(f"{path}[{k!r}]", v) for k, v in list(obj.items()) if _entered(v)]
            elif isinstance(obj, list | tuple):
                if isinstance(obj, list):
                    found.append((path, obj, "item"))
                following += [(f"{path}[{i}]", v) for i, v in enumerate(list(obj)) if _entered(v)]
            elif isinstance(obj, set):
                found.append((path, obj, "item"))
            elif isinstance(obj, types.MappingProxyType):  # (a read-only view of a dict it does not name)
                found.append((path, obj, "item"))
                following += [(f"{path}[{k!r}]", v) for k, v in list(obj.items()) if _entered(v)]
            elif isinstance(obj, THREAD_LOCAL):  # (a View: the calling thread's attributes at each call)
                found.append((path, obj, "attr"))
                following += [(f"{path}.{k}", v) for k, v in list(vars(obj).items()) if _entered(v)]
            elif viewed(obj) and not isinstance(obj, types.FunctionType):  # a deque, a ContextVar...
                found.append((path, obj, "attr" if isinstance(obj, contextvars.ContextVar) else "item"))
                if not isinstance(obj, array.array | bytearray):
                    values = list(obj) if isinstance(obj, collections.deque) else [obj.get(None)]
                    following += [(f"{path}[{i}]", v) for i, v in enumerate(values) if _entered(v)]
            elif isinstance(obj, np.ndarray):
                found.append((path, obj, "array"))
            elif isinstance(obj, types.FunctionType | Tensor):
                following += _called_for(path, obj)
                if isinstance(obj, types.FunctionType):  # its closure's plain values too (``x * alpha``)
                    found.append((path, obj, "attr"))
                if isinstance(obj, Tensor) and (obj.__dict__ or _WATCHING.get()):  # attributes: a user object's table
                    found.append((path, obj.__dict__, "attr"))
                    following += [(f"{path}.{k}", v) for k, v in list(obj.__dict__.items())
                                  if (attr_names is None or k in attr_names) and _entered(v)]  # fmt: skip
            elif isinstance(obj, types.MethodType):
                following += [(f"{path}.__self__", obj.__self__), (f"{path}.__func__", obj.__func__)]
            elif isinstance(obj, functools.partial):  # what it was made with: ``partial(f, scale=cfg)``
                pieces = [("func", obj.func), ("args", obj.args), ("keywords", obj.keywords)]
                following += [(f"{path}.{name}", v) for name, v in pieces if _entered(v)]
            elif isinstance(obj, type):
                found.append((path, obj.__dict__, "attr"))
                if owners is not None:
                    owners[id(found[-1][1])] = obj
                following += [(f"{path}.{k}", v) for k, v in list(obj.__dict__.items())
                              if (attr_names is None or k in attr_names) and _entered(v)]  # fmt: skip
                # its metaclass's attributes are read through it too (``Config.scale`` a metaclass property)
                following += [(f"{meta.__name__} (metaclass of {path})", meta) for meta in inspect.getmro(type(obj))
                              if meta is not obj and _users_class(meta)]  # fmt: skip
            elif _slots_only(obj):  # guarded (``guards._guard_object``) and watched by its slots' values
                found.append((path, obj, "attr"))
                if owners is not None:
                    owners[id(obj)] = obj
                following += [(f"{path}.{k}", getattr(obj, k, None)) for k in slot_names(type(obj))
                              if (attr_names is None or k in attr_names) and _entered(getattr(obj, k, None))]  # fmt: skip
            else:
                following += _attributes(path, obj, attr_names, found, stores)
                if owners is not None and found and found[-1][1] is getattr(obj, "__dict__", None):
                    owners[id(found[-1][1])] = obj
                if optimizers and _is_optimizer(obj):
                    found += [(f"{path}.param_groups[{i}]", g, "item") for i, g in enumerate(obj.param_groups)]
        level = following
    return found


def _is_optimizer(obj) -> bool:
    return type(obj).__module__.startswith("kiln.optim") and isinstance(getattr(obj, "param_groups", None), list)


def _attributes(path: str, obj, attr_names: frozenset | None, found: list, stores: set) -> list:
    """The attributes of ``obj`` to follow (appending its table to ``found`` for the user's objects and
    the keyed stores; ``stores``: the ids of the library objects inside one, added to)."""
    from ...nn.modules.module import Module  # noqa: PLC0415 - nn sits above the frontend

    table = getattr(obj, "__dict__", None)
    if not isinstance(table, dict):
        return []
    users = _users_class(type(obj))
    # The user's classes it is an instance of: their attributes are read through it (``self.scale``
    # where ``scale`` is the class's) and are Python state as the instance's own are.
    classes = [(f"{type(obj).__name__} (class of {path})", cls) for cls in type(obj).__mro__ if _users_class(cls)]
    if isinstance(obj, Module):
        # A module's own tables are guarded and watched by ``hazards``; followed are its submodules
        # and, for the user's modules, their public attributes (``self.cfg``).
        children = dict(table.get("_modules") or {})
        for name in _MODULE_HOOKS:  # the user's hooks: what they change is reached from the call
            children.update((f"{name}[{k!r}]", v) for k, v in (table.get(name) or {}).items())
        children.update((k, p) for k, p in (table.get("_parameters") or {}).items() if _entered(p))  # hooked
        children.update((k, b) for k, b in (table.get("_buffers") or {}).items() if _entered(b))  # attributes
        if users:
            children.update((k, v) for k, v in table.items() if not k.startswith("_"))
    elif users:
        found.append((path, table, "attr"))
        children = table
    elif not kilns(type(obj)) and (id(obj) in stores or _keyed_store(type(obj))):
        found.append((path, table, "attr"))
        held = [(f"{path}.{k}", v) for k, v in list(table.items()) if _entered(v)]
        stores.update(id(v) for _, v in held)
        for _, v in held:  # (a dict or list in it: its library objects are the store's too)
            if isinstance(v, dict | list | tuple):
                stores.update(id(x) for x in (v.values() if isinstance(v, dict) else v))
        return held
    elif _attribute_bag(type(obj)):  # (a container's own methods read its attributes: all are followed)
        found.append((path, table, "attr"))
        return [(f"{path}.{k}", v) for k, v in list(table.items()) if _entered(v)]
    else:  # the function a library's wrapper calls (``functools.lru_cache``'s: what it reads is reached)
        wrapped = table.get("__wrapped__")
        return [(f"{path}.__wrapped__", wrapped)] if wrapped is not None and _entered(wrapped) else []
    return classes + [(f"{path}.{k}", v) for k, v in list(children.items())
                      if (attr_names is None or k in attr_names) and _entered(v)]  # fmt: skip


def attribute_names(codes: list) -> frozenset | None:
    """The attribute names that the code objects load (None when none ran: every name counts), a
    module's names imported from it among them (``from config import SCALE``), and the names their
    string constants spell (``getattr(sys.modules[__name__], "SCALE")``, ``getattr(self, "cfg")["s"]``)."""
    from .attr_reads import readers_spelled  # noqa: PLC0415 - attr_reads reads this module's classification

    if not codes:
        return None
    names = Names(arg for code in codes for _, op, arg in instructions(code) if op in _LOADS or op == "IMPORT_FROM"
                  or (op == "LOAD_CONST" and type(arg) is str and arg.isidentifier()))  # fmt: skip
    names.computed = any(readers_spelled(code)[0] for code in codes)  # (not those of its own arguments alone)
    return names


class Names(frozenset):
    """Attribute names the code loads (``attribute_names``); ``computed``: it reads some by names it
    computes too (``getattr(config, name)``, ``vars(config)[key]``; ``attr_reads.readers_spelled``)."""

    computed: bool = False


def imported(codes: list) -> list[tuple[str, object]]:
    """``(name, module)`` for the modules the code objects import (``import config`` inside the
    function, ``from config import SCALE``): read like the modules the function's globals name, though
    no global names them (``users_modules`` keeps the user's). Where the code can reach a module by a
    computed name (``finds_modules``), every module of the user's program is among them."""
    names = {arg for code in codes for _, op, arg in instructions(code) if op == "IMPORT_NAME"}
    found = {name: sys.modules.get(name) for full in names for name in (full, full.split(".", 1)[0])}
    out: list[tuple[str, object]] = [(n, m) for n, m in found.items() if isinstance(m, types.ModuleType)]
    if finds_modules(codes):
        folders = library_folders()
        out += [(f"sys.modules[{name!r}]", module) for name, module in list(sys.modules.items())
                if name not in found and isinstance(module, types.ModuleType) and _users_module(module, folders)]  # fmt: skip
    return out


#: The names by which code finds a module by a computed name: ``importlib.import_module(name)``,
#: ``__import__(name)``, ``importlib.reload(m)``, and ``sys.modules[name]`` (``finds_modules``). Which
#: module it finds no name in the code tells, so each of the user's modules may be the one.
MODULE_FINDERS = frozenset({"import_module", "__import__", "reload"})
_FINDS: dict = {}  # code object -> whether it finds modules by name


def finds_modules(codes: list) -> bool:
    """Whether the code objects spell a way to find a module by a computed name: a name of
    ``MODULE_FINDERS``, or ``sys.modules`` (``sys.modules[...]``, ``from sys import modules``; not another
    object's ``modules``, such as ``model.modules()``, lest every module be guarded for it)."""
    for code in codes:
        found = _FINDS.get(code)
        if found is None:
            found = not MODULE_FINDERS.isdisjoint(code.co_names)
            if not found and "modules" in code.co_names:
                ins = instructions(code)
                found = any(arg == "modules" and (op in _NAME_LOADS or op == "IMPORT_FROM" or (
                            op in _LOADS and i and ins[i - 1][2] == "sys")) for i, (_, op, arg) in enumerate(ins))  # fmt: skip
            _FINDS[code] = found
        if found:
            return True
    return False


#: The process's own state that user code reads by these names (``os.environ["LR"]``,
#: ``os.getenv(...)``, ``from os import environ``, ``sys.argv``): the containers behind them, guarded
#: by value where the call's code names one -- a library's module is otherwise not entered.
_PROCESS_STATE = {
    "environ": ("os.environ", lambda: os.environ._data),  # type: ignore[attr-defined]  # its str->str view's store
    "getenv": ("os.environ", lambda: os.environ._data),  # type: ignore[attr-defined]
    "argv": ("sys.argv", lambda: sys.argv),
}


def process_state(codes: list) -> list[tuple[str, object]]:
    """``(path, container)`` for the process state (``_PROCESS_STATE``) that the code objects name."""
    names = {arg for code in codes for _, op, arg in instructions(code) if op in _LOADS or op in _NAME_LOADS}
    found = {path: get() for name, (path, get) in _PROCESS_STATE.items() if name in names}
    return list(found.items())
