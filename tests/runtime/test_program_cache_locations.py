"""The traced nodes' source locations that a program cache entry keeps (``program_cache._locations``)
and how a hit maps them to the current trace's lines (``_relocation``)."""

from __future__ import annotations

import json

from kiln.compiler import program_cache
from kiln.ir.dtypes import float32
from kiln.ir.graph import LOOP, Graph, GraphBuilder, Node, SourceLocation
from kiln.ir.types import TensorType

T = TensorType((2,), float32)


def _chain(lines: list[int | None], nested: bool = False) -> Graph:
    """exp nodes at ``lines`` of m.py (None: no location); ``nested`` wraps the last in a loop node's body."""
    b = GraphBuilder()
    x = b.input(T)
    made = {}  # one object per line, as a trace makes
    for line in lines:
        loc = None if line is None else made.setdefault(line, SourceLocation("m.py", line, "f"))
        x = b.node("exp", [x], loc=loc)
    graph = b.build([x])
    if not nested:
        return graph
    body, last = graph.nodes[-1:], graph.nodes[-1]
    inner = Graph(tuple(last.inputs), tuple(body), tuple(last.outputs))
    loop = Node(LOOP, last.inputs, {"name": "l0", "bodies": (inner,)}, last.outputs, SourceLocation("m.py", 99, "f"))
    return Graph(graph.inputs, (*graph.nodes[:-1], loop), graph.outputs)


def test_rows_are_the_distinct_locations_and_each_node_names_its_row():
    rows, nodes = program_cache._locations(_chain([3, 4, None, 3, 4]))
    assert rows == [None, ["m.py", 3, "f"], ["m.py", 4, "f"]]
    assert nodes == [1, 2, 0, 1, 2]


def test_a_loop_nodes_body_follows_the_node():
    rows, nodes = program_cache._locations(_chain([3, 4], nested=True))
    assert [rows[i] for i in nodes] == [["m.py", 3, "f"], ["m.py", 99, "f"], ["m.py", 4, "f"]]


def test_a_hit_moves_each_stored_line_to_the_current_one():
    stored = json.loads(json.dumps(program_cache._locations(_chain([3, 4, 3]))))  # as an entry keeps them
    moved = program_cache._relocation(stored, program_cache._locations(_chain([5, 7, 5])))
    assert moved == {("m.py", 3, "f"): ["m.py", 5, "f"], ("m.py", 4, "f"): ["m.py", 7, "f"]}


def test_a_stored_line_that_now_stands_for_two_cannot_be_moved():
    stored = json.loads(json.dumps(program_cache._locations(_chain([3, 3, 4]))))
    assert program_cache._relocation(stored, program_cache._locations(_chain([3, 6, 4]))) is None
    assert program_cache._relocation(stored, program_cache._locations(_chain([3, 3]))) is None  # other traces
