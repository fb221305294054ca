"""Which attributes of the user's objects a specialization depends on: the names the traced call's code can load.

A training loop compiles a step that closes over ``self`` and, between steps, sets other attributes
of ``self`` (``self.iter_num += 1``, ``self.iter_time = time.time()``, ``self.loss = loss``). A guard
on the object's whole attribute table would miss at every step and retrace until the recompile
limit, though the step never reads them. A specialization depends on the Python state its traced
call could have read, and on all of it: an attribute is read by name, and a name that Python code
loads is spelled in that code (``co_names``: ``LOAD_ATTR``, ``LOAD_METHOD``, ``LOAD_GLOBAL``...).
So the guards compare, on the user's objects' attribute tables, only the names that some code that
ran while the call was traced spells (``hazards.Watch`` sees each code object that runs: the
user's, kiln's and the libraries'), with kiln's own string constants (``d["_parameters"]``,
``getattr(self, "training", ...)``) -- a superset of the names loaded. A name the code spells that
the table did not hold is guarded too: an instance attribute that now shadows a class's must miss.

A table stays guarded whole (every attribute counts) where names alone cannot tell what was read:

- the user's code that ran spells a reader by computed name (``getattr`` or ``hasattr`` -- but
  called with a constant name, which is a read by that name --, ``vars``, ``dir``, ``__dict__``,
  ``__getattribute__``, ``attrgetter``, ``methodcaller``, ``asdict``, a pickle ``dump``,
  ``str.format``'s ``{0.name}``...), or names one under another name (a global or closure variable
  bound to ``getattr`` or to an ``attrgetter``); where each such read is ``getattr``, ``hasattr``,
  ``vars`` or ``__dict__`` of one of the code's own arguments, which it never rebinds
  (``getattr(self, f"fc{i}")``), only the objects those arguments held at each of its calls are
  guarded whole;
- a library function that spells one ran with one of the user's objects among its arguments (or one
  level into them: ``copy.copy(self)``, ``dataclasses.asdict(cfg)``); kiln's own code reads the
  user's objects only by the names it spells (a module's tables by their names);
- the object's class, or a base, is not the user's (a library's class may read attributes in C:
  ``SimpleNamespace.__eq__``; ``abc.ABC`` and ``typing.Generic`` change nothing there), defines ``__getattr__``/``__getattribute__``, holds a descriptor
  whose code is not Python code that would run under the watch (``property(attrgetter("x"))``), or
  sets ``kiln_only`` (its methods run with the watch paused); kiln's ``Module`` is a base whose
  ``__getattr__`` reads only its parameter, buffer and submodule tables, which are guarded whole;
- the table holds, under a name the code spells, a reader (``self.get = attrgetter("lr")``);
- the watch could not see the code that ran (another profiler held the hook, or user code ran with
  the watch paused): ``names`` is None.

Names beginning and ending with ``__`` are always guarded: C code looks some up on instances
(numpy's ``__array_interface__``). What is left: a C extension given the user's object and reading
attributes by names of its own, or a reader reached through a container; neither is seen.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import dis
import functools
import inspect
import operator
import pickle
import types
import typing
from typing import Any

from .reads import _users_class

#: Names whose presence in the user's code means it may read attributes by computed names.
COMPUTED = frozenset({
    "getattr", "hasattr", "vars", "dir", "__dict__", "__getattribute__", "__getattr__", "attrgetter",
    "methodcaller", "getattr_static", "getmembers", "asdict", "astuple", "__reduce_ex__", "__reduce__",
    "__getstate__", "dump", "dumps", "format", "format_map",
})  # fmt: skip
#: The same readers as objects, to find them under other names (``get = getattr``).
_READERS = frozenset(map(id, (
    getattr, hasattr, vars, dir, object.__getattribute__, inspect.getmembers, inspect.getattr_static,
    dataclasses.asdict, dataclasses.astuple, dataclasses.replace, copy.copy, copy.deepcopy, pickle.dump,
    pickle.dumps, operator.attrgetter, operator.methodcaller,
)))  # fmt: skip
_CODE_NAMES: dict = {}  # code object -> the names it spells


def code_names(code) -> tuple:
    """The names ``code`` can load attributes by: its ``co_names`` and its identifier string constants
    (``getattr(obj, "name")``, ``d["_parameters"]``)."""
    found = _CODE_NAMES.get(code)
    if found is None:
        consts = (c for c in code.co_consts if type(c) is str and c.isidentifier())
        found = _CODE_NAMES[code] = (*code.co_names, *consts)
    return found


def _is_reader(value) -> bool:
    if id(value) in _READERS or type(value) in (operator.attrgetter, operator.methodcaller):
        return True
    return type(value) is functools.partial and _is_reader(value.func)


def computed_reads(frame) -> tuple[str | None, list]:
    """Why the user's code running ``frame`` may read any attribute of any object (None: it loads
    them by the names it spells), and the objects it reads by computed names (``getattr(self,
    f"fc{i}")``, ``vars(cfg)`` on its own arguments): those alone are guarded whole."""
    code = frame.f_code
    spelled, arguments = readers_spelled(code)
    if spelled:
        return f"{code.co_name} ({code.co_filename}) uses {min(spelled)}", []
    scopes = (frame.f_locals, frame.f_globals, frame.f_builtins)
    analysed = _PER_OBJECT.intersection(code.co_names)  # (their uses are known: readers_spelled)
    for name in (*code.co_names, *code.co_freevars):
        for scope in scopes:
            if name in scope:
                if _is_reader(scope[name]) and name not in analysed:
                    return f"{code.co_name} ({code.co_filename}) names a reader of attributes as {name!r}", []
                break
    return None, [frame.f_locals[name] for name in arguments if name in frame.f_locals]


def spells_reader(code) -> bool:
    """Whether a library's ``code`` may read attributes by computed names."""
    spelled, arguments = readers_spelled(code)
    return bool(spelled or arguments)


