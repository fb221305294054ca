"""kiln's checkpoint format: tensors and nested Python structure in a safetensors file.

Format (version 2; version 1 files are read too): a standard safetensors file. Every tensor (and numpy
array) is stored under the place it was met: a state_dict's tensors keep their keys (``"fc.weight"``),
nested ones are joined with dots (``"optimizer.state.0.exp_avg"``), and a name met twice gets ``"#2"``...
(so does ``"__metadata__"``, the key safetensors keeps for its metadata, with a warning). A tensor met
at several places (tied weights: ``head.weight is emb.weight``) is written at each, since safetensors has
no aliases: ``safetensors.torch.load_file`` (or ``safetensors.numpy.load_file``) reads a saved
state_dict with every one of its keys, and the file holds the tied tensor once per key. The structure
names its first copy at every place, so ``kiln.load`` gives one tensor again, tied. The safetensors metadata holds ``"kiln.format": "2"`` and ``"kiln.structure"``, a tagged JSON
encoding of the saved object:

- ``null``, ``true``/``false``, JSON integers and JSON strings stand for None, bools, ints and strs;
- ``{"float": "<repr>"}`` a float (``"nan"``, ``"inf"``, ``"-inf"`` included);
- a JSON list is a list; ``{"tuple": [...]}`` a tuple;
- ``{"dict": [[key, value], ...], "ordered": bool}`` a dict (``ordered``: an OrderedDict); keys are
  encoded like values, so int, tuple, float, bool and None keys survive;
- ``{"tensor": "<name>", "dtype": "float32", "shape": [...], "requires_grad": bool, "device": "cpu"}``,
  with ``"parameter": true`` for an ``nn.Parameter`` and ``"attributes": {"dict": ...}`` for the Python
  attributes set on it (``p._no_weight_decay = True``; written where it is first met, encoded as any
  dict, so a pickled attribute obeys ``weights_only`` too);
- ``{"ndarray": "<name>", "dtype": "float32", "shape": [...], "scalar": bool}`` a numpy array (or a numpy
  scalar such as ``np.float64(1.5)`` when ``scalar``);
- ``{"dtype": "float32"}``, ``{"device": "cuda:0"}``, ``{"size": [2, 3]}``: a kiln dtype, device, ``Size``;
- ``{"pickle": "<base64>"}``: any other object (a whole ``nn.Module``, a user's class), pickled; the
  tensors inside it are stored like the others and named in the pickle by persistent ids.

Loading builds only the plain forms above. A ``pickle`` node is unpickled only through the weights-only
unpickler (``restricted.py``: its globals must be allowed, its allocations bounded) unless the caller passed
``weights_only=False``. Loading is bounded too: a path must name a regular file whose header's sizes fit
it (``kiln.ir.tensor_file``), each tensor is read once into its own array (about the file's size in
memory), and any structure that is not exactly one of the forms above (wrong types, missing keys,
nesting deeper than ``MAX_DEPTH``) is a ``ValueError`` naming the file and the place in the structure.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..frontend.ops.creation import from_numpy
from ..frontend.tensor import Size, Tensor
from ..ir import dtypes as dt
from ..ir.types import Device
from ..ir.types import device as parse_device
from .restricted import WeightsOnlyRefusal, WeightsOnlyUnpickler
from .writer import write_safetensors

__all__ = ["FORMAT_VERSION", "MAX_DEPTH", "decode", "encode_to"]

FORMAT_VERSION = "2"
READABLE_VERSIONS = ("1", "2")
#: Containers nested deeper than this are refused by save and load alike (PyTorch state dicts nest
#: a handful of levels; the limit keeps both sides well inside Python's recursion limit).
MAX_DEPTH = 100
#: The header key safetensors keeps for the file's metadata: a tensor saved there gets another name.
RESERVED = "__metadata__"


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.names: dict[int, str] = {}  # id(tensor or array) -> the name of its first copy
        self.keep: list[Any] = []  # what names refers to by id stays alive until the file is written

    def encode(self, obj, where: str, depth: int = 0):
        if obj is None or isinstance(obj, bool | str):
            return obj
        if isinstance(obj, np.ndarray | np.generic) and _plain_numbers(obj.dtype):
            return self.ndarray(obj, where)  # before float: np.float64 is a float, and should stay an np.float64
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return {"float": repr(float(obj))}
        if isinstance(obj, Tensor):
            return self.tensor(obj, where, depth)
        if isinstance(obj, dt.DType):
            return {"dtype": obj.name}
        if isinstance(obj, Device):
            return {"device": str(obj)}
        if isinstance(obj, Size):
            return {"size": [int(n) for n in obj]}
        if depth >= MAX_DEPTH:
            raise ValueError(f"kiln.save: {where[:200]} is nested more than {MAX_DEPTH} containers deep "
                             "(a container that holds itself?)")  # fmt: skip
        depth += 1
        if type(obj) is list:
            return [self.encode(v, _join(where, i), depth) for i, v in enumerate(obj)]
        if type(obj) is tuple:
            return {"tuple": [self.encode(v, _join(where, i), depth) for i, v in enumerate(obj)]}
        if type(obj) in (dict, OrderedDict):
            items = [[self.encode(k, where, depth), self.encode(v, _join(where, k), depth)] for k, v in obj.items()]
            return {"dict": items, "ordered": type(obj) is OrderedDict}
        return {"pickle": self.pickle(obj, where)}

    def name(self, obj, where: str) -> tuple[str, bool]:
        """``(stored name, new)`` for a tensor or array met at ``where``. One met again (tied weights) is
        written again under its new place too, so that every safetensors reader sees every key; the
        structure names the first copy, so kiln's load gives one tensor again."""
        stored = self.unique(where)
        first = self.names.get(id(obj))
        if first is not None:
            self.arrays[stored] = self.arrays[first]
            return first, False
        self.names[id(obj)] = stored
        self.keep.append(obj)
        return stored, True

    def unique(self, where: str) -> str:
        base = where or "tensor"
        name, n = base, 1
        while name in self.arrays or name == RESERVED:
            n += 1
            name = f"{base}#{n}"
        if base == RESERVED:
            warnings.warn(f"kiln.save: the key {RESERVED!r} is the name safetensors gives its metadata, so the tensor "
                          f"there is stored as {name!r}; kiln.load gives it back under {RESERVED!r}, other "
                          f"safetensors readers see {name!r}", stacklevel=4)  # fmt: skip
        return name

    def tensor(self, t: Tensor, where: str, depth: int = 0) -> dict:
        name, new = self.name(t, where)
        if new:
            host = t._host()
            self.arrays[name] = host if host.flags.c_contiguous else host.copy(order="C")  # keeps 0-d as 0-d
        node = {
            "tensor": name,
            "dtype": t.dtype.name,
            "shape": list(t.shape),
            "requires_grad": t.requires_grad,
            "device": str(t.device),
        }
        if _is_parameter(t):
            node["parameter"] = True
        if new and t.__dict__:  # (met again, it is the first copy again, attributes and all)
            node["attributes"] = self.encode(dict(t.__dict__), f"{where}.__dict__", depth)
        return node

    def ndarray(self, a, where: str) -> dict:
        name, new = self.name(a, where)
        array = np.asarray(a)
        if new:
            self.arrays[name] = array if array.flags.c_contiguous else array.copy(order="C")
        dtype = dt.from_numpy_dtype(array.dtype).name
        return {"ndarray": name, "dtype": dtype, "shape": list(array.shape), "scalar": isinstance(a, np.generic)}

    def pickle(self, obj, where: str) -> str:
        buffer = io.BytesIO()
        encoder = self

        class Pickler(pickle.Pickler):
            def persistent_id(self, value):
                if isinstance(value, Tensor):  # tensors travel in the safetensors data, not in the pickle
                    return encoder.tensor(value, f"{where}.pickle.{len(encoder.arrays)}")
                return None

        try:
            Pickler(buffer, protocol=4).dump(obj)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise TypeError(f"kiln.save: {where or 'the object'} is a {type(obj).__name__}, which is neither a tensor nor a plain "
                            f"container, and it cannot be pickled either: {error}") from error  # fmt: skip
        return base64.b64encode(buffer.getvalue()).decode("ascii")


