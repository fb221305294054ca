"""The weights-only unpickler: which globals a pickle may name when ``kiln.load(..., weights_only=True)``.

Unpickling runs whatever callable a pickle names, so a pickle from a stranger is code from a stranger.
With ``weights_only=True`` (the default, as in PyTorch 2.6+) every global a pickle names is looked up
in an allow-list first: plain containers (``OrderedDict``, ``set``...), kiln's dtypes, ``Size`` and
devices, numpy's array rebuilders, the rebuild functions each file format needs (given by the caller)
and what the user allowed with ``add_safe_globals`` / ``safe_globals``. Anything else raises
``pickle.UnpicklingError`` naming the global and how to allow it; nothing is imported or called.

>>> import collections
>>> class Point(collections.namedtuple("Point", "x y")): pass
>>> with safe_globals([Point]):
...     Point in get_safe_globals()
True
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..frontend.tensor import Size
from ..ir import dtypes as dt
from ..ir.types import Device

__all__ = [
    "WeightsOnlyRefusal",
    "add_safe_globals",
    "clear_safe_globals",
    "get_safe_globals",
    "safe_globals",
    "WeightsOnlyUnpickler",
]

_user_globals: list[Any] = []


def add_safe_globals(safe: Iterable[Any]) -> None:
    """Allow these classes/functions in weights-only loads (PyTorch's ``torch.serialization.add_safe_globals``).

    An entry is the object itself, or a pair ``(object, "module.name")`` for an object that a pickle names
    under another path (a class that moved)."""
    for entry in safe:
        _full_name(entry)  # refuse what cannot be named before storing it
        _user_globals.append(entry)


def get_safe_globals() -> list[Any]:
    """The user's allowed globals, in the order they were added."""
    return list(_user_globals)


def clear_safe_globals() -> None:
    """Forget every global added with ``add_safe_globals``."""
    _user_globals.clear()


@contextlib.contextmanager
def safe_globals(safe: Iterable[Any]) -> Iterator[None]:
    """Allow these globals inside a ``with`` block only (PyTorch's ``torch.serialization.safe_globals``)."""
    before = list(_user_globals)
    add_safe_globals(safe)
    try:
        yield
    finally:
        _user_globals[:] = before


def _full_name(entry: Any) -> tuple[Any, str]:
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
        return entry[0], entry[1]
    module, name = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        raise TypeError(f"add_safe_globals: expected classes or functions (or (object, 'module.name') pairs), "
                        f"got {entry!r}")  # fmt: skip
    return entry, f"{module}.{name}"


def _numpy_rebuilders() -> dict[str, Any]:
    """What numpy names when it pickles arrays, dtypes and scalars (numpy 1 and 2 spell the module differently)."""
    core = getattr(np, "_core", None) or np.core
    found = {"numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found[f"{module}._reconstruct"] = core.multiarray._reconstruct
        found[f"{module}.scalar"] = core.multiarray.scalar
    for kind in set(np.sctypeDict.values()):  # numpy 2 pickles a dtype's class, e.g. numpy.dtypes.Float32DType
        cls = type(np.dtype(kind))
        found[f"numpy.dtypes.{cls.__name__}"] = cls
    return found


def _builtin_globals() -> dict[str, Any]:
    plain = {f"builtins.{name}": getattr(builtins, name) for name in
             ("set", "frozenset", "complex", "slice", "bytearray", "range", "list", "dict", "tuple", "int", "float",
              "bool", "str", "bytes")}  # fmt: skip
    plain |= {
        "collections.OrderedDict": collections.OrderedDict,
        "collections.Counter": collections.Counter,
        "collections.defaultdict": collections.defaultdict,
    }
    plain |= {f"kiln.ir.dtypes.{d.name}": d for d in dt.ALL_DTYPES}
    plain |= {"kiln.frontend.tensor.Size": Size, "kiln.ir.types.Device": Device}
    return plain | _numpy_rebuilders()


_DEFAULT: dict[str, Any] | None = None


def _defaults() -> dict[str, Any]:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = _builtin_globals()
    return _DEFAULT


class WeightsOnlyRefusal(pickle.UnpicklingError):
    """A global outside the allow-list: an ``UnpicklingError``, as PyTorch raises, told apart from corrupt data."""


class WeightsOnlyUnpickler(pickle.Unpickler):
    """An unpickler that resolves globals only through the allow-list (plus ``extra``, a format's rebuilders).

    Every way a pickle reaches a callable (GLOBAL, STACK_GLOBAL, the EXT opcodes) goes through
    ``find_class``, so checking here is enough (Python's documentation, "Restricting Globals")."""

    def __init__(self, file, *, extra: dict[str, Any], persistent_load: Callable[[Any], Any], source: str) -> None:
        super().__init__(file)
        self.extra = extra
        self._persistent = persistent_load
        self.source = source

    def persistent_load(self, pid: Any) -> Any:
        return self._persistent(pid)

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full in self.extra:
            return self.extra[full]
        found = _defaults().get(full)
        if found is not None:
            return found
        if full == "kiln.ir.dtypes.bfloat16":
            return dt.bfloat16_dtype()
        for entry in _user_globals:
            obj, entry_name = _full_name(entry)
            if entry_name == full:
                return obj
        raise WeightsOnlyRefusal(refusal(full, self.source))


def refusal(full: str, source: str) -> str:
    return (
        f"Weights only load failed: {source} names the global {full}, which is not allowed by default. "
        f"Unpickling it could run arbitrary code. If you trust where the file comes from, either pass "
        f"weights_only=False to kiln.load, or allow this global with "
        f"`kiln.serialization.add_safe_globals([{full}])` or the "
        f"`kiln.serialization.safe_globals([{full}])` context manager. "
        f"(WeightsUnpickler error: Unsupported global: GLOBAL {full} was not an allowed global by default.)"
    )
