"""The weights-only unpickler: which globals a pickle may name when ``kiln.load(..., weights_only=True)``.

Unpickling runs whatever callable a pickle names, so a pickle from a stranger is code from a stranger.
With ``weights_only=True`` (the default, as in PyTorch 2.6+) every global a pickle names is looked up
in an allow-list first: plain containers (``OrderedDict``, ``set``...), kiln's dtypes, ``Size`` and
devices, numpy's array rebuilders (which rebuild plain dtypes only: ``numpy_rebuild.py``),
``_codecs.encode`` for bytes, the rebuild functions each file format needs (given by the caller) and
what the user allowed with ``add_safe_globals`` / ``safe_globals``. Anything else raises
``pickle.UnpicklingError`` naming the global and how to allow it; nothing is imported or called.
Python 2 names, which protocol 2 (PyTorch's default) writes, are read as Python 3's: ``__builtin__.set``
is ``builtins.set``. What the allowed calls may allocate is bounded by the pickle's size
(``unpickler.py``), so a small file cannot ask for much memory either.

>>> import collections
>>> class Point(collections.namedtuple("Point", "x y")): pass
>>> with safe_globals([Point]):
...     Point in get_safe_globals()
True
"""

from __future__ import annotations

import _compat_pickle
import builtins
import collections
import contextlib
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..frontend.tensor import Size
from ..ir import dtypes as dt
from ..ir.types import Device
from .numpy_rebuild import numpy_globals
from .unpickler import BoundedUnpickler, PickleLimitError

__all__ = [
    "WeightsOnlyRefusal",
    "add_safe_globals",
    "clear_safe_globals",
    "get_safe_globals",
    "safe_globals",
    "WeightsOnlyUnpickler",
    "allowed_global",
    "python3_name",
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


def _codecs_encode(text: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it to pickle ``bytes``: latin-1 text to bytes, nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise PickleLimitError(f"calls _codecs.encode({type(text).__name__}, {str(encoding)[:20]!r}); a "
                               "weights-only load decodes only latin-1 text into bytes (how protocol 2 pickles "
                               "bytes)")  # fmt: skip
    return text.encode("latin-1")


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
    plain |= {"kiln.frontend.tensor.Size": Size, "kiln.ir.types.Device": Device, "_codecs.encode": _codecs_encode}
    return plain | numpy_globals()


_DEFAULT: dict[str, Any] | None = None


def _defaults() -> dict[str, Any]:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = _builtin_globals()
    return _DEFAULT


class WeightsOnlyRefusal(pickle.UnpicklingError):
    """A global outside the allow-list: an ``UnpicklingError``, as PyTorch raises, told apart from corrupt data."""


class WeightsOnlyUnpickler(BoundedUnpickler):
    """An unpickler that resolves globals only through the allow-list (plus ``extra``, a format's rebuilders),
    within the memory bounds of ``BoundedUnpickler`` (``unpickler.py``).

    Every way a pickle reaches a callable (GLOBAL, STACK_GLOBAL, INST) goes through ``find_class``, so
    checking here is enough (Python's documentation, "Restricting Globals"); the EXT opcodes are refused.
    Python 2 names (``__builtin__.set``, what protocol 2 writes) are mapped as Python's unpickler maps them.
    ``size``: the pickle's bytes in ``file`` (its remaining bytes when None)."""

    def __init__(self, file, *, extra: dict[str, Any], persistent_load: Callable[[Any], Any], source: str,
                 size: int | None = None, restricted: bool = True) -> None:  # fmt: skip
        super().__init__(file, source=source, size=size, restricted=restricted)
        self.extra = extra
        self._persistent = persistent_load

    def persistent_load(self, pid: Any) -> Any:
        return self._persistent(pid)

    def find_class(self, module: str, name: str) -> Any:
        module, name = python3_name(module, name, self.proto)  # type: ignore[attr-defined]  # typeshed omits proto
        found = allowed_global(f"{module}.{name}", self.extra)
        if found is None:
            raise WeightsOnlyRefusal(refusal(f"{module}.{name}", self.source))
        return found


def python3_name(module: str, name: str, proto: int) -> tuple[str, str]:
    """The name Python 3 gives a global that a protocol 0-2 pickle names (``__builtin__.set``: ``builtins.set``)."""
    if proto >= 3:
        return module, name
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def allowed_global(full: str, extra: dict[str, Any]) -> Any:
    """The object the allow-list (with a format's ``extra`` rebuilders) gives ``full``, or None if refused."""
    if full in extra:
        return extra[full]
    found = _defaults().get(full)
    if found is not None:
        return found
    if full == "kiln.ir.dtypes.bfloat16":
        return dt.bfloat16_dtype()
    for entry in _user_globals:
        obj, entry_name = _full_name(entry)
        if entry_name == full:
            return obj
    return None


def refusal(full: str, source: str) -> str:
    return (
        f"Weights only load failed: {source} names the global {full}, which is not allowed by default. "
        f"Unpickling it could run arbitrary code. If you trust where the file comes from, either pass "
        f"weights_only=False to kiln.load, or allow this global with "
        f"`kiln.serialization.add_safe_globals([{full}])` or the "
        f"`kiln.serialization.safe_globals([{full}])` context manager. "
        f"(WeightsUnpickler error: Unsupported global: GLOBAL {full} was not an allowed global by default.)"
    )
