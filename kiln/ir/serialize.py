"""Graphs as JSON, and graph files: one safetensors file holding the graph, its constants and more tensors.

JSON form (``graph_to_json``; plain dicts, lists, str, int, float, bool and None; strict JSON)::

    {"inputs": [{"id": 0, "type": {"shape": [2, 3], "dtype": "f32", "device": "cpu"}}],
     "nodes": [{"op": "reduce_sum", "inputs": [0], "attrs": {"axes": {"tuple": [1]}, "keepdim": false},
                "outputs": [{"id": 1, "type": ...}], "loc": {"file": "m.py", "line": 3, "function": "f"}}],
     "outputs": [1]}

A dimension is an int, or a symbolic dimension's name as a string (``"shape": ["B", 128]``), or a
product of them as its text (``"3*T"``, ``"B*T"``).
Attribute values: ints, finite floats, bools, strings and null as themselves; the rest as
one-key objects: ``{"float": "nan" | "inf" | "-inf"}``, ``{"dtype": "f32"}``, ``{"sym": "B"}``,
``{"tuple": [...]}``.
Constant arrays are not in the JSON; ``graph_from_json`` takes them as an argument. A kernel (or
loop) node's ``bodies`` attribute is ``{"graphs": [<graph JSON>, ...]}``, each body in this same form
with its own value ids; the bodies' constants travel in the same table as the graph's, under
qualified names (``k0/0/c1``: constant ``c1`` of body 0 of kernel ``k0``; see
``kiln.ir.graph.qualified_constants``).

A graph file (``save_graph_file``) is a safetensors file: tensors ``constants/<name>`` (the
graph's constants) and ``tensors/<name>`` (anything else the caller stores, e.g. parameters);
its text metadata holds ``format`` ("kiln.graph"), ``format_version``, ``graph`` (the JSON) and
``metadata`` (the caller's JSON). Loading parses JSON and raw tensor bytes only -- no pickle,
no code -- and verifies the graph.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from .dtypes import ALL_DTYPES, DType
from .graph import NESTING_OPS, QUALIFIER, Graph, Node, SourceLocation, Value, body_constants, qualified_constants
from .tensor_file import TensorFileError, read_tensor_file
from .types import Dim, Sym, TensorType, device, parse_dim
from .verifier import VerificationError, verify

__all__ = ["FORMAT_VERSION", "FormatError", "graph_from_json", "graph_to_json", "load_graph_file", "save_graph_file"]

#: The newest graph-file format this kiln writes and reads.
FORMAT_VERSION = 1
FORMAT_NAME = "kiln.graph"
_CONSTANT_PREFIX = "constants/"
_TENSOR_PREFIX = "tensors/"
_DTYPES = {d.short: d for d in ALL_DTYPES}
_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class FormatError(ValueError):
    """A graph's JSON or a graph file is malformed, truncated, or of a newer format."""


# -- graph -> JSON ---------------------------------------------------------------------------


def graph_to_json(graph: Graph) -> dict:
    """The graph as plain JSON data (see the module docstring); ``json.dumps(..., allow_nan=False)`` works."""
    return {
        "inputs": [_value_to_json(v) for v in graph.inputs],
        "nodes": [_node_to_json(node) for node in graph.nodes],
        "outputs": [v.id for v in graph.outputs],
    }


def _type_to_json(t: TensorType) -> dict:
    shape = [str(d) if isinstance(d, Sym) else int(d) for d in t.shape]  # a name, or a product: 3*T
    return {"shape": shape, "dtype": t.dtype.short, "device": str(t.device)}


def _value_to_json(value: Value) -> dict:
    return {"id": value.id, "type": _type_to_json(value.type)}


def _node_to_json(node: Node) -> dict:
    loc = None
    if node.loc is not None:
        loc = {"file": node.loc.filename, "line": node.loc.line, "function": node.loc.function}
    return {
        "op": node.op,
        "inputs": [v.id for v in node.inputs],
        "attrs": {key: _node_attr_to_json(node, key, value) for key, value in node.attrs.items()},
        "outputs": [_value_to_json(v) for v in node.outputs],
        "loc": loc,
    }


def _node_attr_to_json(node: Node, key: str, value: Any) -> Any:
    if node.op in NESTING_OPS and key == "bodies" and isinstance(value, tuple):
        return {"graphs": [graph_to_json(body) for body in value]}
    return _attr_to_json(value)


