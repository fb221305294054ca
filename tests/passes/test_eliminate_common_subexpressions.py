"""eliminate_common_subexpressions: golden IR; what must and must not be merged."""

from __future__ import annotations

import numpy as np

from kiln.ir.dtypes import float32, int64
from kiln.ir.graph import GraphBuilder
from kiln.ir.types import TensorType
from kiln.passes import eliminate_common_subexpressions
from tests.passes import check_pass, special

F23 = TensorType((2, 3), float32)


def test_repeated_expressions_are_computed_once():
    b = GraphBuilder()
    x, y = b.input(F23), b.input(F23)
    e1 = b.node("exp", [b.node("add", [x, y])])
    e2 = b.node("exp", [b.node("add", [x, y])])  # the whole chain repeats
    swapped = b.node("add", [y, x])  # not merged: the order of operands is kept as written
    s0 = b.node("reduce_sum", [e1], {"axes": (0,), "keepdim": False})
    s1 = b.node("reduce_sum", [e2], {"axes": (1,), "keepdim": False})  # other attributes
    s0k = b.node("reduce_sum", [e2], {"keepdim": True, "axes": (0,)})
    s0b = b.node("reduce_sum", [e2], {"keepdim": False, "axes": (0,)})  # attribute order does not matter
    graph = b.build([b.node("mul", [e1, e2]), swapped, s0, s1, s0k, s0b])
    check_pass(eliminate_common_subexpressions, graph, """
        graph(%0: f32[2,3], %1: f32[2,3]) {
          %2: f32[2,3] = add(%0, %1)
          %3: f32[2,3] = exp(%2)
          %6: f32[2,3] = add(%1, %0)
          %7: f32[3] = reduce_sum(%3) {axes=(0,), keepdim=False}
          %8: f32[2] = reduce_sum(%3) {axes=(1,), keepdim=False}
          %9: f32[1,3] = reduce_sum(%3) {keepdim=True, axes=(0,)}
          %11: f32[2,3] = mul(%3, %3)
          return (%11, %6, %7, %8, %9, %7)
        }
    """, [[special((2, 3), shift=k), special((2, 3), shift=k + 5)] for k in range(3)])  # fmt: skip


def test_float_attributes_compare_exactly():
    b = GraphBuilder()
    x = b.input(TensorType((2,), float32))
    pads = [b.node("pad", [x], {"low": (1,), "high": (0,), "interior": (0,), "value": v})
            for v in (0.0, -0.0, np.nan, float("nan"), 0.0)]  # fmt: skip
    graph = b.build(pads)
    after = eliminate_common_subexpressions(graph)
    # 0.0 and -0.0 are different pads; two nans are the same pad.
    assert [p.id for p in after.outputs] == [1, 2, 3, 3, 1]


def test_random_nodes_are_never_merged():
    b = GraphBuilder()
    state = b.input(TensorType((2,), int64))
    r1 = b.node("random_bits", [state], {"shape": (3,)})
    r2 = b.node("random_bits", [state], {"shape": (3,)})
    graph = b.build([b.node("add", [r1, r2])])
    assert eliminate_common_subexpressions(graph) is graph


def test_identical_constants_merge_and_their_uses_follow():
    b = GraphBuilder()
    x = b.input(TensorType((3,), float32))
    c1 = b.constant(np.array([1.0, 2.0, np.nan], np.float32), TensorType((3,), float32))
    c2 = b.constant(np.array([1.0, 2.0, np.nan], np.float32), TensorType((3,), float32))
    c3 = b.constant(np.array([[1.0, 2.0, np.nan]], np.float32), TensorType((1, 3), float32))  # another shape
    m1, m2 = b.node("mul", [x, c1]), b.node("mul", [x, c2])
    graph = b.build([m1, m2, c3])
    check_pass(eliminate_common_subexpressions, graph, """
        graph(%0: f32[3]) {
          %1: f32[3] = constant() {name="c0"}
          %3: f32[1,3] = constant() {name="c2"}
          %4: f32[3] = mul(%0, %1)
          return (%4, %4, %3)
        }
    """, [[special((3,), shift=k)] for k in range(4)])  # fmt: skip


def test_nothing_to_merge_returns_the_same_graph():
    b = GraphBuilder()
    x = b.input(F23)
    graph = b.build([b.node("exp", [x]), b.node("neg", [x])])
    assert eliminate_common_subexpressions(graph) is graph
