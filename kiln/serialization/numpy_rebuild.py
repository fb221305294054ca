"""numpy arrays, dtypes and scalars in weights-only pickles: rebuilt only from plain numbers.

numpy pickles an array as ``_reconstruct(ndarray, (0,), b"b")`` followed by ``BUILD`` with the state
``(version, shape, dtype, fortran, raw bytes)``, and a dtype as ``dtype("f8", False, True)`` followed by
``BUILD`` with ``(version, byteorder, subarray, names, fields, itemsize, alignment, flags)``. numpy's own
``__setstate__`` trusts that state: a dtype whose fields lie outside its item, or an object field laid
over an integer one, reads or writes outside the array (heap bytes came back; another crashed the
process). So a weights-only load never hands numpy a state it did not check:

- a dtype is built from its description string alone, and only a plain one (``PLAIN_DTYPES``: bool,
  signed and unsigned integers, floats, complex, and fixed-width byte and unicode strings, which hold
  plain bytes too); its ``BUILD`` state may only choose a byte order;
- an array's ``BUILD`` state must name such a dtype and hold exactly the bytes its shape needs;
- a scalar must name such a dtype and hold exactly one item;
- ``numpy.ndarray`` itself is never called (``ndarray((n,), object)`` would allocate ``n`` items from a few
  bytes of pickle, and a plain ``ndarray(shape)`` gives uninitialized memory).

Object dtypes, structured and void dtypes (fields, offsets), datetimes and the rest are refused with a
``PickleLimitError`` (a ``ValueError``) that says what the file asked for.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from .unpickler import PickleLimitError

__all__ = ["PLAIN_DTYPES", "build_array", "build_dtype", "make_dtype", "numpy_globals", "scalar"]

#: The dtype descriptions a weights-only pickle may name: numpy's ``dtype.str`` without the byte order
#: (numbers, and strings of 1 to 999,999,999 bytes or characters: their bytes are data, never pointers).
PLAIN_DTYPES = re.compile(r"b1|[iu][1248]|f[248]|c(8|16)|[SU][1-9][0-9]{0,8}")
_BYTEORDERS = ("<", ">", "=", "|")


def make_dtype(spec: Any, align: Any = False, copy: Any = True) -> np.dtype:
    """``numpy.dtype(spec, align, copy)`` for a plain numeric ``spec`` only (what a pickle's REDUCE calls)."""
    if not isinstance(spec, str) or not PLAIN_DTYPES.fullmatch(spec):
        raise PickleLimitError(f"names the numpy dtype {str(spec)[:60]!r}; a weights-only load rebuilds only plain "
                               "dtypes (bool, int, uint, float, complex, fixed-width strings), never object or "
                               "structured ones")  # fmt: skip
    if not isinstance(align, bool) or not isinstance(copy, bool):
        raise PickleLimitError(f"builds numpy dtype {spec!r} with align={str(align)[:20]}, copy={str(copy)[:20]}; "
                               "expected booleans")  # fmt: skip
    return np.dtype(spec)


def build_dtype(dtype: np.dtype, state: Any) -> np.dtype:
    """The dtype a ``BUILD`` of ``dtype`` with numpy's ``state`` makes: only the byte order may change."""
    plain = (
        isinstance(state, tuple)
        and len(state) in (8, 9)
        and type(state[0]) is int
        and state[1] in _BYTEORDERS
        and state[2] is None  # subarray
        and state[3] is None  # names
        and state[4] is None  # fields
        and state[5] in (-1, dtype.itemsize)
        and state[6] in (-1, dtype.alignment)
        and state[7] in (0, dtype.flags)
        and (len(state) == 8 or not state[8])  # metadata
    )
    if not plain:
        raise PickleLimitError(f"gives numpy dtype {dtype.str!r} the state {str(state)[:120]}; a weights-only load "
                               "accepts only a byte order (no fields, offsets, subarrays or metadata)")  # fmt: skip
    order = state[1]
    return dtype if order == "|" or dtype.itemsize == 1 else dtype.newbyteorder(order)


def _plain(dtype: Any, what: str) -> np.dtype:
    if not isinstance(dtype, np.dtype) or dtype.fields is not None or not PLAIN_DTYPES.fullmatch(dtype.str[1:]):
        raise PickleLimitError(f"builds {what} of dtype {str(dtype)[:60]}; a weights-only load rebuilds only plain "
                               "dtypes (numbers, fixed-width strings)")  # fmt: skip
    return dtype


def _raw(data: Any, nbytes: int, what: str) -> None:
    if not isinstance(data, bytes | bytearray) or len(data) != nbytes:
        size = f"{len(data)} bytes" if isinstance(data, bytes | bytearray) else type(data).__name__
        raise PickleLimitError(f"builds {what} that needs {nbytes} bytes of data from {size}")


def reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    """numpy's ``_reconstruct``: an empty array that ``BUILD`` fills (see ``build_array``)."""
    if subtype is not np.ndarray or shape != (0,) or typecode not in (b"b", "b"):
        raise PickleLimitError(f"reconstructs a numpy array as {str((subtype, shape, typecode))[:120]}; a "
                               "weights-only load rebuilds plain ndarrays only, as numpy pickles them")  # fmt: skip
    return np.empty(0, np.int8)


def build_array(array: np.ndarray, state: Any) -> None:
    """``array.__setstate__(state)`` once the state is checked: a plain dtype and exactly its bytes."""
    if not (isinstance(state, tuple) and len(state) == 5 and type(state[0]) is int and isinstance(state[3], bool)):
        raise PickleLimitError(f"gives a numpy array the state {str(state)[:120]}; expected (version, shape, dtype, "
                               "fortran, bytes)")  # fmt: skip
    shape, dtype, data = state[1], state[2], state[4]
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise PickleLimitError(f"gives a numpy array the shape {str(shape)[:80]}")
    dtype = _plain(dtype, f"a numpy array of shape {shape}")
    _raw(data, math.prod(shape) * dtype.itemsize, f"a numpy array of {dtype} and shape {shape}")
    array.__setstate__(state)


def scalar(dtype: Any, data: Any = None) -> np.generic:
    """numpy's ``scalar(dtype, bytes)`` for a plain dtype and exactly one item's bytes."""
    dtype = _plain(dtype, "a numpy scalar")
    _raw(data, dtype.itemsize, f"a numpy {dtype} scalar")
    return np.frombuffer(data, dtype)[0]


def numpy_globals() -> dict[str, Any]:
    """What numpy names when it pickles arrays, dtypes and scalars, mapped to the checked rebuilders
    (numpy 1 and 2 spell the module differently). ``numpy.ndarray`` and ``numpy.dtype`` are the classes
    themselves: the unpickler calls them only through ``make_dtype`` (and never calls ``ndarray``)."""
    found: dict[str, Any] = {"numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found[f"{module}._reconstruct"] = reconstruct
        found[f"{module}.scalar"] = scalar
    for spec in ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"):
        cls = type(np.dtype(spec))  # numpy 2 pickles a dtype's class as numpy.dtypes.Float32DType
        found[f"numpy.dtypes.{cls.__name__}"] = cls
    return found
