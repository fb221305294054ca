"""Compiled programs in the on-disk cache: the key, the entry, and the source locations of a hit.

The compile driver consults the cache (``kiln.runtime.cache``, a plain key -> bytes store) before
it runs the passes. The key holds the traced graph's canonical text without source locations and
its constants, the input layouts, the compile options, the backend and what decides its code
(LLVM, CPU name and features), kiln's version and a digest of the compiler's own source. An entry
holds the fused graph (``kiln.ir.compact``'s bytes: a warm start reads it several times faster than
JSON), its constants, the backend's code and the kernels it declined, so a hit skips the passes,
fusion and code generation. One that does not load is rebuilt. A dynamic specialization's program
is stored in the same format, with its layouts table beside it (``frontend/jit/symbolic_cache.py``).

Source locations stay out of the key (a comment added above a compiled function must not
recompile it), yet a program's nodes must name the lines of *this* trace, which errors and
``explain`` show. So an entry also keeps the location of every traced node it was compiled from;
on a hit, each location of the stored graph is replaced by the current trace's location of the
same traced node. Passes only copy locations from the nodes they rewrite, so the map is exact;
when one stored location now stands for several lines (a statement split in two), the entry
cannot say which, and it is rebuilt.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from operator import attrgetter

import numpy as np
import safetensors.numpy

from ..ir.compact import graph_from_bytes, graph_to_bytes
from ..ir.graph import NESTING_OPS, Graph, SourceLocation, nested_bodies, qualified_constants
from ..ir.printer import print_graph
from ..runtime.cache import cache_key, default_cache, source_digest

#: Bump when the layout of a cache entry changes (5: the graph in ``kiln.ir.compact``'s bytes, not JSON;
#: 6: the traced nodes' locations as a table of rows and a row per node).
ENTRY_FORMAT = 6


#: The process's cache (``kiln.runtime.cache.default_cache``, shared with the LLVM backend's kernels).
disk_cache = default_cache


def program_key(traced: Graph, backend_text: str, options: str, input_strides) -> str:
    return cache_key("kiln program", str(ENTRY_FORMAT), source_digest("ir", "passes", "codegen", "runtime", "compiler"), backend_text, options,
                     repr([tuple(s) if s is not None else None for s in input_strides]),
                     print_graph(traced, locations=False), *_constant_parts(traced))  # fmt: skip


def _constant_parts(graph: Graph) -> list[bytes]:
    parts = []
    for name, array in sorted(graph.constants.items()):
        parts.append(f"{name} {array.dtype.str} {array.shape}".encode())
        parts.append(np.ascontiguousarray(array).tobytes())
    return parts


def to_entry(graph: Graph, code: bytes, kernels: int, declined: list, traced: Graph,
             not_fused: Sequence[str] = (), more: dict[str, str] | None = None) -> bytes:  # fmt: skip
    """An entry: the fused ``graph`` with its constants, the backend's ``code``, how many kernels
    it compiled and which it declined, the locations of the ``traced`` graph it came from and the
    merges fusion declined (``not_fused``, worded); ``more``: text fields of the caller's own
    (``entry_text`` reads them), as a dynamic program's layouts (``frontend/jit/symbolic_cache.py``)."""
    meta = {
        **(more or {}),
        "kernels": str(kernels),
        "declined": json.dumps(declined),
        "not_fused": json.dumps(list(not_fused)),
        "locations": json.dumps(_locations(traced)),
    }
    return pack_graph(graph, meta, {"code": np.frombuffer(code, np.uint8)})


def from_entry(payload: bytes, traced: Graph) -> tuple[Graph, bytes, int, list[tuple[str, str]], list[str]]:
    """``(fused graph, the backend's code, kernels compiled, kernels declined, merges not fused)`` of
    an entry, its locations those of ``traced``; raises when the entry cannot be used."""
    meta = _metadata(payload)
    moved = _relocation(json.loads(meta["locations"]), _locations(traced))
    if moved is None:
        raise ValueError("the source lines moved in a way the stored program cannot follow")
    # kiln wrote and signed it: read with the format's checks, not verified again (nor was it on a miss)
    graph, _, tensors = unpack_graph(payload, _relocator(moved))
    declined = [(name, why) for name, why in json.loads(meta["declined"])]
    return graph, tensors["code"].tobytes(), int(meta["kernels"]), declined, list(json.loads(meta["not_fused"]))