def _attr_to_json(value: Any) -> Any:
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, DType):
        return {"dtype": value.short}
    if isinstance(value, Sym):
        return {"sym": str(value)}
    if isinstance(value, tuple):
        return {"tuple": [_attr_to_json(v) for v in value]}
    raise TypeError(f"cannot serialize attribute value {value!r} of type {type(value).__name__}")


# -- JSON -> graph ---------------------------------------------------------------------------


def graph_from_json(obj: Any, constants: Mapping[str, np.ndarray], *, check: bool = True) -> Graph:
    """Rebuild and verify a graph from ``graph_to_json``'s form; ``FormatError`` names the bad field.

    ``check=False`` skips the verifier (the structure is still checked while reading): for a graph
    kiln itself wrote and signed, such as a compile-cache entry, which the verifier would only
    repeat (the program compiled from it on a miss ran unverified too, unless ``verify=True``)."""
    try:
        graph = _JsonReader().graph(obj, constants)
    except RecursionError:
        raise FormatError("graph JSON: nested too deeply") from None
    if check:
        verify(graph)
    return graph


class _JsonReader:
    def __init__(self, prefix: str = "") -> None:
        self.values: dict[int, Value] = {}
        self.prefix = prefix  # where this graph is: "" or "nodes[3].attrs.bodies[0]."
        self.constants: Mapping[str, np.ndarray] = {}

    def graph(self, obj: Any, constants: Mapping[str, np.ndarray]) -> Graph:
        if not isinstance(constants, Mapping):
            raise FormatError(f"constants: expected a mapping of names to arrays, got {type(constants).__name__}")
        self.constants = constants
        p = self.prefix
        obj = _check_dict(obj, p + "graph" if p else "graph", {"inputs", "nodes", "outputs"})
        inputs = [self.define(v, f"{p}inputs[{i}]") for i, v in enumerate(_check_list(obj["inputs"], p + "inputs"))]
        nodes = [self.node(n, f"{p}nodes[{i}]") for i, n in enumerate(_check_list(obj["nodes"], p + "nodes"))]
        outputs = [self.use(v, f"{p}outputs[{i}]") for i, v in enumerate(_check_list(obj["outputs"], p + "outputs"))]
        kernels = {node.attrs.get("name") for node in nodes if node.op in NESTING_OPS}
        own = {key: value for key, value in constants.items() if key.partition(QUALIFIER)[0] not in kernels}
        return Graph(tuple(inputs), tuple(nodes), tuple(outputs), own)

    def bodies(self, obj: Any, path: str, name: Any) -> tuple[Graph, ...]:
        obj = _check_dict(obj, path, {"graphs"})
        bodies = []
        for i, body in enumerate(_check_list(obj["graphs"], f"{path}.graphs")):
            table = body_constants(self.constants, name, i) if isinstance(name, str) else {}
            bodies.append(_JsonReader(f"{path}.graphs[{i}].").graph(body, table))
        return tuple(bodies)

    def define(self, obj: Any, path: str) -> Value:
        obj = _check_dict(obj, path, {"id", "type"})
        value_id = _check_int(obj["id"], f"{path}.id", minimum=0)
        if value_id in self.values:
            raise FormatError(f"graph JSON: {path}.id: %{value_id} is defined twice")
        value = Value(value_id, _type_from_json(obj["type"], f"{path}.type"))
        self.values[value_id] = value
        return value

    def use(self, obj: Any, path: str) -> Value:
        value_id = _check_int(obj, path, minimum=0)
        if value_id not in self.values:
            raise FormatError(f"graph JSON: {path}: %{value_id} is not defined before it is used")
        return self.values[value_id]

    def node(self, obj: Any, path: str) -> Node:
        obj = _check_dict(obj, path, {"op", "inputs", "attrs", "outputs", "loc"})
        op = _check_str(obj["op"], f"{path}.op")
        inputs = [
            self.use(v, f"{path}.inputs[{i}]") for i, v in enumerate(_check_list(obj["inputs"], f"{path}.inputs"))
        ]
        attrs_obj = _check_dict(obj["attrs"], f"{path}.attrs", None)
        attrs = {
            key: _attr_from_json(value, f"{path}.attrs.{key}")
            for key, value in attrs_obj.items()
            if not (op in NESTING_OPS and key == "bodies")
        }
        if op in NESTING_OPS and "bodies" in attrs_obj:
            attrs["bodies"] = self.bodies(attrs_obj["bodies"], f"{path}.attrs.bodies", attrs.get("name"))
        loc = None if obj["loc"] is None else _loc_from_json(obj["loc"], f"{path}.loc")
        out_list = _check_list(obj["outputs"], f"{path}.outputs")
        outputs = [self.define(v, f"{path}.outputs[{i}]") for i, v in enumerate(out_list)]
        return Node(op, tuple(inputs), attrs, tuple(outputs), loc)


