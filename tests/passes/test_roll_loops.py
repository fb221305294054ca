"""roll_loops on hand-built graphs: what it rolls, what it leaves, and that the rolled graph computes the same.

Each rolled graph is verified, run on the interpreter against the graph it came from, printed and
parsed back, and serialized to JSON and back (the loop node's plumbing through the IR's consumers).
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.ir.dtypes import float32, float64
from kiln.ir.graph import LOOP, GraphBuilder, qualified_constants
from kiln.ir.interpreter import interpret
from kiln.ir.loops import loop_of
from kiln.ir.parser import parse_graph
from kiln.ir.printer import print_graph
from kiln.ir.serialize import graph_from_json, graph_to_json
from kiln.ir.types import TensorType
from kiln.ir.verifier import VerificationError, verify
from kiln.passes import roll_loops as roll_loops_module


def roll_loops(graph, min_trips=roll_loops_module.MIN_TRIPS, min_nodes=0):
    """The pass, also on graphs smaller than it rolls by default (``MIN_ROLLED_NODES``)."""
    return roll_loops_module.roll_loops(graph, min_trips, min_nodes)


H = TensorType((3, 4), float64)
W = TensorType((4, 4), float64)


def _rnn(steps: int, odd_step: int | None = None, outputs: str = "last"):
    """``h = tanh(h @ w + x[t])`` over ``steps`` per-step inputs; ``odd_step`` uses sigmoid instead."""
    b = GraphBuilder()
    h = b.input(H)
    w = b.input(W)
    xs = [b.input(H) for _ in range(steps)]
    one = b.constant(np.ones((), np.float64), TensorType((), float64))
    hs = []
    for t, x in enumerate(xs):
        z = b.node("add", [b.node("matmul", [h, w]), x])
        h = b.node("sigmoid" if t == odd_step else "tanh", [b.node("mul", [z, one])])
        hs.append(h)
    return b.build([h] if outputs == "last" else hs)


def _inputs(graph, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.type.shape) * 0.5 for v in graph.inputs]


def _loops(graph):
    return [node for node in graph.nodes if node.op == LOOP]


def _same_everywhere(graph, rolled):
    """The rolled graph verifies, computes what ``graph`` does, and survives text and JSON."""
    verify(rolled)
    inputs = _inputs(graph)
    for got, want in zip(interpret(rolled, inputs), interpret(graph, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    constants = qualified_constants(rolled)
    parsed = parse_graph(print_graph(rolled), constants)
    verify(parsed)
    assert print_graph(parsed) == print_graph(rolled)
    loaded = graph_from_json(graph_to_json(rolled), constants)
    for got, want in zip(interpret(loaded, inputs), interpret(graph, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_chain_of_identical_steps_is_one_loop_with_carried_invariant_and_per_step_inputs():
    graph = _rnn(8)
    rolled = roll_loops(graph)
    (node,) = _loops(rolled)
    loop = loop_of(node)
    assert (loop.trips, len(loop.carried), loop.invariant, loop.per_iteration) == (8, 1, 1, 1)
    assert loop.last and not loop.stacked  # only the final h leaves the loop
    assert sum(n.op == "constant" for n in loop.body.nodes) == 1  # the constant went into the body
    assert len(rolled.nodes) < len(graph.nodes) / 4
    _same_everywhere(graph, rolled)


def test_every_step_used_after_the_loop_is_a_per_iteration_output():
    graph = _rnn(6, outputs="all")
    rolled = roll_loops(graph)
    (node,) = _loops(rolled)
    loop = loop_of(node)
    assert len(loop.stacked) == 1 and len(node.outputs) == 6
    assert tuple(rolled.outputs) == tuple(graph.outputs)  # the outer values are kept, now the loop's
    _same_everywhere(graph, rolled)


@pytest.mark.parametrize(
    "read", [(7,), (0,), (2,), (2, 7), (0, 4, 7)], ids=["last", "first", "middle", "middle and last", "three"]
)
def test_steps_read_after_the_loop_other_than_the_last_make_it_stack_them(read):
    """A block's value read after the run from any block but the last alone is every block's output
    (``Plan.stacked``): ``_plan`` tells the last block's reads apart from the others' by set."""
    b = GraphBuilder()
    h, w = b.input(H), b.input(W)
    xs = [b.input(H) for _ in range(8)]
    hs = []
    for x in xs:
        h = b.node("tanh", [b.node("add", [b.node("matmul", [h, w]), x])])
        hs.append(h)
    graph = b.build([hs[t] for t in read])
    rolled = roll_loops(graph)
    (node,) = _loops(rolled)
    loop = loop_of(node)
    assert (len(loop.last), len(loop.stacked)) == ((1, 0) if read == (7,) else (0, 1))
    assert tuple(rolled.outputs) == tuple(graph.outputs)
    _same_everywhere(graph, rolled)


def test_fewer_steps_than_the_minimum_stay_unrolled():
    graph = _rnn(3)
    assert roll_loops(graph) is graph
    assert _loops(roll_loops(_rnn(5), min_trips=6)) == []


def test_a_step_that_differs_is_left_out_of_the_loops():
    graph = _rnn(12, odd_step=6)
    rolled = roll_loops(graph)
    loops = _loops(rolled)
    assert loops, "the six steps before the odd one roll"
    assert "sigmoid" in [n.op for n in rolled.nodes]  # the odd step stays outside every body
    assert all("sigmoid" not in [n.op for n in loop_of(node).body.nodes] for node in loops)
    _same_everywhere(graph, rolled)


def test_a_value_read_two_steps_later_still_computes_the_same():
    b = GraphBuilder()
    a, c, w = b.input(H), b.input(H), b.input(W)
    for _ in range(8):  # Fibonacci-like: each step reads the last two
        a, c = c, b.node("tanh", [b.node("add", [b.node("matmul", [a, w]), c])])
    graph = b.build([c])
    rolled = roll_loops(graph)
    assert _loops(rolled)
    _same_everywhere(graph, rolled)


def test_small_runs_stay_unrolled_by_default():
    graph = _rnn(8)  # 8 blocks of 4 nodes
    assert roll_loops_module.roll_loops(graph) is graph
    assert _loops(roll_loops_module.roll_loops(_rnn(20)))


def test_elementwise_runs_stay_unrolled_for_fusion():
    b = GraphBuilder()
    x = b.input(H)
    for _ in range(40):
        x = b.node("tanh", [b.node("add", [x, x])])
    graph = b.build([x])
    assert roll_loops(graph) is graph


def test_nothing_repeats_nothing_changes():
    b = GraphBuilder()
    x = b.input(TensorType((4,), float32))
    graph = b.build([b.node("exp", [b.node("neg", [b.node("tanh", [x])])])])
    assert roll_loops(graph) is graph


def test_the_verifier_names_a_loop_whose_carried_types_disagree():
    rolled = roll_loops(_rnn(6))
    (node,) = _loops(rolled)
    attrs = dict(node.attrs, trips=5)  # inputs and outputs no longer what 5 trips take
    broken = type(rolled)(rolled.inputs, tuple(type(node)(n.op, n.inputs, attrs, n.outputs, n.loc) if n is node
                                                else n for n in rolled.nodes), rolled.outputs, rolled.constants)  # fmt: skip
    with pytest.raises(VerificationError, match="loop"):
        verify(broken)


def test_a_step_that_slices_its_input_inside_the_step_still_rolls():
    """``xs[t]`` names its step in its attributes: the views of inputs move in front of the loop."""
    b = GraphBuilder()
    h, w = b.input(H), b.input(W)
    xs = b.input(TensorType((8, 3, 4), float64))
    for t in range(8):
        x = b.node("reshape", [b.node("slice", [xs], {"starts": (t, 0, 0), "stops": (t + 1, 3, 4), "steps": (1, 1, 1)})],
                   {"shape": (3, 4)})  # fmt: skip
        h = b.node("tanh", [b.node("add", [b.node("matmul", [h, w]), x])])
    graph = b.build([h])
    rolled = roll_loops(graph)
    (node,) = _loops(rolled)
    assert loop_of(node).per_iteration == 1 and "slice" not in [n.op for n in loop_of(node).body.nodes]
    _same_everywhere(graph, rolled)


def test_the_same_view_of_an_input_at_every_step_is_one_invariant():
    """The tracer records a weight's transpose anew at each step; in front of the loop, the copies are
    one value (the loop reads it as an invariant, not as a per-iteration input of N equal values)."""
    b = GraphBuilder()
    h, w = b.input(H), b.input(W)
    xs = [b.input(H) for _ in range(8)]
    for x in xs:
        h = b.node("tanh", [b.node("add", [b.node("matmul", [h, b.node("permute", [w], {"perm": (1, 0)})]), x])])
    graph = b.build([h])
    rolled = roll_loops(graph)
    (node,) = _loops(rolled)
    loop = loop_of(node)
    assert (loop.invariant, loop.per_iteration) == (1, 1)
    assert [n.op for n in rolled.nodes].count("permute") == 1
    _same_everywhere(graph, rolled)


def test_the_graph_passes_run_over_a_rolled_graph():
    """The driver rolls first, then folds, simplifies, merges and drops over the rolled graph: a loop
    node is never folded nor merged, and is kept, though nothing reads it, when its body checks."""
    from kiln.passes import DEFAULT_PIPELINE, run_pipeline

    b = GraphBuilder()
    h, w = b.input(H), b.input(W)
    xs = [b.input(H) for _ in range(8)]
    limit = b.constant(np.full((), 10.0), TensorType((), float64))
    for x in xs:
        h = b.node("tanh", [b.node("add", [b.node("matmul", [h, w]), x])])
        ok = b.node("lt", [b.node("reduce_sum", [h], {"axes": (0, 1), "keepdim": False}), limit])
        b.node("check", [ok], {"error": "ValueError", "message": "too large"})
    graph = b.build([h])
    rolled = roll_loops(graph)
    (node,) = _loops(rolled)
    assert "check" in [n.op for n in loop_of(node).body.nodes]
    passed = run_pipeline(rolled, DEFAULT_PIPELINE, verify=True)
    assert len(_loops(passed)) == 1
    _same_everywhere(graph, passed)
    # the same loop, its outputs unread: the checks still run, so the loop stays
    unread = b.build([w])
    unread_rolled = roll_loops(unread)
    assert len(_loops(run_pipeline(unread_rolled, DEFAULT_PIPELINE, verify=True))) == 1


@pytest.mark.parametrize("odd", [1, 1.0, True])
def test_steps_that_differ_only_in_an_attribute_value_are_not_one_computation(odd):
    """A step whose attribute is another value, or the same number of another type (0 and 1.0 and
    True are not 0), is left out of the loop, which computes what the steps computed."""
    b = GraphBuilder()
    h, w = b.input(H), b.input(W)
    xs = [b.input(H) for _ in range(12)]
    for t, x in enumerate(xs):
        padded = b.node("pad", [b.node("matmul", [h, w])], {"low": (0, 1), "high": (0, 0), "interior": (0, 0),
                                                             "value": odd if t == 6 else 0})  # fmt: skip
        h = b.node(
            "tanh",
            [b.node("add", [b.node("slice", [padded], {"starts": (0, 0), "stops": (3, 4), "steps": (1, 1)}), x])],
        )
    graph = b.build([h])
    rolled = roll_loops(graph)
    assert all(loop_of(node).trips < 12 for node in _loops(rolled))
    _same_everywhere(graph, rolled)