def entry_text(payload: bytes, name: str) -> str:
    """The text field ``name`` of an entry (``to_entry``'s ``more``); KeyError when it has none."""
    return _metadata(payload)[name]


def pack_graph(graph: Graph, meta: dict[str, str], tensors: dict[str, np.ndarray] | None = None) -> bytes:
    """``graph`` (``kiln.ir.compact``'s bytes, its source locations kept) with its constants, the text
    fields ``meta`` and other named ``tensors``, in safetensors' format: what a cache entry holds,
    and what a background compile sends to the program worker (``program_worker``)."""
    constants = qualified_constants(graph)
    packed = {f"constant/{k}": np.ascontiguousarray(v) for k, v in constants.items()}
    packed.update(tensors or {})
    packed["graph"] = np.frombuffer(graph_to_bytes(graph), np.uint8)
    shapes = json.dumps({k: list(v.shape) for k, v in constants.items()})  # safetensors loads 0-d as (1,)
    return safetensors.numpy.save(packed, metadata={**meta, "shapes": shapes})


def unpack_graph(payload: bytes, relocate=None) -> tuple[Graph, dict[str, str], dict[str, np.ndarray]]:
    """``(graph, meta, tensors)`` of ``pack_graph``'s bytes; raises when they cannot be read."""
    meta = _metadata(payload)
    tensors = safetensors.numpy.load(payload)
    shapes = json.loads(meta["shapes"])
    constants = {k: tensors[f"constant/{k}"].reshape(shape) for k, shape in shapes.items()}
    return graph_from_bytes(tensors["graph"].tobytes(), constants, relocate=relocate), meta, tensors


def _metadata(payload: bytes) -> dict[str, str]:
    (size,) = struct.unpack("<Q", payload[:8])
    return json.loads(payload[8 : 8 + size])["__metadata__"]


# ----------------------------------------------------------------------------- source locations
def _locations(graph: Graph) -> tuple[list, list[int]]:
    """``(rows, indices)``: the distinct source locations of ``graph``'s nodes as ``[file, line,
    function]`` rows after a first row None, and each node's row (0: none), bodies included, in order.

    A trace's locations are few objects (``jit.locations.user_location``'s), so rows are found by identity in
    C-level loops: a list per node, written and read as JSON, took ~35 ms of a 49k-node trace."""
    found = _node_locations(graph)
    keys = list(map(id, found))
    distinct = {key: loc for key, loc in dict(zip(keys, found)).items() if loc is not None}  # (a few dozen)
    row_of = {key: row for row, key in enumerate(distinct, 1)}
    row_of[id(None)] = 0
    rows = [None, *([loc.filename, loc.line, loc.function] for loc in distinct.values())]
    return rows, list(map(row_of.__getitem__, keys))


def _node_locations(graph: Graph) -> list[SourceLocation | None]:
    if NESTING_OPS.isdisjoint(map(_OP, graph.nodes)):
        return list(map(_LOC, graph.nodes))
    found: list = []
    for node in graph.nodes:
        found.append(node.loc)
        for body in nested_bodies(node):
            found += _node_locations(body)
    return found


_OP, _LOC = attrgetter("op"), attrgetter("loc")


def _relocation(stored: tuple[list, list[int]], current: tuple[list, list[int]]) -> dict | None:
    """Stored location -> the current trace's location of the same node (``_locations``' rows); None
    when a stored location now stands for two different ones (or the traces differ, which the key
    excludes)."""
    (stored_rows, stored_nodes), (current_rows, current_nodes) = stored, current
    if len(stored_nodes) != len(current_nodes):
        return None
    moved: dict = {}
    for old, new in set(zip(stored_nodes, current_nodes)):  # (the distinct pairs: a few dozen)
        if old and moved.setdefault(tuple(stored_rows[old]), current_rows[new]) != current_rows[new]:
            return None
    return moved


def _relocator(moved: dict):
    """The stored location -> the one the loaded graph gets; a location no traced node had is
    dropped rather than guessed."""

    def relocate(loc: SourceLocation) -> SourceLocation | None:
        new = moved.get((loc.filename, loc.line, loc.function))
        return None if new is None else SourceLocation(*new)

    return relocate