def _type_from_json(obj: Any, path: str) -> TensorType:
    obj = _check_dict(obj, path, {"shape", "dtype", "device"})
    shape = tuple(_dim_from_json(d, f"{path}.shape[{i}]") for i, d in enumerate(_check_list(obj["shape"], path)))
    dtype = _dtype_from_json(obj["dtype"], f"{path}.dtype")
    spec = _check_str(obj["device"], f"{path}.device")
    try:
        dev = device(spec)
    except ValueError:
        raise FormatError(
            f"graph JSON: {path}.device: expected a device such as 'cpu' or 'cuda:0', got {spec!r}"
        ) from None
    return TensorType(shape, dtype, dev)


def _dim_from_json(obj: Any, path: str) -> Dim:
    if isinstance(obj, str):
        return _sym_from_json(obj, path)
    if type(obj) is not int or obj < 0:
        raise FormatError(f"graph JSON: {path}: expected an integer >= 0 or a symbol's name, got {obj!r:.80}")
    return obj


def _sym_from_json(obj: Any, path: str) -> Sym:
    try:
        if isinstance(obj, str) and ("*" in obj or "(" in obj):  # a product (3*T) or a sum ((H-2)//2)
            dim = parse_dim(obj)
            if not isinstance(dim, Sym):
                raise ValueError(f"a product or sum of symbols names one, got {obj!r}")
            return dim
        return Sym(obj)
    except ValueError as error:
        raise FormatError(f"graph JSON: {path}: {error}") from None


def _dtype_from_json(obj: Any, path: str) -> DType:
    name = _check_str(obj, path)
    if name not in _DTYPES:
        raise FormatError(f"graph JSON: {path}: expected a dtype ({', '.join(_DTYPES)}), got {name!r}")
    return _DTYPES[name]


def _loc_from_json(obj: Any, path: str) -> SourceLocation:
    obj = _check_dict(obj, path, {"file", "line", "function"})
    filename = _check_str(obj["file"], f"{path}.file")
    return SourceLocation(
        filename, _check_int(obj["line"], f"{path}.line"), _check_str(obj["function"], f"{path}.function")
    )


def _attr_from_json(obj: Any, path: str) -> Any:
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if isinstance(obj, dict) and len(obj) == 1:
        (tag, payload), *_ = obj.items()
        if tag == "float" and payload in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[payload]
        if tag == "dtype":
            return _dtype_from_json(payload, f"{path}.dtype")
        if tag == "sym":
            return _sym_from_json(payload, f"{path}.sym")
        if tag == "tuple":
            return tuple(_attr_from_json(v, f"{path}[{i}]") for i, v in enumerate(_check_list(payload, path)))
    raise FormatError(
        f"graph JSON: {path}: expected an int, float, bool, string, null or one of "
        f'{{"float": "nan"|"inf"|"-inf"}}, {{"dtype": name}}, {{"sym": name}}, {{"tuple": [...]}}; got {obj!r:.80}'
    )


def _check_dict(obj: Any, path: str, keys: set[str] | None) -> dict:
    if not isinstance(obj, dict):
        raise FormatError(f"graph JSON: {path}: expected an object, got {_kind(obj)}")
    if keys is not None and set(obj) != keys:
        missing, extra = sorted(keys - set(obj)), sorted(set(obj) - keys)
        raise FormatError(
            f"graph JSON: {path}: expected the keys {sorted(keys)}; missing {missing}, unexpected {extra}"
        )
    if keys is None and not all(isinstance(k, str) for k in obj):
        raise FormatError(f"graph JSON: {path}: expected string keys")
    return obj


def _check_list(obj: Any, path: str) -> list:
    if not isinstance(obj, list):
        raise FormatError(f"graph JSON: {path}: expected a list, got {_kind(obj)}")
    return obj


