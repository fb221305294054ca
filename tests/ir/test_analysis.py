"""kiln.ir.analysis against hand-computed answers: liveness and dead-after lists, aliasing through
chains of views, same-element reads, and kernel legality -- the last checked on both sides that
use it: what fusion forms (``fuse``) and what the verifier accepts (``verify``) must agree, and the
compiled kernels of what they accept match eager."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.analysis import Liveness, constant_views, kernel_legality, pointwise_inputs, reads_at_own_index
from kiln.ir.dtypes import float32
from kiln.ir.graph import KERNEL, Graph, GraphBuilder
from kiln.ir.types import TensorType
from kiln.ir.verifier import VerificationError, verify
from kiln.passes.fusion import fuse


def t(*shape: int) -> TensorType:
    return TensorType(shape, float32)


def ids(values) -> list[int]:
    return [v.id for v in values]


# ----------------------------------------------------------------------------- liveness
def _views_and_kernel() -> tuple[Graph, dict]:
    """%0 input, %1 unread input, %2 = permute %0, %3 = constant, %4 = reshape %2,
    %5 = kernel(%4, %3), %6 = exp %5, %7 = constant nothing reads; returns (%6, %2)."""
    b = GraphBuilder()
    x = b.input(t(2, 3))
    unused = b.input(t(5))
    p = b.node("permute", [x], {"perm": (1, 0)})  # node 0
    c = b.constant(np.array(2.0, np.float32), t())  # node 1
    r = b.node("reshape", [p], {"shape": (6,)})  # node 2
    inner = GraphBuilder()
    a, s = inner.input(t(6)), inner.input(t())
    (k,) = b.kernel([r, c], [inner.build([inner.node("mul", [a, s])])], "elementwise")  # node 3
    e = b.node("exp", [k])  # node 4
    dead = b.constant(np.zeros(3, np.float32), t(3))  # node 5
    return b.build([e, p]), {"x": x, "unused": unused, "p": p, "c": c, "r": r, "k": k, "e": e, "dead": dead}


def test_liveness_roots_lifetimes_and_escapes_by_hand():
    graph, v = _views_and_kernel()
    live = Liveness(graph)
    assert live.root[v["p"]] is v["x"] and live.root[v["r"]] is v["x"]  # views share their base's storage
    assert live.root[v["k"]] is v["k"] and live.root[v["e"]] is v["e"]  # kernels and externs own theirs
    assert list(live.roots()) == [v["x"], v["unused"], v["c"], v["k"], v["e"], v["dead"]]
    # x is in use until the kernel reads its view r (node 3); the kernel's output until exp reads it.
    assert (live.start[v["x"]], live.end[v["x"]]) == (-1, 3)
    assert (live.start[v["unused"]], live.end[v["unused"]]) == (-1, -1)
    assert (live.start[v["c"]], live.end[v["c"]]) == (1, 3)
    assert (live.start[v["k"]], live.end[v["k"]]) == (3, 4)
    assert (live.start[v["dead"]], live.end[v["dead"]]) == (5, 5)
    assert live.escaped == {v["e"], v["x"]}  # an output (p) that is a view of x lets x escape


def test_dead_after_lists_by_hand():
    graph, v = _views_and_kernel()
    live = Liveness(graph)
    # Per node: p (node 0) is an output and never dies; the unread input and the unread constant die
    # at the first node that runs; x dies after its last reader (the permute); constants' lists are
    # empty; r and c die at the kernel; k at exp; e is an output.
    expected = [[v["x"], v["unused"], v["dead"]], [], [], [v["c"], v["r"]], [v["k"]], []]
    assert [ids(d) for d in live.dead_after()] == [ids(d) for d in expected]
    # An executor's arena values are kept.
    kept = live.dead_after(keep={v["k"], v["unused"]})
    assert [ids(d) for d in kept] == [ids(d) for d in [[v["x"], v["dead"]], [], [], [v["c"], v["r"]], [], []]]


def test_dead_after_of_an_empty_graph_and_a_graph_of_constants():
    b = GraphBuilder()
    x = b.input(t(2))
    assert Liveness(b.build([x])).dead_after() == []
    b.constant(np.zeros(2, np.float32), t(2))
    assert Liveness(b.build([x])).dead_after() == [()]


def test_interpreter_drops_values_after_their_last_use():
    """The interpreter's steps free exactly the dead-after slots (the per-call cost is these lists)."""
    from kiln.ir.interpreter import Program

    graph, _ = _views_and_kernel()
    program = Program(graph)
    slots = {value: i for i, value in enumerate(graph.values())}
    frees = [step[4] for step in program._steps]
    dead = [d for node, d in zip(graph.nodes, Liveness(graph).dead_after(), strict=True) if node.op != "constant"]
    assert frees == [tuple(slots[x] for x in d) for d in dead]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    e, p = program.run([x, np.zeros(5, np.float32)])
    np.testing.assert_allclose(e, np.exp(x.T.reshape(6) * 2), rtol=1e-6)
    np.testing.assert_array_equal(p, x.T)


