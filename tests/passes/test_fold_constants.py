"""fold_constants: golden IR, same results, constants merged, and what must never be folded."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from kiln.ir.dtypes import bool_, float32, int64
from kiln.ir.graph import GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.types import TensorType
from kiln.ir.verifier import verify
from kiln.passes import FOLD_LIMIT, eliminate_dead_code, fold_constants
from tests.passes import assert_identical, check_pass, special

F3 = TensorType((3,), float32)


def f32(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_nodes_of_constants_become_constants_and_equal_constants_merge():
    b = GraphBuilder()
    x = b.input(F3)
    one = b.constant(f32(1.0, 1.0, 1.0), F3)
    two = b.constant(f32(2.0, 2.0, 2.0), F3)
    one_again = b.constant(f32(1.0, 1.0, 1.0), F3)
    s = b.node("add", [one, two])  # 3 3 3
    t = b.node("exp", [b.node("neg", [s])])  # a chain folds node by node
    u = b.node("mul", [one_again, two])
    graph = b.build([b.node("mul", [x, t]), b.node("add", [x, u]), b.node("add", [x, one_again])])
    after = check_pass(fold_constants, graph, """
        graph(%0: f32[3]) {
          %1: f32[3] = constant() {name="c0"}
          %2: f32[3] = constant() {name="c1"}
          %4: f32[3] = constant() {name="c3"}
          %5: f32[3] = constant() {name="c4"}
          %6: f32[3] = constant() {name="c5"}
          %8: f32[3] = mul(%0, %6)
          %9: f32[3] = add(%0, %2)
          %10: f32[3] = add(%0, %1)
          return (%8, %9, %10)
        }
    """, [[special((3,), shift=k)] for k in range(4)])  # fmt: skip
    assert_identical(after.constants["c3"], f32(3.0, 3.0, 3.0))
    assert_identical(after.constants["c5"], np.exp(-f32(3.0, 3.0, 3.0)))
    assert sorted(after.constants) == ["c0", "c1", "c3", "c4", "c5"]  # c2 merged into c0 and dropped


def test_signed_zeros_are_different_constants():
    b = GraphBuilder()
    x = b.input(F3)
    pos = b.constant(f32(0.0, 0.0, 0.0), F3)
    neg = b.constant(f32(-0.0, -0.0, -0.0), F3)
    nan1 = b.constant(f32(np.nan, 0.0, 0.0), F3)
    nan2 = b.constant(f32(np.nan, 0.0, 0.0), F3)  # the same bits: merged
    graph = b.build(
        [b.node("add", [x, pos]), b.node("add", [x, neg]), b.node("add", [x, nan1]), b.node("add", [x, nan2])]
    )
    after = fold_constants(graph)
    assert [n.op for n in after.nodes].count("constant") == 3
    assert after.nodes[-1].inputs[1] is nan1


def test_random_nodes_are_never_folded():
    b = GraphBuilder()
    state = b.constant(np.array([1, 2], dtype=np.int64), TensorType((2,), int64))
    bits = b.node("random_bits", [state], {"shape": (4,)})
    graph = b.build([bits])
    assert str(fold_constants(graph)) == str(graph)


def test_blow_ups_stay_symbolic_and_small_results_fold():
    b = GraphBuilder()
    c = b.constant(f32(1.0, 2.0, 3.0), F3)
    big = b.node("expand", [c], {"shape": (FOLD_LIMIT, 3)})
    small = b.node("expand", [c], {"shape": (2, 3)})
    total = b.node("reduce_sum", [big], {"axes": (0,), "keepdim": False})
    graph = b.build([total, small])
    after = check_pass(fold_constants, graph, """
        graph() {
          %0: f32[3] = constant() {name="c0"}
          %1: f32[4096,3] = expand(%0) {shape=(4096, 3)}
          %2: f32[2,3] = constant() {name="c1"}
          %3: f32[3] = reduce_sum(%1) {axes=(0,), keepdim=False}
          return (%3, %2)
        }
    """, [[]])  # fmt: skip
    folded = after.constants["c1"]
    # A folded view is an array of its own: not a broadcast of, nor sharing memory with, the input.
    assert folded.flags.owndata and folded.flags.writeable and folded.strides == (12, 4)
    assert not np.shares_memory(folded, graph.constants["c0"])


def test_large_results_of_large_inputs_fold():
    b = GraphBuilder()
    c = b.constant(np.arange(FOLD_LIMIT * 2, dtype=np.float32), TensorType((FOLD_LIMIT * 2,), float32))
    graph = b.build([b.node("neg", [c])])
    after = fold_constants(graph)
    assert [n.op for n in after.nodes] == ["constant", "constant"]
    assert_identical(after.constants["c1"], -np.arange(FOLD_LIMIT * 2, dtype=np.float32))


def test_a_failing_kernel_is_left_for_run_time():
    b = GraphBuilder()
    n = b.constant(np.array([1, 2]), TensorType((2,), int64))
    i = b.constant(np.array([2]), TensorType((1,), int64))
    graph = b.build([b.node("take", [n, i])])
    assert str(fold_constants(graph)) == str(graph)


def test_a_check_of_constants_folds_away_when_it_holds_and_stays_when_it_fails():
    b = GraphBuilder()
    x = b.input(TensorType((2,), int64))
    holds = b.constant(np.array([True, True]), TensorType((2,), bool_))
    fails = b.constant(np.array([True, False]), TensorType((2,), bool_))
    b.node("check", [holds], {"error": "IndexError", "message": "never"})
    b.node("check", [fails], {"error": "ZeroDivisionError", "message": "by zero"})
    graph = eliminate_dead_code(fold_constants(b.build([b.node("neg", [x])])))
    assert [n.op for n in graph.nodes] == ["constant", "check", "neg"]
    assert graph.nodes[1].attrs["message"] == "by zero"
    with pytest.raises(ZeroDivisionError, match="by zero"):
        interpret(graph, [np.array([1, 2])])


def test_inf_and_nan_fold_without_warnings():
    b = GraphBuilder()
    c = b.constant(f32(0.0, -1.0, np.inf), F3)
    graph = b.build([b.node("log", [c]), b.node("div", [c, c])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        after = fold_constants(graph)
    assert [n.op for n in after.nodes] == ["constant"] * 3
    assert_identical(after.constants["c1"], f32(-np.inf, np.nan, np.inf))
    assert_identical(after.constants["c2"], f32(np.nan, 1.0, np.nan))


def test_a_graph_without_constants_is_unchanged():
    b = GraphBuilder()
    x = b.input(F3)
    graph = b.build([b.node("exp", [x])])
    assert fold_constants(graph).nodes == graph.nodes


def test_a_large_fill_becomes_one_element_expanded():
    # A trace records ones_like / full as constants holding every element (GAT's -9e16 * ones_like(e)
    # over its attention scores: 92 MB, read per call and stored in the disk cache); expanded from one
    # element, the fill is an index map kernels fuse. Bit for bit: -0.0 and nan fills keep their bits.
    n = FOLD_LIMIT * 2
    vector = TensorType((n,), float32)
    b = GraphBuilder()
    x = b.input(vector)
    fills = [b.constant(np.full(n, v, np.float32), vector) for v in (-9e16, -0.0, np.nan)]
    ramp = b.constant(np.arange(n, dtype=np.float32), vector)  # not a fill: stays
    returned = b.constant(np.full(n, 2.0, np.float32), vector)  # returned: memory of its own, stays
    flags = b.constant(np.ones((2, n), bool), TensorType((2, n), bool_))
    masked = b.node(
        "where",
        [
            b.node("gt", [x, fills[1]]),
            x,
            b.node("mul", [fills[0], b.constant(np.array(2.0, np.float32), TensorType((), float32))]),
        ],
    )
    picked = b.node("where", [flags, x, x])  # a bool fill
    graph = b.build([masked, b.node("add", [x, fills[2]]), b.node("add", [x, ramp]), returned, picked])
    after = eliminate_dead_code(fold_constants(graph))
    verify(after)
    sizes = sorted(a.size for a in after.constants.values())
    assert sizes == [1, 1, 1, 1, 1, n, n], sizes  # the ramp and the returned fill stay whole
    assert [n.op for n in after.nodes].count("expand") == 4
    inputs = [special((n,))]
    for before_result, after_result in zip(interpret(graph, inputs), interpret(after, inputs), strict=True):
        assert_identical(np.ascontiguousarray(after_result), before_result)
