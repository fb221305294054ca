"""Graphs as compact bytes: what the compile cache stores, read back several times faster than JSON.

A warm start reads the fused graph of every program it loads from the disk cache; for a 2-layer
LSTM LM that graph has 4,900 nodes in 240 kernel bodies, and its JSON form (``serialize``:
an object per node, value and type, each field checked against a path) took 110-200 ms to read,
the largest part of a warm start after the trace. Here the repeated parts are tables, written
once -- op names, tensor types, source locations and attribute sets (in ``serialize``'s JSON
form, read with its checks) -- and the graph is a flat run of unsigned 32-bit integers indexing
them::

    magic b"KILNGRB\\0", u32 version, u32 n; n bytes of JSON tables {"ops", "types", "locations",
    "attrs"}; then little-endian u32s:
    graph   = n_inputs (id type)*  n_nodes node*  n_outputs id*
    node    = op attrs location+1 (0: none)  n_inputs id*  n_outputs (id type)*  bodies
    bodies  = 0 (no kernel bodies) | n_bodies + 1, then a graph per body (its own value ids),
              which replaces the null a kernel's attribute set holds for ``bodies``

Constants travel beside the bytes, as for JSON (``qualified_constants``). Reading checks what it
reads -- the magic and version, every table entry (with ``serialize``'s checks), every index in
range, every value defined once and before its use, nothing left over -- and raises
``FormatError`` otherwise; it does not run the verifier (``check=True`` does).

>>> from kiln.ir.graph import GraphBuilder
>>> from kiln.ir.types import TensorType
>>> from kiln.ir.dtypes import float32
>>> b = GraphBuilder()
>>> x = b.input(TensorType((2,), float32))
>>> g = b.build([b.node("exp", [x])])
>>> print(graph_from_bytes(graph_to_bytes(g), {}), end="")
graph(%0: f32[2]) {
  %1: f32[2] = exp(%0)
  return (%1)
}
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .graph import NESTING_OPS, QUALIFIER, Graph, Node, SourceLocation, Value
from .serialize import FormatError, _attr_from_json, _attr_to_json, _loc_from_json, _type_from_json, _type_to_json
from .types import TensorType
from .verifier import verify

__all__ = ["COMPACT_VERSION", "graph_from_bytes", "graph_to_bytes"]

#: The newest compact format this kiln writes and reads; bump it when the layout changes.
COMPACT_VERSION = 1
_MAGIC = b"KILNGRB\0"
_HEADER = struct.Struct("<8sII")  # magic, version, length of the tables' JSON
_BIG_ENDIAN = sys.byteorder == "big"
assert array("I").itemsize == 4, "the compact graph format needs 32-bit unsigned ints"


# -- graph -> bytes --------------------------------------------------------------------------


def graph_to_bytes(graph: Graph) -> bytes:
    """``graph`` (its nodes, types, attributes and locations; not its constants) as compact bytes."""
    writer = _Writer()
    writer.graph(graph)
    tables = {
        "ops": list(writer.ops),
        "types": [_type_to_json(t) for t in writer.types],
        "locations": [{"file": f, "line": line, "function": fn} for f, line, fn in writer.locations],
        "attrs": [json.loads(text) for text in writer.attrs],
    }
    text = json.dumps(tables, allow_nan=False, separators=(",", ":")).encode()
    ints = array("I", writer.ints)  # OverflowError for an id past 2**32 - 1, rather than a wrong one
    if _BIG_ENDIAN:
        ints.byteswap()
    return _HEADER.pack(_MAGIC, COMPACT_VERSION, len(text)) + text + ints.tobytes()


class _Writer:
    def __init__(self) -> None:
        self.ints: list[int] = []
        # each table: entry -> its index (dicts keep the order of first use)
        self.ops: dict[str, int] = {}
        self.types: dict[TensorType, int] = {}
        self.locations: dict[tuple[str, int, str], int] = {}
        self.attrs: dict[str, int] = {}  # the attribute set's JSON text

    def graph(self, graph: Graph) -> None:
        out = self.ints
        out.append(len(graph.inputs))
        for v in graph.inputs:
            out += (v.id, _index(self.types, v.type))
        out.append(len(graph.nodes))
        for node in graph.nodes:
            self.node(node)
        out.append(len(graph.outputs))
        out.extend(v.id for v in graph.outputs)

    def node(self, node: Node) -> None:
        bodies = (
            node.attrs["bodies"] if node.op in NESTING_OPS and isinstance(node.attrs.get("bodies"), tuple) else None
        )
        # the bodies follow the node as graphs of their own; null keeps their place among the attributes
        attrs = {k: None if bodies is not None and k == "bodies" else _attr_to_json(v) for k, v in node.attrs.items()}
        attrs_text = json.dumps(attrs, allow_nan=False, separators=(",", ":"))
        loc = node.loc
        where = 0 if loc is None else 1 + _index(self.locations, (loc.filename, loc.line, loc.function))
        out = self.ints
        out += (_index(self.ops, node.op), _index(self.attrs, attrs_text), where, len(node.inputs))
        out.extend(v.id for v in node.inputs)
        out.append(len(node.outputs))
        for v in node.outputs:
            out += (v.id, _index(self.types, v.type))
        out.append(0 if bodies is None else len(bodies) + 1)
        for body in bodies or ():
            self.graph(body)


def _index(table: dict, entry: Any) -> int:
    return table.setdefault(entry, len(table))


# -- bytes -> graph --------------------------------------------------------------------------


def graph_from_bytes(
    data: bytes,
    constants: Mapping[str, np.ndarray],
    *,
    relocate: Callable[[SourceLocation], SourceLocation | None] | None = None,
    check: bool = False,
) -> Graph:
    """The graph of ``graph_to_bytes``' bytes with its ``constants`` (``qualified_constants``' table);
    ``relocate`` maps each stored source location to the one the graph gets (None drops it);
    ``check`` runs the verifier too. ``FormatError`` for bytes that do not read."""
    tables, ints = _split(data)
    try:
        reader = _Reader(tables, relocate)
        stream = iter(ints.tolist())
        graph = reader.graph(stream.__next__, constants)
    except FormatError:
        raise
    except StopIteration:
        raise FormatError("compact graph: truncated (the integers end inside the graph)") from None
    except (IndexError, KeyError, TypeError, ValueError, RuntimeError) as error:
        raise FormatError(f"compact graph: malformed ({type(error).__name__}: {error})") from None
    if next(stream, None) is not None:
        raise FormatError("compact graph: integers left over after the graph")
    if check:
        verify(graph)
    return graph


def _split(data: bytes) -> tuple[dict, array]:
    """The tables and the integers of compact bytes, after checking the header."""
    if len(data) < _HEADER.size:
        raise FormatError(f"compact graph: {len(data)} bytes, fewer than its header's {_HEADER.size}")
    magic, version, size = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise FormatError(f"compact graph: expected the magic {_MAGIC!r}, got {magic!r}")
    if version != COMPACT_VERSION:
        raise FormatError(f"compact graph: format version {version}; this kiln reads version {COMPACT_VERSION}")
    end = _HEADER.size + size
    rest = len(data) - end
    if rest < 0 or rest % 4:
        raise FormatError(f"compact graph: truncated ({len(data)} bytes do not hold its tables and whole integers)")
    try:
        tables = json.loads(data[_HEADER.size : end])
    except (ValueError, RecursionError) as error:
        raise FormatError(f"compact graph: its tables are not valid JSON: {error}") from None
    if not isinstance(tables, dict) or set(tables) != {"ops", "types", "locations", "attrs"}:
        raise FormatError("compact graph: expected the tables ops, types, locations and attrs")
    ints = array("I")
    ints.frombytes(data[end:])
    if _BIG_ENDIAN:
        ints.byteswap()
    return tables, ints


class _Reader:
    """The tables, decoded once with ``serialize``'s checks; then graphs read from the integers."""

    def __init__(self, tables: dict, relocate: Callable[[SourceLocation], SourceLocation | None] | None) -> None:
        if not all(isinstance(op, str) for op in tables["ops"]):
            raise FormatError("compact graph: an op name is not a string")
        self.ops: list[str] = tables["ops"]
        self.types = [_type_from_json(t, f"compact types[{i}]") for i, t in enumerate(tables["types"])]
        read = [_loc_from_json(loc, f"compact locations[{i}]") for i, loc in enumerate(tables["locations"])]
        moved = read if relocate is None else [relocate(loc) for loc in read]
        self.locations: list[SourceLocation | None] = [None, *moved]  # index 0: no location
        self.attrs = [_attrs(entry, i) for i, entry in enumerate(tables["attrs"])]

    def graph(self, next_int: Callable[[], int], constants: Mapping[str, np.ndarray]) -> Graph:
        types, ops, attr_sets, locations = self.types, self.ops, self.attrs, self.locations
        values: dict[int, Value] = {}

        def define(value_id: int, type_index: int) -> Value:
            if value_id in values:
                raise FormatError(f"compact graph: %{value_id} is defined twice")
            value = values[value_id] = Value(value_id, types[type_index])
            return value

        inputs = tuple([define(next_int(), next_int()) for _ in range(next_int())])
        nodes = []
        kernels: set[str] = set()
        by_kernel: dict[str, dict[int, dict[str, np.ndarray]]] | None = None  # made at the first kernel
        for _ in range(next_int()):
            op, attrs, loc = ops[next_int()], dict(attr_sets[next_int()]), locations[next_int()]
            node_inputs = tuple([values[next_int()] for _ in range(next_int())])
            outputs = tuple([define(next_int(), next_int()) for _ in range(next_int())])
            bodies = next_int()
            if bodies:
                name = attrs.get("name")
                if op not in NESTING_OPS or not isinstance(name, str):
                    raise FormatError(f"compact graph: bodies on a {op!r} node without a kernel's name")
                if by_kernel is None:
                    by_kernel = _by_kernel(constants)
                kernels.add(name)
                table = by_kernel.get(name, {})
                attrs["bodies"] = tuple([self.graph(next_int, table.get(i, {})) for i in range(bodies - 1)])
            nodes.append(Node(op, node_inputs, attrs, outputs, loc))
        outputs = tuple([values[next_int()] for _ in range(next_int())])
        own = {key: value for key, value in constants.items() if key.partition(QUALIFIER)[0] not in kernels}
        return Graph(inputs, tuple(nodes), outputs, own)


def _attrs(entry: Any, i: int) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise FormatError(f"compact graph: attrs[{i}]: expected an object")
    return {key: _attr_from_json(value, f"compact attrs[{i}].{key}") for key, value in entry.items()}


def _by_kernel(constants: Mapping[str, np.ndarray]) -> dict[str, dict[int, dict[str, np.ndarray]]]:
    """The qualified constants of a table (``qualified_constants``: ``kernel/body/name``) by kernel
    name and body index, in one pass over the table."""
    found: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for key, value in constants.items():
        kernel, _, rest = key.partition(QUALIFIER)
        index, _, name = rest.partition(QUALIFIER)
        if name and index.isdigit():
            found.setdefault(kernel, {}).setdefault(int(index), {})[name] = value
    return found