# ----------------------------------------------------------------------------- aliasing
def test_views_and_aliases_through_a_chain_of_views():
    b = GraphBuilder()
    x, y = b.input(t(4, 6)), b.input(t(6))
    r = b.node("reshape", [x], {"shape": (2, 2, 6)})
    s = b.node("slice", [r], {"starts": (0, 1, 0), "stops": (2, 2, 6), "steps": (1, 1, 2)})
    p = b.node("permute", [s], {"perm": (2, 1, 0)})
    e = b.node("exp", [p])  # memory of its own
    ev = b.node("expand", [y], {"shape": (4, 6)})
    c = b.constant(np.ones((3, 1, 2), np.float32), t(3, 1, 2))
    cv = b.node("reshape", [b.node("expand", [c], {"shape": (3, 1, 2)})], {"shape": (6,)})
    graph = b.build([e, cv, ev])
    live = Liveness(graph)
    assert live.views(graph.inputs) == {x: [x, r, s, p], y: [y, ev]}
    cs = live.producer[cv].inputs[0]
    assert live.aliases() == {c, cs, cv} == constant_views(graph)
    assert live.aliases(inputs=True) == {x, r, s, p, y, ev, c, cs, cv}


# ----------------------------------------------------------------------------- same-element reads
def _kernel_node(bodies, kind: str = "elementwise"):
    b = GraphBuilder()
    ins = [b.input(v.type) for body in bodies for v in body.inputs]
    outs = b.kernel(ins, bodies, kind)
    graph = b.build(list(outs))
    verify(graph)
    return graph.nodes[0]


def _body(types, make) -> Graph:
    b = GraphBuilder()
    inputs = [b.input(ty) for ty in types]
    out = make(b, *inputs)
    return b.build(list(out) if isinstance(out, tuple) else [out])


def test_same_element_reads():
    # x and z read at the written element; y broadcast (another element for every row).
    body = _body([t(2, 3), t(3), t(2, 3)], lambda b, x, y, z: b.node("mul", [b.node("add", [x, y]), z]))
    assert pointwise_inputs(body) == {0, 2}
    node = _kernel_node([body])
    assert reads_at_own_index(node, node.inputs[0], node.outputs[0])
    assert not reads_at_own_index(node, node.inputs[1], node.outputs[0])
    # A permute downstream of exp(x): the loop reads x transposed.
    transposed = _body([t(3, 3)], lambda b, x: b.node("permute", [b.node("exp", [x])], {"perm": (1, 0)}))
    assert pointwise_inputs(transposed) == frozenset()
    node = _kernel_node([transposed])
    assert not reads_at_own_index(node, node.inputs[0], node.outputs[0])


def test_same_element_reads_of_horizontal_members():
    def member(shape):
        return _body([t(*shape), t(*shape)], lambda b, p, g: b.node("sub", [p, g]))

    node = _kernel_node([member((4,)), member((4,))], "horizontal")
    p0, g0, p1, _ = node.inputs
    out0, out1 = node.outputs
    assert reads_at_own_index(node, p0, out0) and reads_at_own_index(node, g0, out0)
    assert reads_at_own_index(node, p1, out1)
    assert not reads_at_own_index(node, p0, out1)  # another member's output: not this loop's element


def test_a_reduction_kernel_never_reads_at_its_own_index():
    body = _body([t(2, 3)], lambda b, x: b.node("div", [x, b.node("reduce_sum", [x], {"axes": (1,), "keepdim": True})]))
    node = _kernel_node([body], "reduction")
    assert not reads_at_own_index(node, node.inputs[0], node.outputs[0])


# ----------------------------------------------------------------------------- legality
def _reduce(b, x, keepdim, op="reduce_sum", axes=(1,)):
    return b.node(op, [x], {"axes": axes, "keepdim": keepdim})


