"""The user's lines that read and store the Python state a trace depends on, and ``kiln.explain``'s table of it.

``reads.reach`` finds the containers a traced call reaches and ``guards.py`` guards them; this module
says where, in the user's code, each value was read (``read_line``) or a container was stored into
(``store_line``), in the user's words (``selector``, ``short``), and lists the values guarded as
``PythonRead`` records for ``kiln.explain`` (``records``, ``global_records``).
"""

from __future__ import annotations

import dis
import types

import numpy as np

from ...ir.graph import SourceLocation
from ..tensor import Tensor
from .snapshots import _BY_VALUE, _CONTAINERS, MISSING, snapshot
from .specialization import PythonRead

_INSTRUCTIONS: dict = {}  # code object -> tuple of (line, opname, argval)


def instructions(code) -> tuple:
    """``code``'s instructions as (line, opname, argval), disassembled once per code object."""
    found = _INSTRUCTIONS.get(code)
    if found is None:
        line, out = code.co_firstlineno, []
        for ins in dis.get_instructions(code):
            if ins.positions is not None and ins.positions.lineno is not None:  # type: ignore[attr-defined]  # 3.11+
                line = ins.positions.lineno  # type: ignore[attr-defined]
            out.append((line, ins.opname, ins.argval))
        found = _INSTRUCTIONS[code] = tuple(out)
    return found


_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_NAME_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_DEREF", "LOAD_FAST", "LOAD_NAME", "LOAD_CLASSDEREF"})


def _root_name(path: str) -> str:
    return path.split("[", 1)[0].split(".", 1)[0]


def _find(codes: list, match) -> SourceLocation | None:
    for code in codes:
        ins = instructions(code)
        for i, (line, op, arg) in enumerate(ins):
            if match(ins, i, op, arg):
                return SourceLocation(code.co_filename, line, code.co_name)
    return None


def _same_key(arg, key) -> bool:
    return type(arg) is type(key) and arg == key


def read_line(codes: list, path: str, kind: str, key) -> SourceLocation | None:
    """The first line of ``codes`` that reads entry ``key`` (``d["key"]``, ``obj.key``), else one
    that names the path's root."""
    if kind == "attr":
        loc = _find(codes, lambda ins, i, op, arg: op in _LOADS and arg == key)
    else:
        loc = _find(codes, lambda ins, i, op, arg: op == "LOAD_CONST" and _same_key(arg, key)
                    and any(o == "BINARY_SUBSCR" for _, o, _ in ins[i + 1 : i + 4]))  # fmt: skip
    root = _root_name(path)
    return loc or _find(codes, lambda ins, i, op, arg: op in _NAME_LOADS and arg == root)


def store_line(codes: list, path: str, key) -> SourceLocation | None:
    """The line of the store into ``path`` at ``key``: a ``d[key] = v`` or ``del d[key]`` on a line
    that names the key or the path's root (else the first such store)."""
    root = _root_name(path)
    first = None
    for code in codes:
        found = instructions(code)
        named = {line for line, op, arg in found
                 if (op == "LOAD_CONST" and key is not None and _same_key(arg, key)) or (op in _NAME_LOADS and arg == root)}  # fmt: skip
        for line, op, _ in found:
            if op in ("STORE_SUBSCR", "DELETE_SUBSCR"):
                loc = SourceLocation(code.co_filename, line, code.co_name)
                if line in named:
                    return loc
                first = first or loc
    return first


def selector(kind: str, key) -> str:
    """How an entry's key is written after its container's path: ``.name`` or ``['key']``."""
    return f".{key}" if kind == "attr" else f"[{key!r}]"


def short(value) -> str:
    text = repr(value) if not hasattr(value, "_data") else f"tensor of shape {tuple(value._data.shape)}"
    return text if len(text) < 60 else text[:57] + "..."


# ---------------------------------------------------------------------- kiln.explain's table
def records(found: list, codes: list, attr_names: frozenset | None, per_container: int = 12) -> list[PythonRead]:
    """``PythonRead`` records (kind "guard") for the containers ``found`` (those the guards check):
    per plain value and per other object a dict holds (for an object's table, the attributes the
    call read), and per list or set."""
    out: list[PythonRead] = []
    for path, live, kind in found:
        if path == "os.environ":  # (bytes -> bytes: each variable would be a line of noise)
            what = f"os.environ: the same {len(live)} variables (a change to any makes a new trace)"
            out.append(PythonRead(what, "guard", read_line(codes, "os", "attr", "environ")))
        elif isinstance(live, dict | types.MappingProxyType):
            items = [(k, v) for k, v in list(live.items()) if kind != "attr" or attr_names is None or k in attr_names]
            plain = [(k, v) for k, v in items if isinstance(v, _BY_VALUE) and not isinstance(v, Tensor)]
            for k, v in plain[:per_container]:
                what = f"{path}{selector(kind, k)} == {short(v)}"
                out.append(PythonRead(what, "guard", read_line(codes, path, kind, k)))
            if len(plain) > per_container:
                out.append(PythonRead(f"{path}: {len(plain) - per_container} more entries", "guard", None))
            # entries neither plain nor containers (which have records of their own): compared by identity
            objects = [
                (k, v) for k, v in items if not isinstance(v, (*_BY_VALUE, *_CONTAINERS)) or isinstance(v, Tensor)
            ]
            for k, v in objects[:per_container]:
                what = f"{path}{selector(kind, k)} is the same {type(v).__name__} object"
                out.append(PythonRead(what, "guard", read_line(codes, path, kind, k)))
        elif isinstance(live, np.ndarray):
            what = f"{path}: the {live.size} values of a numpy array"
            out.append(PythonRead(what, "guard", read_line(codes, path, kind, None)))
        elif not isinstance(live, list | set):  # a deque, a closure, slots...: ``snapshots.View``
            out += _view_records(path, live, codes, per_container)
        elif all(isinstance(v, _BY_VALUE) for v in live) and len(live) <= per_container:
            out.append(PythonRead(f"{path} == {short(live)}", "guard", read_line(codes, path, kind, None)))
        else:
            what = f"{path}: the same {len(live)} {'items' if isinstance(live, set) else 'entries'}"
            out.append(PythonRead(what, "guard", read_line(codes, path, kind, None)))
    return out


def _view_records(path: str, live, codes: list, per_container: int) -> list[PythonRead]:
    view = snapshot(live)
    if type(view.data) is bytes:
        return [PythonRead(f"{path}: the {len(view.data)} bytes of a {type(live).__name__}", "guard",
                           read_line(codes, path, "item", None))]  # fmt: skip
    kind = "item" if view.names is None else "attr"
    out = []
    for i, v in enumerate(view.data[:per_container]):
        v = getattr(v, "obj", v)  # (an entry compared by identity)
        if v is not MISSING and v is not None:
            what = f"{path}{selector(kind, view.key(i))} " + ("== " + short(v) if isinstance(v, _BY_VALUE)
                                                              else f"is the same {type(v).__name__} object")  # fmt: skip
            out.append(PythonRead(what, "guard", read_line(codes, path, kind, view.key(i))))
    return out


def global_records(named: list, codes: list) -> list[PythonRead]:
    """``PythonRead`` records for the plain values among the globals other functions read (``named``:
    ``(module.name, value)``); the objects they name are guarded by identity."""
    return [PythonRead(f"{path} == {short(value)}", "guard", read_line(codes, path.rsplit(".", 1)[1], "item", None))
            for path, value in named if isinstance(value, _BY_VALUE) and not isinstance(value, Tensor)]  # fmt: skip