def _plain_numbers(dtype: np.dtype) -> bool:
    """Arrays of kiln's dtypes are stored as data; others (uint16, complex, object, str...) are pickled."""
    if not dtype.isnative or (dtype.kind not in "biuf" and dtype.name != "bfloat16"):
        return False
    try:
        dt.from_numpy_dtype(dtype)
    except TypeError:
        return False
    return True


def _join(where: str, key) -> str:
    return f"{where}.{key}" if where else str(key)


def _is_parameter(t: Tensor) -> bool:
    from ..nn.parameter import Parameter  # noqa: PLC0415 - serialization sits above nn

    return isinstance(t, Parameter)


def encode_to(obj, f) -> None:
    """Write ``obj`` in kiln's format to a path or a binary file object."""
    enc = _Encoder()
    structure = enc.encode(obj, "")
    metadata = {"kiln.format": FORMAT_VERSION, "kiln.structure": json.dumps(structure, allow_nan=False)}
    write_safetensors(enc.arrays, metadata, f)


def _fail(source: str, problem: str) -> ValueError:
    return ValueError(f"kiln.load: {source} {problem}")


def _structure(meta: dict[str, str], source: str):
    """The saved object's tagged JSON, after the format checks; the values are strings (read_tensor_file checks)."""
    if meta["kiln.format"] not in READABLE_VERSIONS:
        raise _fail(source, f"has format version {meta['kiln.format'][:20]!r}; this kiln reads versions "
                            f"{', '.join(READABLE_VERSIONS)}")  # fmt: skip
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


_TAGS = {  # the keys of each tagged node, exactly (tensor and ndarray come before dtype: they have one too)
    "float": {"float"},
    "tuple": {"tuple"},
    "dict": {"dict", "ordered"},
    "tensor": {"tensor", "dtype", "shape", "requires_grad", "device"},
    "ndarray": {"ndarray", "dtype", "shape", "scalar"},
    "dtype": {"dtype"},
    "device": {"device"},
    "size": {"size"},
    "pickle": {"pickle"},
}
_OPTIONAL = {"tensor": {"parameter", "attributes"}}


