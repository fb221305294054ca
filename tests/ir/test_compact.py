"""Compact graph bytes (the compile cache's graphs): exact round trips, and bytes that do not read
raise FormatError -- never another exception, never a graph built from a truncated or garbled run."""

from __future__ import annotations

import json
import struct
from array import array

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from kiln.ir.compact import COMPACT_VERSION, graph_from_bytes, graph_to_bytes
from kiln.ir.dtypes import float32
from kiln.ir.graph import GraphBuilder, SourceLocation, qualified_constants
from kiln.ir.printer import print_graph
from kiln.ir.serialize import FormatError
from kiln.ir.types import Sym, TensorType
from kiln.ir.verifier import VerificationError
from tests.ir.test_printer_parser import assert_same_graph, kernel_graph, random_graphs
from tests.ir.test_serialize import sample_graph

_HEADER = struct.Struct("<8sII")


def _parts(data: bytes) -> tuple[bytes, dict, list[int]]:
    """The header, the tables and the integers of compact bytes (the test's own reading of the layout)."""
    _, _, size = _HEADER.unpack_from(data)
    ints = array("I")
    ints.frombytes(data[_HEADER.size + size :])
    return data[: _HEADER.size], json.loads(data[_HEADER.size : _HEADER.size + size]), ints.tolist()


def _join(header: bytes, tables: dict, ints: list[int]) -> bytes:
    text = json.dumps(tables).encode()
    magic, version, _ = _HEADER.unpack(header)
    return _HEADER.pack(magic, version, len(text)) + text + array("I", ints).tobytes()


def test_round_trip_is_exact():
    graph = sample_graph()  # nan/inf attributes, a dtype attribute, a cuda input, locations, constants
    back = graph_from_bytes(graph_to_bytes(graph), graph.constants, check=True)
    assert_same_graph(graph, back)
    assert str(back) == str(graph)
    assert back.constants.keys() == graph.constants.keys()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graphs_round_trip(graph):
    assert_same_graph(graph, graph_from_bytes(graph_to_bytes(graph), graph.constants, check=True))


def test_kernel_bodies_round_trip_with_their_constants_and_attribute_order():
    graph = kernel_graph()
    back = graph_from_bytes(graph_to_bytes(graph), qualified_constants(graph), check=True)
    assert print_graph(back, locations=True) == print_graph(graph, locations=True)
    for x, y in zip(graph.nodes, back.nodes, strict=True):
        assert list(x.attrs) == list(y.attrs)
        for a, b in zip(x.bodies, y.bodies, strict=True):
            assert_same_graph(a, b)
    assert back.constants == {}
    assert float(back.nodes[0].bodies[0].constants["c0"]) == 2.0
    assert float(back.nodes[2].bodies[1].constants["c0"]) == 0.5


def test_symbolic_dimensions_and_shared_types():
    b = GraphBuilder()
    x = b.input(TensorType((Sym("B"), 3), float32))
    y = b.node("exp", [x], loc=SourceLocation("m.py", 3, "f"))
    graph = b.build([b.node("neg", [y], loc=SourceLocation("m.py", 3, "f"))])
    data = graph_to_bytes(graph)
    _, tables, _ = _parts(data)
    assert tables["types"] == [{"shape": ["B", 3], "dtype": "f32", "device": "cpu"}]  # one entry for 3 values
    assert len(tables["locations"]) == 1
    assert_same_graph(graph, graph_from_bytes(data, {}, check=True))


def test_relocate_maps_every_location():
    graph = sample_graph()
    moved = graph_from_bytes(
        graph_to_bytes(graph),
        graph.constants,
        relocate=lambda loc: None if loc.line == 8 else SourceLocation("new.py", loc.line + 100, loc.function),
    )
    before = [node.loc for node in graph.nodes]
    after = [node.loc for node in moved.nodes]
    for old, new in zip(before, after, strict=True):
        if old is None or old.line == 8:
            assert new is None
        else:
            assert new == SourceLocation("new.py", old.line + 100, old.function)


def test_every_truncation_raises_format_error():
    data = graph_to_bytes(kernel_graph())
    constants = qualified_constants(kernel_graph())
    for end in range(len(data)):
        with pytest.raises(FormatError):
            graph_from_bytes(data[:end], constants)


def test_header_errors_name_the_problem():
    data = graph_to_bytes(sample_graph())
    with pytest.raises(FormatError, match="magic"):
        graph_from_bytes(b"NOTAGRPH" + data[8:], {})
    newer = _HEADER.pack(b"KILNGRB\0", COMPACT_VERSION + 1, 0)
    with pytest.raises(FormatError, match=f"format version {COMPACT_VERSION + 1}"):
        graph_from_bytes(newer + data[_HEADER.size :], {})
    with pytest.raises(FormatError, match="left over"):
        graph_from_bytes(data + array("I", [0]).tobytes(), {})
    header, tables, ints = _parts(data)
    with pytest.raises(FormatError, match="tables"):
        graph_from_bytes(_join(header, {**tables, "extra": []}, ints), {})
    bad = {**tables, "types": [{"shape": [-1], "dtype": "f32", "device": "cpu"}, *tables["types"][1:]]}
    with pytest.raises(FormatError, match="compact types\\[0\\].shape\\[0\\]"):
        graph_from_bytes(_join(header, bad, ints), {})


def test_bad_indices_and_values_raise_format_error():
    graph = sample_graph()
    header, tables, ints = _parts(graph_to_bytes(graph))
    # ints: n_inputs=2, (id, type) x2, n_nodes, then the first node: op attrs loc n_in ...
    first_node = 1 + 2 * 2 + 1
    cases = {
        "an op index past the table": (first_node, 10**6),
        "an attribute set past the table": (first_node + 1, 10**6),
        "a location past the table": (first_node + 2, 10**6),
        "a type past the table": (2, 10**6),
        "an input defined twice": (3, ints[1]),
    }
    for what, (at, value) in cases.items():
        bad = list(ints)
        bad[at] = value
        with pytest.raises(FormatError):
            graph_from_bytes(_join(header, tables, bad), graph.constants)
        assert what
    # a node reading a value not defined before it: the add (node 1) reads the constant's output
    add = graph.nodes[1]
    position = _node_position(ints, 1)
    bad = list(ints)
    assert bad[position + 4] == add.inputs[0].id
    bad[position + 4] = 10**6
    with pytest.raises(FormatError, match="KeyError"):
        graph_from_bytes(_join(header, tables, bad), graph.constants)


def _node_position(ints: list[int], index: int) -> int:
    """Where node ``index`` of a graph without kernel bodies starts in its integers."""
    at = 1 + 2 * ints[0] + 1
    for _ in range(index):
        n_in = ints[at + 3]
        n_out = ints[at + 4 + n_in]
        at += 4 + n_in + 1 + 2 * n_out + 1
    return at


def test_garbled_bytes_raise_format_error_or_read_a_graph_the_verifier_judges():
    """Flipped bytes either fail to read (FormatError) or read as some graph: the compile cache signs
    its entries (HMAC) so such bytes never get here; the format alone cannot tell every change."""
    graph = kernel_graph()
    data = graph_to_bytes(graph)
    constants = qualified_constants(graph)
    rng = np.random.default_rng(0)
    for _ in range(300):
        garbled = bytearray(data)
        for i in rng.integers(0, len(data), size=3):
            garbled[i] ^= int(rng.integers(1, 256))
        try:
            graph_from_bytes(bytes(garbled), constants, check=True)
        except (FormatError, VerificationError):
            pass
