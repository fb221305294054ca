"""Writing safetensors files: an 8-byte header length, a JSON header, then each tensor's bytes in turn.

kiln writes the format itself rather than through ``safetensors.numpy.save`` so that bfloat16 arrays
(``ml_dtypes``) are stored as ``BF16``, and so that each array is written straight from its memory
instead of being gathered into one ``bytes`` object first (half the peak memory for a large file).

>>> import io, numpy as np, safetensors.numpy
>>> buffer = io.BytesIO()
>>> write_safetensors({"w": np.arange(3, dtype=np.float32)}, {"note": "hi"}, buffer)
>>> safetensors.numpy.load(buffer.getvalue())["w"].tolist()
[0.0, 1.0, 2.0]
"""

from __future__ import annotations

import json
import os
import struct
from typing import IO

import numpy as np

__all__ = ["write_safetensors"]

_NAMES = {"b": "BOOL", "u1": "U8", "i1": "I8", "i2": "I16", "i4": "I32", "i8": "I64", "f2": "F16", "f4": "F32",
          "f8": "F64"}  # fmt: skip


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.name == "bfloat16":
        return "BF16"
    code = "b" if dtype.kind == "b" else f"{dtype.kind}{dtype.itemsize}"
    if code not in _NAMES:
        raise TypeError(f"safetensors cannot store numpy dtype {dtype}")
    return _NAMES[code]


def write_safetensors(arrays: dict[str, np.ndarray], metadata: dict[str, str], f: str | os.PathLike | IO[bytes]):
    """Write ``arrays`` (C-contiguous, little-endian) and text ``metadata`` to a path or binary file object."""
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, array in arrays.items():
        header[name] = {"dtype": _dtype_name(array.dtype), "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}  # fmt: skip
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    if isinstance(f, str | os.PathLike):
        with open(f, "wb") as stream:
            _write(stream, text, arrays)
    else:
        _write(f, text, arrays)


def _write(stream: IO[bytes], text: bytes, arrays: dict[str, np.ndarray]) -> None:
    stream.write(struct.pack("<Q", len(text)))
    stream.write(text)
    for array in arrays.values():
        contiguous = np.ascontiguousarray(array)
        if contiguous.dtype.byteorder == ">":
            contiguous = contiguous.astype(contiguous.dtype.newbyteorder("<"))
        stream.write(contiguous.reshape(-1).view(np.uint8).data)
