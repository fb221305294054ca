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

Loading only ever builds these types: a file from a stranger cannot run code. It is bounded too:
a path must name a regular file whose header's sizes fit it (``kiln.ir.tensor_file``), each tensor
is read once into its own array (about the file's size in memory), and any structure that is not
exactly one of the forms above (wrong types, missing keys, nesting deeper than ``MAX_DEPTH``) is a
``ValueError`` naming the file and the place in the structure.
"""

from __future__ import annotations

import io
import json
import os
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import safetensors.numpy

from .frontend.ops.creation import from_numpy
from .frontend.tensor import Tensor
from .ir import dtypes as dt
from .ir.tensor_file import TensorFileError, read_tensor_file
from .ir.types import device as parse_device

__all__ = ["load", "save"]

FORMAT_VERSION = "1"
#: Containers nested deeper than this are refused by save and load alike (PyTorch state dicts nest
#: a handful of levels; the limit keeps both sides well inside Python's recursion limit).
MAX_DEPTH = 100


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.names: dict[int, str] = {}  # id(tensor) -> stored name: a tensor met twice is stored once

    def encode(self, obj, where: str, depth: int = 0):
        if obj is None or isinstance(obj, bool | str):
            return obj
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return {"float": repr(float(obj))}
        if isinstance(obj, Tensor):
            return self.tensor(obj)
        if depth >= MAX_DEPTH:
            raise ValueError(f"kiln.save: {where[:200]} is nested more than {MAX_DEPTH} containers deep "
                             "(a container that holds itself?)")  # fmt: skip
        depth += 1
        if isinstance(obj, list):
            return [self.encode(v, f"{where}[{i}]", depth) for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return {"tuple": [self.encode(v, f"{where}[{i}]", depth) for i, v in enumerate(obj)]}
        if type(obj) in (dict, OrderedDict):
            items = [[self.encode(k, where, depth), self.encode(v, f"{where}[{k!r}]", depth)] for k, v in obj.items()]
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


def _source(f) -> str:
    if isinstance(f, str | os.PathLike):
        return repr(os.fspath(f))
    return "the given BytesIO" if isinstance(f, io.BytesIO) else "the given file object"


def _structure(meta: dict[str, str], source: str):
    """The saved object's tagged JSON, after the format checks; the values are strings (read_tensor_file checks)."""
    if "kiln.format" not in meta:
        raise _fail(source, "is not a kiln file: a safetensors file without kiln structure metadata")
    if meta["kiln.format"] != FORMAT_VERSION:
        raise _fail(source, f"has format version {meta['kiln.format'][:20]!r}; this kiln reads version "
                            f"{FORMAT_VERSION}")  # fmt: skip
    if "kiln.structure" not in meta:
        raise _fail(source, "is corrupt: its metadata has kiln.format but no kiln.structure")
    try:
        return json.loads(meta["kiln.structure"], parse_constant=_reject_constant)
    except RecursionError:
        raise _fail(source, "is corrupt: its structure is nested too deeply to be one kiln.save wrote") from None
    except ValueError as e:
        raise _fail(source, f"is corrupt: its structure is not JSON ({e})") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not strict JSON")


_TAGS = {  # the keys of each tagged node, exactly
    "float": {"float"},
    "tuple": {"tuple"},
    "dict": {"dict", "ordered"},
    "tensor": {"tensor", "dtype", "shape", "requires_grad", "device"},
}


class _Decoder:
    """Builds the saved object from its tagged JSON, checking every node's form on the way."""

    def __init__(self, arrays: dict, map_location, source: str) -> None:
        self.arrays = arrays
        self.map_location = map_location
        self.source = source
        self.built: dict[str, Tensor] = {}

    def corrupt(self, where: str, problem: str) -> ValueError:
        where = where if len(where) <= 120 else f"{where[:60]}...{where[-40:]}"
        return _fail(self.source, f"is corrupt: the structure at {where} {problem}")

    def decode(self, node, where: str = "obj", depth: int = 0):
        if node is None or isinstance(node, bool | int | str):
            return node
        if isinstance(node, list):
            self.check_depth(where, depth)
            return [self.decode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(node)]
        tag = next((t for t in _TAGS if t in node), None) if isinstance(node, dict) else None
        if tag is None or set(node) != _TAGS[tag]:
            expected = " or ".join("{" + ", ".join(sorted(keys)) + "}" for keys in _TAGS.values())
            raise self.corrupt(where, f"is {str(node)[:80]}; expected null, a bool, int, string, list or one of "
                                      f"the objects {expected}")  # fmt: skip
        if tag in ("tuple", "dict"):
            self.check_depth(where, depth)
        return getattr(self, "decode_" + tag)(node, where, depth)

    def check_depth(self, where: str, depth: int) -> None:
        if depth >= MAX_DEPTH:  # containers only, counted as save counts them
            raise self.corrupt(where, f"is nested more than {MAX_DEPTH} containers deep")

    def decode_float(self, node: dict, where: str, depth: int) -> float:
        text = self.typed(node["float"], str, where, "float")
        try:
            return float(text)
        except ValueError:
            raise self.corrupt(where, f"is a float written as {text[:40]!r}, which is not a number") from None

    def decode_tuple(self, node: dict, where: str, depth: int) -> tuple:
        items = self.typed(node["tuple"], list, where, "tuple")
        return tuple(self.decode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(items))

    def decode_dict(self, node: dict, where: str, depth: int) -> dict:
        ordered = self.typed(node["ordered"], bool, where, "ordered")
        out: dict = OrderedDict() if ordered else {}
        for i, pair in enumerate(self.typed(node["dict"], list, where, "dict")):
            if not isinstance(pair, list) or len(pair) != 2:
                raise self.corrupt(f"{where}.dict[{i}]", f"is {str(pair)[:80]}; expected a [key, value] pair")
            key = self.decode(pair[0], f"{where}.dict[{i}][0]", depth + 1)
            key = tuple(key) if isinstance(key, list) else key
            try:
                hash(key)
            except TypeError:
                raise self.corrupt(f"{where}.dict[{i}][0]", f"is a key of type {type(key).__name__}, "
                                                            "which a dict cannot have") from None  # fmt: skip
            out[key] = self.decode(pair[1], f"{where}[{key!r}]", depth + 1)
        return out

    def typed(self, value, kind: type, where: str, field: str):
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise self.corrupt(where, f"has {field} = {str(value)[:80]}; expected a {kind.__name__}")
        return value

    def decode_tensor(self, node: dict, where: str, depth: int) -> Tensor:
        name = self.typed(node["tensor"], str, where, "tensor")
        dtype = dt.BY_NAME.get(self.typed(node["dtype"], str, where, "dtype"))
        shape = self.typed(node["shape"], list, where, "shape")
        requires_grad = self.typed(node["requires_grad"], bool, where, "requires_grad")
        location = self.typed(node["device"], str, where, "device")
        array = self.arrays.get(name)
        if array is None:
            raise self.corrupt(where, f"names tensor {name[:40]!r}, which is missing from the data")
        if dtype is None or array.dtype != dtype.np or list(array.shape) != shape:
            raise self.corrupt(where, f"describes tensor {name[:40]!r} as {str(node['dtype'])[:20]} {str(shape)[:80]}, "
                                      f"the data holds {array.dtype} {list(array.shape)}")  # fmt: skip
        if requires_grad and dtype.category != dt.FLOATING:
            raise self.corrupt(where, f"asks {dtype.name} tensor {name[:40]!r} to require grad; only floating "
                                      "point tensors can")  # fmt: skip
        try:
            parse_device(location)
        except (ValueError, TypeError):
            raise self.corrupt(
                where, f"places tensor {name[:40]!r} on {location[:40]!r}, which is not a device"
            ) from None
        if name in self.built:  # one tensor saved under several names is one tensor again
            return self.built[name]
        t = self._place(from_numpy(array).requires_grad_(requires_grad), location)  # the array is ours alone
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

    A file that is not what ``save`` writes raises ``ValueError`` naming the file and the problem.
    """
    source = _source(f)
    try:
        meta, arrays = read_tensor_file(f)
    except TensorFileError as error:
        raise _fail(source, str(error)) from None
    return _Decoder(arrays, map_location, source).decode(_structure(meta, source))