#: name -> (input shapes, body maker, the problem's text or None when legal). Each graph is made only
#: of fusable nodes, so fusion makes it one kernel exactly when it is legal.
CASES = {
    "softmax": (
        (t(4, 8),),
        lambda b, x: b.node(
            "div", [e := b.node("exp", [b.node("sub", [x, _reduce(b, x, True, "reduce_max")])]), _reduce(b, e, True)]
        ),
        None,
    ),  # fmt: skip
    "row output": ((t(4, 8), t(4)), lambda b, x, w: b.node("mul", [_reduce(b, x, False), w]), None),
    "broadcast input": ((t(4, 8), t(8)), lambda b, x, w: b.node("add", [b.node("exp", [x]), w]), None),
    "view then broadcast": (
        (t(8, 4), t(4, 8)),
        lambda b, x, y: b.node("mul", [b.node("permute", [x], {"perm": (1, 0)}), y]),
        None,
    ),  # fmt: skip
    "keepdim row read square": ((t(4, 4),), lambda b, x: b.node("sub", [x, _reduce(b, x, True)]), None),
    "square misread": ((t(4, 4),), lambda b, x: b.node("add", [x, _reduce(b, x, False)]), "another row's index"),
    "permuted row": (
        (t(4, 4),),
        lambda b, x: b.node("sub", [x, b.node("permute", [_reduce(b, x, True)], {"perm": (1, 0)})]),
        "another row's index",
    ),  # fmt: skip
    "two reductions": (
        (t(4, 8), t(4, 8)),
        lambda b, x, y: (_reduce(b, x, True), _reduce(b, y, True, axes=(0, 1))),
        "every reduce of a body reduces axes",
    ),  # fmt: skip
    "two domains": (
        (t(4, 8), t(8)),
        lambda b, x, w: (b.node("exp", [x]), b.node("neg", [w])),
        "every output of an elementwise body",
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fusion_and_the_verifier_apply_one_legality(name):
    shapes, make, problem = CASES[name]
    body = _body(shapes, make)
    legality = kernel_legality(body.nodes, body.outputs, body.uses())
    assert legality.problem is None if problem is None else problem in legality.problem
    # The verifier: the body as a kernel of its kind.
    kind = "reduction" if any(n.op.startswith("reduce_") for n in body.nodes) else "elementwise"
    b = GraphBuilder()
    outs = b.kernel([b.input(v.type) for v in body.inputs], [body], kind)
    if problem is None:
        verify(b.build(list(outs)))
    else:
        with pytest.raises(VerificationError, match=problem):
            verify(b.build(list(outs)))
    # Fusion: the same nodes as a plain graph make one kernel exactly when they are legal.
    plain = GraphBuilder()
    inputs = [plain.input(v.type) for v in body.inputs]
    result = make(plain, *inputs)
    fused = fuse(plain.build(list(result) if isinstance(result, tuple) else [result]))
    verify(fused)
    kernels = [n for n in fused.nodes if n.op == KERNEL]
    assert (len(kernels) == 1 and len(fused.nodes) == 1) == (problem is None), str(fused)


def test_non_trailing_reductions_stay_extern_and_are_rejected_in_bodies():
    body = _body([t(4, 8)], lambda b, x: b.node("exp", [_reduce(b, x, True, axes=(0,))]))
    assert "trailing axes, got axes (0,)" in str(kernel_legality(body.nodes, body.outputs, body.uses()).problem)
    plain = GraphBuilder()
    x = plain.input(t(4, 8))
    fused = fuse(plain.build([plain.node("exp", [_reduce(plain, x, True, axes=(0,))])]))
    assert [n.op for n in fused.nodes] == ["reduce_sum", KERNEL]


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x + x.sum(1),  # reads the sum of row j at column j: now its own kernel, compiled
        lambda x: x - x.amax(1, keepdim=True).T,
        lambda x: (x - x.amax(1, keepdim=True)).exp(),
    ],
)
def test_square_row_reads_compile_and_match_eager(fn):
    compiled = kiln.compile(fn, fullgraph=True)
    for seed in range(3):
        x = kiln.tensor(np.random.default_rng(seed).standard_normal((5, 5)).astype(np.float32))
        np.testing.assert_allclose(compiled(x).numpy(), fn(x).numpy(), rtol=1e-5, atol=1e-6)
    text = str(kiln.explain(compiled))
    assert "compiled kernel" in text and "runs on the interpreter" not in text, text


def test_float16_bodies_are_legal_ir_that_fusion_leaves_to_eager_kernels():
    """The IR allows a float16 kernel (the interpreter runs it); fusion does not form one because the
    compiled kernels do not do float16 -- a backend's limit, not the IR's."""
    from kiln.codegen.backend import backend_named
    from kiln.ir.dtypes import float16
    from kiln.ir.interpreter import interpret

    h = TensorType((3, 4), float16)
    body = _body([h], lambda b, x: b.node("exp", [b.node("neg", [x])]))
    assert kernel_legality(body.nodes, body.outputs, body.uses()).kind == "elementwise"
    b = GraphBuilder()
    (out,) = b.kernel([b.input(h)], [body], "elementwise")
    graph = b.build([out])
    verify(graph)
    x = np.linspace(-1, 1, 12, dtype=np.float16).reshape(3, 4)
    np.testing.assert_array_equal(interpret(graph, [x])[0], np.exp(-x))
    plain = GraphBuilder()
    y = plain.node("exp", [plain.node("neg", [plain.input(h)])])
    llvm = backend_named("llvm")  # the backend's answer keeps float16 out of kernels
    assert [n.op for n in fuse(plain.build([y]), lambda n: llvm.declines(n) is None).nodes] == ["neg", "exp"]