#: Readers whose uses ``_read_objects`` follows: ``getattr``/``hasattr`` with a constant name read
#: that name (which ``code_names`` holds); with another, and ``vars``/``__dict__``, they read the
#: object they are given, which is one of the code's arguments where the code never rebinds it.
_PER_OBJECT = frozenset({"getattr", "hasattr", "vars", "__dict__"})
_OBJECT_LOADS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_CLASSDEREF"})
_SPELLED: dict = {}  # code object -> (the readers it spells, the arguments it reads by computed names)


def readers_spelled(code) -> tuple[frozenset, tuple]:
    """The names of ``COMPUTED`` that ``code`` uses, but for the uses of ``_PER_OBJECT`` that
    ``_read_objects`` follows, and the names of the arguments those read by computed names."""
    found = _SPELLED.get(code)
    if found is None:
        spelled = COMPUTED.intersection(code.co_names)
        arguments = _read_objects(code) if spelled & _PER_OBJECT else ()
        if arguments is None:
            arguments = ()
        else:
            spelled -= _PER_OBJECT
        found = _SPELLED[code] = (frozenset(spelled), arguments)
    return found


_SIMPLE_LOADS = frozenset({"LOAD_CONST", *_OBJECT_LOADS})
_CALLS = frozenset({"PRECALL", "CALL"})


def _constant_name(ins: list, k: int) -> bool:
    """Whether instruction ``k`` loads a constant string that is the whole name argument: the call
    comes next, or after one simple load (a default), not an expression built on it (``f"fc{i}"``)."""
    if ins[k][0] != "LOAD_CONST" or type(ins[k][1]) is not str:
        return False
    following = [op for op, _ in ins[k + 1 : k + 3]]
    if following[:1] and following[0] in _CALLS:
        return True
    return following[:1] != [] and following[0] in _SIMPLE_LOADS and following[1:2] != [] and following[1] in _CALLS


def _read_objects(code) -> tuple | None:
    """The arguments of ``code`` that its uses of ``_PER_OBJECT`` read by computed names, or None
    where a use is not one of: ``getattr(obj, "name", ...)``/``hasattr(obj, "name")`` (``obj`` a
    name and its attributes), ``getattr(arg, ...)``, ``hasattr(arg, ...)``, ``vars(arg)`` and
    ``arg.__dict__``, with ``arg`` an argument the code never rebinds."""
    listed = list(dis.get_instructions(code))
    ins = [(i.opname, i.argval) for i in listed]
    count = code.co_argcount + code.co_kwonlyargcount
    stored = {arg for op, arg in ins if op in ("STORE_FAST", "DELETE_FAST")}
    stable = {name for name in code.co_varnames[:count] if name not in stored}
    found: dict = {}
    for i, (op, arg) in enumerate(ins):
        if type(arg) is not str or arg not in _PER_OBJECT or op == "LOAD_CONST":
            continue
        before = ins[i - 1] if i else ("", None)
        if arg == "__dict__" and op == "LOAD_ATTR" and before[0] == "LOAD_FAST" and before[1] in stable:
            found[before[1]] = None
            continue
        called = (op == "LOAD_GLOBAL" and (listed[i].arg or 0) & 1) or (op == "LOAD_NAME" and before[0] == "PUSH_NULL")
        if not called or arg == "__dict__" or i + 2 >= len(ins):
            return None  # passed on (``map(getattr, ...)``), stored, ``builtins.getattr``, ``obj.__dict__``
        j = i + 1
        if ins[j][0] not in _OBJECT_LOADS:
            return None
        while j + 1 < len(ins) and ins[j + 1][0] == "LOAD_ATTR":
            j += 1
        if j + 1 >= len(ins):
            return None
        if arg != "vars" and _constant_name(ins, j + 1):
            continue
        if j != i + 1 or ins[j][0] != "LOAD_FAST" or ins[j][1] not in stable:
            return None
        found[ins[j][1]] = None
    return tuple(found)