class _Decoder:
    """Builds the saved object from its tagged JSON, checking every node's form on the way."""

    def __init__(self, arrays: dict, map_location, source: str, weights_only: bool) -> None:
        self.arrays = arrays
        self.map_location = map_location
        self.source = source
        self.weights_only = weights_only
        self.built: dict[str, Any] = {}

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
        if tag is None or not _TAGS[tag] <= set(node) <= _TAGS[tag] | _OPTIONAL.get(tag, set()):
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
        parameter = self.typed(node.get("parameter", False), bool, where, "parameter")
        if name in self.built:  # one tensor saved under several names is one tensor again
            return self.built[name]
        t = self._place(from_numpy(array).requires_grad_(requires_grad), location)  # the array is ours alone
        if parameter:
            from ..nn.parameter import Parameter  # noqa: PLC0415

            t = Parameter(t, requires_grad)
        self.built[name] = t
        if "attributes" in node:  # (after built: an attribute may hold the tensor itself)
            attributes = self.decode(node["attributes"], f"{where}.__dict__", depth + 1)
            if not isinstance(attributes, dict) or not all(isinstance(k, str) for k in attributes):
                raise self.corrupt(where, f"has attributes {str(attributes)[:80]}; expected a dict of names")
            t.__dict__.update(attributes)
        return t

    def decode_ndarray(self, node: dict, where: str, depth: int):
        name = self.typed(node["ndarray"], str, where, "ndarray")
        shape = self.typed(node["shape"], list, where, "shape")
        scalar = self.typed(node["scalar"], bool, where, "scalar")
        array = self.arrays.get(name)
        dtype = dt.BY_NAME.get(self.typed(node["dtype"], str, where, "dtype"))
        if array is None:
            raise self.corrupt(where, f"names array {name[:40]!r}, which is missing from the data")
        if dtype is None or array.dtype != dtype.np or list(array.shape) != shape or (scalar and shape):
            raise self.corrupt(where, f"describes array {name[:40]!r} as {str(node['dtype'])[:20]} {str(shape)[:80]}"
                                      f"{' scalar' if scalar else ''}, the data holds {array.dtype} "
                                      f"{list(array.shape)}")  # fmt: skip
        if name not in self.built:
            self.built[name] = array[()] if scalar else array
        return self.built[name]

    def decode_dtype(self, node: dict, where: str, depth: int) -> dt.DType:
        name = self.typed(node["dtype"], str, where, "dtype")
        try:
            return dt.as_dtype(name)
        except (TypeError, ImportError) as error:
            raise self.corrupt(where, f"names dtype {name[:40]!r}: {error}") from None

    def decode_device(self, node: dict, where: str, depth: int) -> Device:
        location = self.typed(node["device"], str, where, "device")
        try:
            return parse_device(location)
        except (ValueError, TypeError):
            raise self.corrupt(where, f"is the device {location[:40]!r}, which is not a device") from None

    def decode_size(self, node: dict, where: str, depth: int) -> Size:
        sizes = self.typed(node["size"], list, where, "size")
        if not all(type(n) is int and n >= 0 for n in sizes):
            raise self.corrupt(where, f"is a Size of {str(sizes)[:80]}; expected sizes >= 0")
        return Size(sizes)

    def decode_pickle(self, node: dict, where: str, depth: int):
        text = self.typed(node["pickle"], str, where, "pickle")
        try:
            data = base64.b64decode(text, validate=True)
        except ValueError:
            raise self.corrupt(where, "is a pickle whose base64 text is damaged") from None
        stream, decoder = io.BytesIO(data), self

        def persistent_load(pid):
            if not isinstance(pid, dict) or "tensor" not in pid:
                raise self.corrupt(where, f"holds a persistent id {str(pid)[:80]} that is not a tensor")
            return decoder.decode(pid, f"{where}.pickle", depth + 1)

        if self.weights_only:
            source = f"{self.source} (at {where})"
            # (Any: WeightsOnlyUnpickler extends pickle's pure-Python _Unpickler, not its Unpickler)
            unpickler: Any = WeightsOnlyUnpickler(stream, extra={}, persistent_load=persistent_load, source=source)
        else:
            unpickler = pickle.Unpickler(stream)
            unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
        try:
            return unpickler.load()
        except WeightsOnlyRefusal:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError) as error:
            if isinstance(error, ValueError) and str(error).startswith("kiln.load"):
                raise
            raise self.corrupt(where, f"is a pickle that cannot be read ({type(error).__name__}: {error})") from None

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


def decode(meta: dict[str, str], arrays: dict, map_location: Any, source: str, weights_only: bool):
    """The object a kiln file holds, from its safetensors metadata and arrays."""
    return _Decoder(arrays, map_location, source, weights_only).decode(_structure(meta, source))


def place(t: Tensor, location: str, map_location: str | Callable | dict | Device | None) -> Tensor:
    """``t`` (stored on ``location``) moved where ``map_location`` says, as ``torch.load`` does."""
    return _Decoder({}, map_location, "", True)._place(t, location)
