"""eliminate_dead_code: golden IR; unused nodes (random ones too) and constants go, inputs stay."""

from __future__ import annotations

import numpy as np

from kiln.ir.dtypes import float32, int64
from kiln.ir.graph import GraphBuilder
from kiln.ir.types import TensorType
from kiln.passes import eliminate_dead_code
from tests.passes import check_pass, special

F3 = TensorType((3,), float32)


def test_unused_nodes_go_transitively_and_inputs_stay():
    b = GraphBuilder()
    x, _unused, state = b.input(F3), b.input(F3), b.input(TensorType((2,), int64))
    dead = b.node("exp", [b.node("neg", [x])])  # a dead chain
    b.node("reduce_sum", [dead], {"axes": (0,), "keepdim": False})
    c_dead = b.constant(np.ones(3, np.float32), F3)
    b.node("mul", [x, c_dead])
    b.node("random_bits", [state], {"shape": (3,)})  # an unused draw: nothing depends on it
    c = b.constant(np.full(3, 2.0, np.float32), F3)
    live = b.node("mul", [x, c])
    graph = b.build([live, x])
    after = check_pass(eliminate_dead_code, graph, """
        graph(%0: f32[3], %1: f32[3], %2: i64[2]) {
          %9: f32[3] = constant() {name="c1"}
          %10: f32[3] = mul(%0, %9)
          return (%10, %0)
        }
    """, [[special((3,), shift=k), special((3,)), np.array([1, 2])] for k in range(3)])  # fmt: skip
    assert list(after.constants) == ["c1"]


def test_used_random_nodes_and_their_state_stay():
    b = GraphBuilder()
    state = b.input(TensorType((2,), int64))
    bits = b.node("random_bits", [state], {"shape": (3,)})
    graph = b.build([b.node("cast", [bits], {"dtype": float32})])
    assert eliminate_dead_code(graph) is graph


def test_a_graph_without_dead_code_is_returned_as_is():
    b = GraphBuilder()
    x = b.input(F3)
    c = b.constant(np.ones(3, np.float32), F3)
    graph = b.build([b.node("add", [x, c])])
    assert eliminate_dead_code(graph) is graph


def test_unreferenced_constant_table_entries_are_dropped():
    b = GraphBuilder()
    x = b.input(F3)
    graph = b.build([b.node("exp", [x])])
    graph = type(graph)(graph.inputs, graph.nodes, graph.outputs, {"stale": np.zeros(3)})
    after = eliminate_dead_code(graph)
    assert after.constants == {} and after.nodes == graph.nodes