def passes_users_object(frame) -> str | None:
    """Whether a library function (``frame``, at its call) was given one of the user's objects or
    classes, or a container or object holding one directly: a reader by computed name then reads it."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
    values = frame.f_locals
    for name in code.co_varnames[:count]:
        value = values.get(name)
        if _users(value) or any(map(_users, _one_level(value))):
            return f"{code.co_name} ({code.co_filename}) was given one of the user's objects ({name})"
    return None


def _users(value) -> bool:
    if isinstance(value, type):
        return _users_class(value)
    return _users_class(type(value))


def _one_level(value) -> list:
    if isinstance(value, types.MethodType):  # a bound method: its object
        return [value.__self__]
    if isinstance(value, dict):
        return list(value.values())[:256]
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)[:256]
    table = None if isinstance(value, types.ModuleType) else getattr(value, "__dict__", None)
    return list(table.values())[:256] if isinstance(table, dict) else []


# ---------------------------------------------------------------------- per object
class Spelled(frozenset):
    """The names the traced call's code spells (``hazards.Watch.read_names``), with the objects it
    read by computed names (``whole``: by id; their tables are guarded whole)."""

    whole: frozenset

    def __new__(cls, names, objects: dict) -> Spelled:
        self = super().__new__(cls, names)
        self.whole = frozenset(objects)
        return self


_PYTHON_DESCRIPTORS = (types.FunctionType, staticmethod, classmethod, types.MemberDescriptorType,
                       types.GetSetDescriptorType, types.WrapperDescriptorType, types.MethodDescriptorType,
                       types.BuiltinFunctionType)  # fmt: skip
_module_names: frozenset | None = None
#: Library bases that change nothing of how an instance's attributes are read (a metaclass's checks,
#: subscripting the class).
_PLAIN_BASES = (object, abc.ABC, typing.Generic)


def module_names() -> frozenset:
    """The attributes kiln's ``Module`` keeps in every module's table (its parameter, buffer,
    submodule and hook tables, ``training``): read by its own machinery, some with the watch paused."""
    global _module_names
    if _module_names is None:
        from ...nn.modules.module import Module  # noqa: PLC0415 - nn sits above the frontend

        _module_names = frozenset(vars(Module()))
    return _module_names


def _opaque(value) -> bool:
    """Whether a class attribute is a descriptor whose reading runs no Python code the watch sees."""
    if not hasattr(type(value), "__get__") or isinstance(value, _PYTHON_DESCRIPTORS):
        return False
    if isinstance(value, property):
        return not all(f is None or isinstance(f, types.FunctionType) for f in (value.fget, value.fset, value.fdel))
    if isinstance(value, functools.cached_property):
        return not isinstance(value.func, types.FunctionType)
    return True


def _kiln_module_class(cls) -> bool:
    from ...nn.modules.module import Module  # noqa: PLC0415 - nn sits above the frontend

    if cls in Module.__mro__:  # (Module and its own bases: the state dict's, ``module_state.py``)
        return cls is not object
    return (issubclass(cls, Module) and cls.__module__.startswith("kiln.")
            and "__getattr__" not in cls.__dict__ and "__getattribute__" not in cls.__dict__)  # fmt: skip


def users_classes(cls) -> list | None:
    """The user's classes in ``cls``'s method resolution order, or None where one of its classes reads
    attributes in ways names do not tell (see the module's docstring)."""
    out = []
    for base in cls.__mro__:
        if base in _PLAIN_BASES or _kiln_module_class(base):
            continue
        table = base.__dict__
        if not _users_class(base) or "__getattr__" in table or "__getattribute__" in table or table.get("kiln_only"):
            return None
        if any(map(_opaque, list(table.values()))):
            return None
        out.append(base)
    return out


def guarded_names(obj, names: frozenset | None) -> frozenset | None:
    """The attribute names of ``obj`` to guard: ``names`` (what the call's code spells) where its class
    allows it, with a module's own tables; None for the whole table."""
    if names is None or id(obj) in getattr(names, "whole", ()):
        return None
    if isinstance(obj, type):  # a class's own table (read as ``Config.scale`` or ``self.scale``)
        return names if type(obj) in (type, abc.ABCMeta) and users_classes(obj) else None
    if not users_classes(type(obj)):
        return None  # (kiln's own modules too: their code may run with the watch paused)
    from ...nn.modules.module import Module  # noqa: PLC0415 - nn sits above the frontend

    if isinstance(obj, Module):
        names = names | module_names()
    table = getattr(obj, "__dict__", None)
    if isinstance(table, dict) and any(_is_reader(table[k]) for k in names.intersection(table)):
        return None
    return names


def spelled(name: Any, names: frozenset) -> bool:
    """Whether a table entry ``name`` is guarded under ``names`` (a dunder always is)."""
    return name in names or (type(name) is str and name.startswith("__") and name.endswith("__"))


def slots(cls) -> dict:
    """The slot descriptors of the classes in ``cls``'s method resolution order, by name."""
    found: dict = {}
    for base in reversed(cls.__mro__):
        for name, value in base.__dict__.items():
            if isinstance(value, types.MemberDescriptorType):
                found[name] = value
    return found
