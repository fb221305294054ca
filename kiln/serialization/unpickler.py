# mypy: disable-error-code="attr-defined,misc,assignment,arg-type"
# reason: extends pickle's pure-Python _Unpickler, whose internals (stack, memo, read, dispatch) typeshed does not describe
"""An unpickler whose memory is bounded by the pickle's own size: the base of weights-only loading.

Python's unpickler trusts the sizes a pickle gives: 30 bytes calling ``bytearray(2**29)`` take 512 MB,
43 bytes calling ``list(range(n))`` more, an 8-byte ``LONG_BINPUT`` grows the C unpickler's memo
table to its index, and a length prefix asks ``read`` for that many bytes before any arrive.
``BoundedUnpickler`` is Python's own pure-Python unpickler with those doors closed:

- every read is checked against the bytes the pickle has left (``size``), so a declared length
  larger than the pickle is refused before anything is allocated;
- the memo is a dict (Python's pure unpickler), so a large memo index costs one entry;
- each call a pickle makes (``REDUCE``, ``NEWOBJ``, ``NEWOBJ_EX``, ``INST``, ``OBJ``) of a builtin that
  allocates from its arguments (``bytes``/``bytearray`` of a count, ``list``/``tuple``/``set``/``dict``...
  of an iterable) is charged for what it will build, and the charges of one pickle together may not
  exceed ``MAX_EXPANSION`` times its size plus ``EXPANSION_SLACK`` bytes;
- ``str`` may convert only strings, bytes and numbers (a ``repr`` of a shared nested list grows
  exponentially), and numpy's rebuilders are checked (``numpy_rebuild.py``) when ``restricted``;
- ``BUILD`` may give state only to what the pickle built, never to a global it named (a class, or a
  shared object such as kiln's ``float32``: changing it would change it for the whole process);
- the extension registry (the ``EXT`` opcodes) is refused: it names globals outside the pickle.

What goes beyond a limit raises ``PickleLimitError``, a ``ValueError`` naming the file.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
from typing import IO, Any

import numpy as np

from ..frontend.tensor import Size

__all__ = ["EXPANSION_SLACK", "MAX_EXPANSION", "BoundedReader", "BoundedUnpickler", "PickleLimitError", "stream_size"]

#: The objects that the calls in one pickle build may take at most this many bytes per byte of pickle
#: (a pickled ``set([...])`` costs about 64 bytes per element it holds, its pickle 2 to 10)...
MAX_EXPANSION = 32
#: ...plus this many bytes, so that a small pickle of a few containers never comes near the limit.
EXPANSION_SLACK = 4 << 20
#: What one element of a container built by a call is charged: a pointer, a hash entry and an int.
ELEMENT_BYTES = 64


class PickleLimitError(ValueError):
    """A pickle that asks for more than its size allows, or for an object a weights-only load does not
    rebuild; raised with the problem alone, then again by ``BoundedUnpickler.load`` naming the file."""


def stream_size(f: IO[bytes]) -> int | None:
    """Bytes left in a seekable binary file object; None when its size cannot be known ahead."""
    try:
        if f.seekable():
            here = f.tell()
            end = f.seek(0, io.SEEK_END)
            f.seek(here)
            return end - here
    except (AttributeError, OSError, ValueError):
        pass
    return None


class BoundedReader:
    """``read``/``readline`` of at most the ``size`` bytes a pickle has; never asks the file for more."""

    def __init__(self, file: IO[bytes], size: int) -> None:
        self.file, self.left = file, size

    def read(self, n: int) -> bytes:
        if n > self.left:
            raise EOFError(f"the pickle is truncated or corrupt: an opcode asks for {n} bytes, {self.left} are left")
        data = self.file.read(n)
        self.left -= len(data)
        return data

    def readline(self) -> bytes:
        line = self.file.readline(self.left)
        self.left -= len(line)
        return line


def _count(arg: Any) -> int:
    """How many items (or bytes) building from ``arg`` makes; a count that cannot be known is refused."""
    try:
        return len(arg)
    except OverflowError:  # range(2**64)
        return 1 << 62
    except TypeError:
        return 0  # not a collection: the constructor itself raises, or builds from a scalar


def _bytes_cost(args: tuple, kwargs: dict) -> int:
    if not args:
        return 0
    first = args[0]
    if isinstance(first, int):
        return max(first, 0)
    return _count(first) * (4 if len(args) > 1 or kwargs else 1)  # an encoding may take 4 bytes a character


def _items_cost(args: tuple, kwargs: dict) -> int:
    return (_count(args[0]) if args else 0) * ELEMENT_BYTES + len(kwargs) * ELEMENT_BYTES


def _defaultdict_cost(args: tuple, kwargs: dict) -> int:
    return _items_cost(args[1:], kwargs)


_COSTS = {
    bytes: _bytes_cost, bytearray: _bytes_cost, list: _items_cost, tuple: _items_cost, set: _items_cost,
    frozenset: _items_cost, dict: _items_cost, collections.OrderedDict: _items_cost,
    collections.Counter: _items_cost, collections.defaultdict: _defaultdict_cost, Size: _items_cost,
}  # fmt: skip
_STR_SOURCES = (str, bytes, bytearray, int, float, bool, type(None))


class BoundedUnpickler(pickle._Unpickler):  # type: ignore[name-defined]  # the pure-Python unpickler
    """Unpickles at most ``size`` bytes of ``file`` (its remaining bytes when None) within the limits above.

    ``restricted``: check numpy's rebuilders and the builtins' calls (False: a trusted file, loaded with
    ``weights_only=False``, where only the reads are bounded). Subclasses choose the globals (``find_class``)."""

    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def __init__(self, file: IO[bytes], *, source: str, size: int | None = None, restricted: bool = True) -> None:
        size = stream_size(file) if size is None else size
        if size is None:
            raise TypeError(f"{source}: a bounded unpickler needs a seekable file or its size")
        super().__init__(BoundedReader(file, size))
        self.source, self.restricted = source, restricted
        self.budget = MAX_EXPANSION * size + EXPANSION_SLACK
        self._fresh: tuple[np.dtype, list[int]] | None = None  # a dtype before its BUILD, and its memo slots
        self._globals: set[int] = set()  # ids of the objects find_class gave: shared, so never given a state

    def load(self) -> Any:
        try:
            return super().load()
        except PickleLimitError as error:
            message = str(error)
            if message.startswith("kiln.load:"):
                raise
            raise PickleLimitError(f"kiln.load: {self.source} {message}") from None
        except RecursionError:
            raise PickleLimitError(f"kiln.load: {self.source} is nested too deeply to rebuild") from None

    # ------------------------------------------------------------------ calls
    def call(self, func: Any, args: Any, kwargs: Any = None, new: bool = False) -> Any:
        """``func(*args, **kwargs)`` (``func.__new__(func, ...)`` when ``new``), charged and checked first."""
        if not isinstance(args, tuple) or not (kwargs is None or isinstance(kwargs, dict)):
            raise pickle.UnpicklingError(f"calls {getattr(func, '__name__', type(func).__name__)} with arguments "
                                         f"{type(args).__name__}, not a tuple")  # fmt: skip
        kwargs = kwargs or {}
        if self.restricted:
            func = self.check_call(func, args, kwargs)
        if new:
            return func.__new__(func, *args, **kwargs)
        result = func(*args, **kwargs)
        if isinstance(result, np.dtype):
            self._fresh = (result, [])
        return result

    def check_call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The callable to call for ``func`` once its cost is charged; refuses numpy classes."""
        cost = _COSTS.get(func)
        if cost is not None:
            self.charge(cost(args, kwargs), f"{func.__name__}() of {type(args[0]).__name__ if args else 'nothing'}")
        elif func is str and not all(isinstance(a, _STR_SOURCES) for a in args):
            raise PickleLimitError(f"calls str() on a {type(args[0]).__name__}; a weights-only load converts only "
                                   "strings, bytes and numbers")  # fmt: skip
        elif func is np.dtype:
            from .numpy_rebuild import make_dtype  # noqa: PLC0415 - numpy_rebuild imports this module

            return make_dtype
        elif isinstance(func, type) and issubclass(func, np.ndarray | np.generic | np.dtype):
            raise PickleLimitError(f"calls numpy.{func.__name__} directly; a weights-only load rebuilds numpy "
                                   "arrays only as numpy pickles them (_reconstruct, then their state)")  # fmt: skip
        return func

    def charge(self, nbytes: int, what: str) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise PickleLimitError(f"asks for more memory than its size allows: {what} would take {nbytes} bytes; "
                                   f"a pickle may build at most {MAX_EXPANSION} bytes per byte of its size plus "
                                   f"{EXPANSION_SLACK >> 20} MiB (kiln.serialization.unpickler.MAX_EXPANSION)")  # fmt: skip

    def load_reduce(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = self.call(self.stack[-1], args)

    def load_newobj(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = self.call(self.stack[-1], args, new=True)

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        self.stack[-1] = self.call(self.stack[-1], args, kwargs, new=True)

    def _instantiate(self, klass: Any, args: list) -> None:  # INST and OBJ (protocols 0 and 1)
        new = not args and isinstance(klass, type) and not hasattr(klass, "__getinitargs__")
        self.append(self.call(klass, tuple(args), new=new))

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    # ------------------------------------------------------------------ BUILD and the memo
    def load_global(self) -> None:
        super().load_global()
        self._globals.add(id(self.stack[-1]))

    def load_stack_global(self) -> None:
        super().load_stack_global()
        self._globals.add(id(self.stack[-1]))

    dispatch[pickle.GLOBAL[0]] = load_global
    dispatch[pickle.STACK_GLOBAL[0]] = load_stack_global

    def load_build(self) -> None:
        target = self.stack[-2]  # the state is on top, the object it is for below it
        if self.restricted and id(target) in self._globals:  # BUILD on a class or a dtype would change it for all
            name = getattr(target, "__qualname__", None) or repr(target)[:60]
            raise PickleLimitError(f"gives the global {name} a state; "
                                   "a weights-only load gives state only to the objects the pickle builds")  # fmt: skip
        if self.restricted and isinstance(target, np.ndarray | np.dtype | np.generic):
            from .numpy_rebuild import build_array, build_dtype  # noqa: PLC0415

            state = self.stack.pop()
            if isinstance(target, np.generic):
                raise PickleLimitError(f"gives the numpy scalar {str(target)[:40]} a state; numpy never pickles one")
            if isinstance(target, np.ndarray):
                build_array(target, state)
                return
            built = build_dtype(target, state)
            self.stack[-1] = built
            if self._fresh is not None and self._fresh[0] is target:
                for slot in self._fresh[1]:  # the memo kept the dtype before its state: give it the built one
                    self.memo[slot] = built
            self._fresh = None
            return
        super().load_build()

    def memo_put(self, slot: int) -> None:
        value = self.stack[-1]
        self.memo[slot] = value
        if self._fresh is not None and self._fresh[0] is value:
            self._fresh[1].append(slot)

    def load_put(self) -> None:
        slot = int(self.readline()[:-1])
        if slot < 0:
            raise pickle.UnpicklingError("negative PUT argument")
        self.memo_put(slot)

    def load_binput(self) -> None:
        self.memo_put(self.read(1)[0])

    def load_long_binput(self) -> None:
        self.memo_put(struct.unpack("<I", self.read(4))[0])

    def load_memoize(self) -> None:
        self.memo_put(len(self.memo))

    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.PUT[0]] = load_put
    dispatch[pickle.BINPUT[0]] = load_binput
    dispatch[pickle.LONG_BINPUT[0]] = load_long_binput
    dispatch[pickle.MEMOIZE[0]] = load_memoize

    def _invalid_opcode(self) -> None:
        raise pickle.UnpicklingError("invalid load key: a byte that is no pickle opcode")

    for _code in range(256):
        dispatch.setdefault(_code, _invalid_opcode)
    del _code

    # ------------------------------------------------------------------ the extension registry
    def get_extension(self, code: int) -> None:
        raise PickleLimitError(f"uses the pickle extension registry (an EXT opcode, code {code}), which names "
                               "globals outside the file; kiln does not read such pickles")  # fmt: skip
