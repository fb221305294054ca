"""``kiln.save`` / ``kiln.load``: tensors and nested Python structure in a safetensors file, without pickle.

Format (version 1): a standard safetensors file. Every distinct tensor object is stored once, named
``"0"``, ``"1"``, ... The safetensors metadata holds two strings: ``"kiln.format": "1"`` and
``"kiln.structure"``, a tagged JSON encoding of the saved object:

- ``null``, ``true``/``false``, JSON integers and JSON strings stand for None, bools, ints and strs;
- ``{"float": "<repr>"}`` a float (``"nan"``, ``"inf"``, ``"-inf"`` included);
- a JSON list is a list; ``{"tuple": [...]}`` a tuple;
- ``{"dict": [[key, value], ...], "ordered": bool}`` a dict (``ordered``: an OrderedDict); keys are
  encoded like values, so int, tuple, float, bool and None keys survive;
- ``{"tensor": "<name>", "dtype": "float32", "shape": [...], "requires_grad": bool, "device": "cpu"}``.

Loading only ever builds these types: a file from a stranger cannot run code.
"""

from __future__ import annotations

import io
import json
import os
import struct
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import safetensors.numpy

from .frontend.ops.creation import from_numpy
from .frontend.tensor import Tensor
from .ir import dtypes as dt
from .ir.types import device as parse_device

__all__ = ["load", "save"]

FORMAT_VERSION = "1"
_MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.names: dict[int, str] = {}  # id(tensor) -> stored name: a tensor met twice is stored once

    def encode(self, obj, where: str):
        if obj is None or isinstance(obj, bool | str):
            return obj
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return {"float": repr(float(obj))}
        if isinstance(obj, Tensor):
            return self.tensor(obj)
        if isinstance(obj, list):
            return [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return {"tuple": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
        if type(obj) in (dict, OrderedDict):
            items = [[self.encode(k, where), self.encode(v, f"{where}[{k!r}]")] for k, v in obj.items()]
            return {"dict": items, "ordered": type(obj) is OrderedDict}
        raise TypeError(
            f"kiln.save can store tensors, dicts, lists, tuples, str, int, float, bool and None; "
            f"got {type(obj).__name__} at {where}"
        )

    def tensor(self, t: Tensor) -> dict:
        name = self.names.get(id(t))
        if name is None:
            name = self.names[id(t)] = str(len(self.arrays))
            host = t._host()
            self.arrays[name] = host if host.flags.c_contiguous else host.copy(order="C")  # keeps 0-d as 0-d
        return {
            "tensor": name,
            "dtype": t.dtype.name,
            "shape": list(t.shape),
            "requires_grad": t.requires_grad,
            "device": str(t.device),
        }


def save(obj, f) -> None:
    """Write ``obj`` (tensors in nested dicts/lists/tuples of plain values) to a path or binary file."""
    enc = _Encoder()
    structure = enc.encode(obj, "obj")
    metadata = {"kiln.format": FORMAT_VERSION, "kiln.structure": json.dumps(structure, allow_nan=False)}
    data = safetensors.numpy.save(enc.arrays, metadata=metadata)
    if isinstance(f, str | os.PathLike):
        with open(f, "wb") as fh:
            fh.write(data)
    else:
        f.write(data)


def _fail(source: str, problem: str) -> ValueError:
    return ValueError(f"kiln.load: {source} {problem}")


def _read(f) -> tuple[bytes, str]:
    if isinstance(f, str | os.PathLike):
        with open(f, "rb") as fh:
            return fh.read(), repr(os.fspath(f))
    return f.read(), "the given file object" if not isinstance(f, io.BytesIO) else "the given BytesIO"


def _header(data: bytes, source: str) -> dict:
    if len(data) < 8:
        raise _fail(source, f"is not a kiln file: {len(data)} bytes, too short for a header (truncated?)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > _MAX_HEADER or 8 + size > len(data):
        raise _fail(source, f"is truncated or not a kiln file: header of {size} bytes, file of {len(data)} bytes")
    try:
        header = json.loads(data[8 : 8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(source, f"is corrupt or not a kiln file: unreadable header ({e})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or "kiln.format" not in meta:
        raise _fail(source, "is not a kiln file: a safetensors file without kiln structure metadata")
    if meta["kiln.format"] != FORMAT_VERSION:
        raise _fail(source, f"has format version {meta['kiln.format']!r}; this kiln reads version {FORMAT_VERSION}")
    return meta


class _Decoder:
    def __init__(self, arrays: dict, map_location, source: str) -> None:
        self.arrays = arrays
        self.map_location = map_location
        self.source = source
        self.built: dict[str, Tensor] = {}

    def decode(self, node):
        if node is None or isinstance(node, bool | int | str):
            return node
        if isinstance(node, list):
            return [self.decode(v) for v in node]
        if isinstance(node, dict):
            if "float" in node:
                return float(node["float"])
            if "tuple" in node:
                return tuple(self.decode(v) for v in node["tuple"])
            if "dict" in node:
                pairs = ((self._key(k), self.decode(v)) for k, v in node["dict"])
                return OrderedDict(pairs) if node.get("ordered") else dict(pairs)
            if "tensor" in node:
                return self.tensor(node)
        raise _fail(self.source, f"is corrupt: unknown structure node {str(node)[:80]}")

    def _key(self, node):
        key = self.decode(node)
        return key if not isinstance(key, list) else tuple(key)

    def tensor(self, node: dict) -> Tensor:
        name = node["tensor"]
        if name in self.built:
            return self.built[name]
        array = self.arrays.get(name)
        if array is None:
            raise _fail(self.source, f"is corrupt: tensor {name!r} is missing from the data")
        kind = dt.BY_NAME.get(node.get("dtype"))
        if kind is None or array.dtype != kind.np or list(array.shape) != node.get("shape"):
            raise _fail(self.source, f"is corrupt: tensor {name!r} does not match its description {node}")
        t = from_numpy(np.array(array, copy=True)).requires_grad_(bool(node.get("requires_grad")))
        t = self._place(t, node.get("device", "cpu"))
        self.built[name] = t
        return t

    def _place(self, t: Tensor, location: str) -> Tensor:
        target = self.map_location
        if callable(target) and not isinstance(target, str):
            moved = target(t, location)
            return t if moved is None else moved
        if isinstance(target, dict):
            target = target.get(location, location)
        if target is None:
            target = location
        device = parse_device(target)
        if device == t.device:
            return t
        requires_grad = t.requires_grad
        return t.detach().to(device).requires_grad_(requires_grad)


def load(f, map_location: str | Callable | dict | None = None):
    """Read what ``save`` wrote. ``map_location``: a device (or its name), a dict mapping stored
    device names to new ones, or a callable ``(tensor, location) -> tensor or None``, as in PyTorch.
    """
    data, source = _read(f)
    meta = _header(data, source)
    try:
        structure = json.loads(meta["kiln.structure"])
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise _fail(source, f"is corrupt: unreadable structure ({e})") from None
    try:
        arrays = safetensors.numpy.load(data)
    except Exception as e:  # safetensors reports corrupt data with its own error type
        raise _fail(source, f"is corrupt or truncated: {e}") from None
    return _Decoder(arrays, map_location, source).decode(structure)