def _check_int(obj: Any, path: str, minimum: int | None = None) -> int:
    if type(obj) is not int or (minimum is not None and obj < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise FormatError(f"graph JSON: {path}: expected an integer{bound}, got {obj!r:.80}")
    return obj


def _check_str(obj: Any, path: str) -> str:
    if not isinstance(obj, str):
        raise FormatError(f"graph JSON: {path}: expected a string, got {_kind(obj)}")
    return obj


def _kind(obj: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(type(obj), repr(obj)[:80])


# -- files -----------------------------------------------------------------------------------


def save_graph_file(
    path: str | os.PathLike,
    graph: Graph,
    *,
    tensors: Mapping[str, np.ndarray] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Write ``graph`` (verified first), its constants, ``tensors`` and JSON-able ``metadata`` to one file.

    The write is atomic: a temporary file in the same directory, then ``os.replace``.
    """
    verify(graph)
    arrays = {
        _CONSTANT_PREFIX + name: _contiguous(a, f"constant {name!r}") for name, a in qualified_constants(graph).items()
    }
    for name, array in (tensors or {}).items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be strings, got {name!r}")
        arrays[_TENSOR_PREFIX + name] = _contiguous(array, f"tensor {name!r}")
    try:
        user = json.dumps(dict(metadata or {}), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(f"metadata must be JSON-serializable (no nan/inf): {error}") from None
    header = {
        "format": FORMAT_NAME,
        "format_version": str(FORMAT_VERSION),
        "graph": json.dumps(graph_to_json(graph), allow_nan=False, separators=(",", ":")),
        "metadata": user,
    }
    _write_atomically(os.fspath(path), arrays, header)


def _contiguous(array: Any, what: str) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, got {type(array).__name__}")
    # safetensors writes the raw buffer: a strided view would be garbled. (Not np.ascontiguousarray: it makes 0-d 1-d.)
    return array if array.flags.c_contiguous else array.copy(order="C")


def _write_atomically(path: str, arrays: dict[str, np.ndarray], header: dict[str, str]) -> None:
    from safetensors.numpy import save_file  # noqa: PLC0415 - only needed when writing files

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    os.close(fd)
    try:
        save_file(arrays, tmp, metadata=header)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_graph_file(path: str | os.PathLike) -> tuple[Graph, dict[str, np.ndarray], dict]:
    """Read a file written by ``save_graph_file``: ``(graph, tensors, metadata)``; the graph is verified.

    Errors name the file: ``FormatError`` (not a graph file, truncated, newer format, bad JSON)
    or ``VerificationError`` (a graph that breaks the IR's rules, e.g. an edited type).
    """
    path = os.fspath(path)
    header, constants, tensors = _read_safetensors(path)
    try:
        graph_json = json.loads(header["graph"], parse_constant=_reject_constant)
        metadata = json.loads(header["metadata"], parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:
        raise FormatError(f"{path}: the graph or metadata entry is not valid JSON: {error}") from None
    if not isinstance(metadata, dict):
        raise FormatError(f"{path}: the metadata entry must be a JSON object, got {_kind(metadata)}")
    try:
        graph = graph_from_json(graph_json, constants)
    except FormatError as error:
        raise FormatError(f"{path}: {error}") from error
    except VerificationError as error:
        raise VerificationError(f"{path}: {error}") from error
    return graph, tensors, metadata


def _read_safetensors(path: str) -> tuple[dict[str, str], dict[str, np.ndarray], dict[str, np.ndarray]]:
    # read_tensor_file checks the file (regular, sizes that fit) before it reads any tensor
    try:
        header, arrays = read_tensor_file(path)
    except TensorFileError as error:
        raise FormatError(f"{path}: not a readable safetensors file: it {error}") from None
    _check_header(path, header)
    constants: dict[str, np.ndarray] = {}
    tensors: dict[str, np.ndarray] = {}
    for key, array in arrays.items():
        if key.startswith(_CONSTANT_PREFIX):
            constants[key[len(_CONSTANT_PREFIX) :]] = array
        elif key.startswith(_TENSOR_PREFIX):
            tensors[key[len(_TENSOR_PREFIX) :]] = array
        else:
            raise FormatError(f"{path}: unexpected tensor {key!r} (expected constants/... or tensors/...)")
    return header, constants, tensors


def _check_header(path: str, header: dict[str, str]) -> None:
    if header.get("format") != FORMAT_NAME:
        raise FormatError(f"{path}: not a kiln graph file (its metadata has no format={FORMAT_NAME!r})")
    version = header.get("format_version", "")
    if not version.isdigit() or not version.isascii():
        raise FormatError(f"{path}: expected an integer format_version, got {version!r}")
    if int(version) < 1:
        raise FormatError(f"{path}: format_version must be at least 1, got {version}")
    if int(version) > FORMAT_VERSION:
        raise FormatError(
            f"{path}: written in graph format version {version}, newer than this kiln reads ({FORMAT_VERSION}); "
            "upgrade kiln to load it"
        )
    missing = [key for key in ("graph", "metadata") if key not in header]
    if missing:
        raise FormatError(f"{path}: the file's metadata lacks {missing}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")
