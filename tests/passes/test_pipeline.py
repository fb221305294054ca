"""run_pipeline: recording, verification after each pass, and a property test: random graphs
compute bit for bit the same before and after the default pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln.ir.dtypes import bool_, float32, float64, int64
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.types import TensorType
from kiln.passes import (
    DEFAULT_PIPELINE,
    PassError,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
    run_pipeline,
    simplify,
)
from tests.passes import SPECIAL, assert_same_results, special

F3 = TensorType((3,), float32)


def test_the_default_pipeline():
    assert DEFAULT_PIPELINE == (fold_constants, simplify, eliminate_common_subexpressions, eliminate_dead_code)


def test_record_shows_the_graph_after_each_pass():
    b = GraphBuilder()
    x = b.input(F3)
    one = b.constant(np.ones(3, np.float32), F3)
    two = b.node("add", [one, one])
    y = b.node("mul", [b.node("mul", [x, one]), two])
    graph = b.build([b.node("add", [y, b.node("mul", [x, two])])])
    record: list = []
    after = run_pipeline(graph, verify=True, record=record)
    assert [name for name, _ in record] == [p.__name__ for p in DEFAULT_PIPELINE]
    assert record[-1][1] is after
    assert str(record[0][1]).count("constant()") == 2  # 1 + 1 folded into a second constant
    assert "mul(%0, %1)" not in str(record[1][1])  # x * 1 simplified
    assert str(after) == (
        "graph(%0: f32[3]) {\n"
        '  %2: f32[3] = constant() {name="c1"}\n'
        "  %4: f32[3] = mul(%0, %2)\n"
        "  %6: f32[3] = add(%4, %4)\n"
        "  return (%6)\n"
        "}\n"
    )
    assert_same_results(graph, after, [special((3,))])


def test_verify_names_the_pass_that_broke_the_graph():
    def break_types(graph: Graph) -> Graph:
        node = graph.nodes[0]
        wrong = Node(node.op, node.inputs, node.attrs, (type(node.output)(node.output.id, TensorType((4,), float32)),))
        return Graph(graph.inputs, (wrong,), wrong.outputs, {})

    b = GraphBuilder()
    x = b.input(F3)
    graph = b.build([b.node("exp", [x])])
    with pytest.raises(PassError, match=r"after pass break_types does not verify: .*f32\[4\]"):
        run_pipeline(graph, (simplify, break_types), verify=True)
    assert run_pipeline(graph, (break_types,)).outputs[0].type.shape == (4,)  # not verified: not checked


def test_an_empty_pipeline_returns_the_graph():
    b = GraphBuilder()
    graph = b.build([b.input(F3)])
    assert run_pipeline(graph, ()) is graph


# ----------------------------------------------------------------------------- property test
# Every shape here broadcasts with every other, so any two values can meet in a binary op.
SHAPES = [(), (1,), (3,), (1, 3), (2, 1), (2, 3)]
UNARY = ["neg", "exp", "abs", "sin", "tanh", "floor", "sqrt", "log1p", "sigmoid"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"]
CONSTANTS = [1.0, -0.0, 0.0, 2.0, np.nan, np.inf]
# Constants come most often: they are what folding and simplification work on.
KINDS = ["unary", "binary", "constant", "constant", "constant", "reduce", "movement", "cast", "repeat", "where"]
# Identities and near-misses (x + 0.0 is not x for x = -0.0; x * 0 is not 0 for inf...).
NEAR_IDENTITIES = [("mul", 1.0), ("div", 1.0), ("add", -0.0), ("add", 0.0), ("sub", 0.0), ("sub", -0.0),
                   ("mul", 0.0), ("mul", -1.0), ("pow", 1.0), ("maximum", -np.inf), ("div", -1.0)]  # fmt: skip


@st.composite
def random_graphs(draw):
    """Chains of elementwise ops, single-axis reductions, movement round trips, casts, constants
    (many of them identity elements), repeated subexpressions and dead nodes."""
    dtype = draw(st.sampled_from([float32, float64]))
    b = GraphBuilder()
    pool = [
        b.input(TensorType(shape, dtype)) for shape in draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3))
    ]
    conditions = []

    def add(value):  # keep the pool to values that meet any other in a binary op
        if value.type.dtype is dtype and value.type.shape in SHAPES:
            pool.append(value)

    for _ in range(draw(st.integers(1, 14))):
        x, y = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
        kind = draw(st.sampled_from(KINDS))
        if kind == "unary":
            add(b.node(draw(st.sampled_from(UNARY)), [x]))
        elif kind == "binary":
            add(b.node(draw(st.sampled_from(BINARY)), [x, y]))
        elif kind == "constant":
            if draw(st.booleans()):
                op, value = draw(st.sampled_from(NEAR_IDENTITIES))
            else:
                op, value = draw(st.sampled_from(BINARY)), draw(st.sampled_from(CONSTANTS))
            shape = draw(st.sampled_from(SHAPES))
            c = b.constant(np.full(shape, value, dtype=dtype.np), TensorType(shape, dtype))
            y = b.node(op, [x, c] if draw(st.booleans()) else [c, x])
            add(y)
            one = b.constant(np.ones((), dtype=dtype.np), TensorType((), dtype))
            add(b.node("div", [one, y]))  # 1 / y tells -0.0 from 0.0
        elif kind == "reduce" and x.type.ndim > 0:
            op = draw(st.sampled_from(["reduce_sum", "reduce_max", "reduce_min"]))
            add(b.node(op, [x], {"axes": (draw(st.integers(0, x.type.ndim - 1)),), "keepdim": True}))
        elif kind == "movement":
            add(_movement(draw, b, x))
        elif kind == "cast":
            other = float64 if dtype is float32 else float32
            add(b.node("cast", [b.node("cast", [x], {"dtype": draw(st.sampled_from([other, dtype]))})],
                       {"dtype": dtype}))  # fmt: skip
        elif kind == "repeat" and any(n.op != "constant" for n in b.nodes):
            node = draw(st.sampled_from([n for n in b.nodes if n.op != "constant"]))
            add(b.node(node.op, node.inputs, node.attrs))
        elif kind == "where":
            conditions.append(b.node("gt", [x, y]))
            cond = draw(st.sampled_from(conditions))
            add(b.node("where", [cond, y, draw(st.sampled_from([x, y]))]))
    # The newest values are outputs (so rewrites near the end are observed); a few earlier ones
    # too; the rest is dead code.
    outputs = pool[-draw(st.integers(1, 3)) :] + draw(st.lists(st.sampled_from(pool), max_size=2))
    return b.build(outputs)


def _movement(draw, b: GraphBuilder, x):
    shape = x.type.shape
    choice = draw(st.sampled_from(["reshape", "permute", "expand", "slice", "neg"]))
    if choice == "reshape":  # through a flat shape and back, or to the same shape
        flat = b.node("reshape", [x], {"shape": (x.type.numel,)}) if draw(st.booleans()) else x
        return b.node("reshape", [flat], {"shape": shape})
    if choice == "permute" and x.type.ndim == 2:
        once = b.node("permute", [x], {"perm": (1, 0)})
        return b.node("permute", [once], {"perm": (1, 0)}) if draw(st.booleans()) else b.node("exp", [once])
    if choice == "expand":
        return b.node("expand", [x], {"shape": draw(st.sampled_from([shape, (2, 3)])) if x.type.ndim <= 2 else shape})
    if choice == "slice":
        return b.node("slice", [x], {"starts": (0,) * len(shape), "stops": shape, "steps": (1,) * len(shape)})
    return b.node("neg", [b.node("neg", [x])])


def _inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    values = np.array(SPECIAL + [0.25, -7.0, 3.0, -0.0, -0.0, -0.0])  # signed zeros are where rules go wrong
    return [rng.choice(values, size=v.type.shape).astype(v.type.dtype.np) for v in graph.inputs]


def _ops(graph: Graph) -> int:
    return sum(node.op != "constant" for node in graph.nodes)


@given(random_graphs(), st.integers(0, 2**16))
def test_the_pipeline_never_changes_a_result(graph, seed):
    after = run_pipeline(graph, verify=True)
    # no more work: a rule may emit a constant (a sum over one element is ``x + 0.0``), not an op
    assert _ops(after) <= _ops(graph)
    for k in range(3):
        assert_same_results(graph, after, _inputs(graph, seed + k))


@given(random_graphs())
def test_the_pipeline_reaches_its_fixed_point_quickly(graph):
    # Once through removes what it can see; a second run may only find what the first exposed,
    # and never breaks anything.
    once = run_pipeline(graph)
    twice = run_pipeline(once, verify=True)
    assert len(twice.nodes) <= len(once.nodes)
    assert_same_results(graph, twice, _inputs(graph, 0))


def test_random_draws_survive_the_pipeline():
    b = GraphBuilder()
    state = b.input(TensorType((2,), int64))
    const_state = b.constant(np.array([3, 4]), TensorType((2,), int64))
    r1 = b.node("random_bits", [state], {"shape": (4,)})
    r2 = b.node("random_bits", [state], {"shape": (4,)})
    r3 = b.node("random_bits", [const_state], {"shape": (4,)})
    b.node("random_bits", [state], {"shape": (8,)})  # unused: dropped
    graph = b.build([b.node("add", [r1, r2]), r3, b.node("gt", [r1, r2])])
    after = run_pipeline(graph, verify=True)
    assert [n.op for n in after.nodes].count("random_bits") == 3
    assert_same_results(graph, after, [np.array([5, 6])])
    assert bool_ is after.outputs[2].type.dtype
