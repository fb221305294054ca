"""fuse: golden kernel structure for built graphs, the kernel structure of real kiln code traced by
kiln.compile (softmax, layer_norm, gelu, an MLP, cross_entropy, Adam), and bit-identical results
on the interpreter; a property test over random graphs of elementwise, view, reduction and extern
nodes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.optim as optim
from kiln.codegen.backend import backend_named
from kiln.ir.dtypes import float16, float32, int64
from kiln.ir.graph import KERNEL, Graph, GraphBuilder, qualified_constants
from kiln.ir.parser import parse_graph
from kiln.ir.printer import print_graph
from kiln.ir.types import TensorType
from kiln.ir.verifier import verify
from kiln.passes.fusion import fuse
from kiln.passes.fusion_recompute import CHEAP, COSTLY
from tests.passes import assert_same_results, check_pass, special

F32 = float32
INTERPRETER = kiln.CompileOptions(backend="interpreter")


def t(*shape, dtype=F32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def kernels(graph: Graph) -> list[str]:
    return [node.attrs["kind"] for node in graph.nodes if node.op == KERNEL]


def externs(graph: Graph) -> list[str]:
    return [node.op for node in graph.nodes if node.op not in (KERNEL, "constant")]


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        dtype = v.type.dtype
        if dtype.is_floating_point:
            out.append(rng.standard_normal(v.type.shape).astype(dtype.np))
        else:
            out.append(rng.integers(0, 3, v.type.shape).astype(dtype.np))
    return out


def fused_and_checked(graph: Graph, seeds=(0, 1), supports=None) -> Graph:
    """``fuse(graph, supports)``: verifies, survives the text round trip, leaves ``graph`` alone, same
    results bit for bit."""
    before = print_graph(graph)
    fused = fuse(graph, supports)
    verify(fused)
    assert print_graph(graph) == before
    text = print_graph(fused)
    assert print_graph(parse_graph(text, qualified_constants(fused))) == text
    for seed in seeds:
        assert_same_results(graph, fused, random_inputs(graph, seed))
    assert fuse(graph, supports).__str__() == text, "fusion is deterministic"
    return fused


def traced(fn, *args) -> Graph:
    """The optimized graph (before fusion) kiln.compile makes of ``fn``."""
    compiled = kiln.compile(fn, options=INTERPRETER)
    compiled(*args)
    return compiled.graph


# ----------------------------------------------------------------------------- golden IR
def test_elementwise_chain_with_broadcast_and_cast_is_one_kernel():
    b = GraphBuilder()
    x, w = b.input(t(2, 3)), b.input(t(3))
    y = b.node("cast", [b.node("exp", [b.node("mul", [x, w])])], {"dtype": int64})
    check_pass(fuse, b.build([y]), """
        graph(%0: f32[2,3], %1: f32[3]) {
          %4: i64[2,3] = kernel(%0, %1) {name="k0", kind="elementwise"} {
            body(%0: f32[2,3], %1: f32[3]) {
              %2: f32[2,3] = mul(%0, %1)
              %3: f32[2,3] = exp(%2)
              %4: i64[2,3] = cast(%3) {dtype=i64}
              return (%4)
            }
          }
          return (%4)
        }
    """, [random_inputs(b.build([y]))])  # fmt: skip


def test_matmul_epilogue_and_views():
    # permute feeding matmul stays extern (a free view); bias + relu after the matmul is one kernel;
    # a permute of a computed value is index remapping inside the kernel.
    b = GraphBuilder()
    x, w, bias = b.input(t(4, 3)), b.input(t(5, 3)), b.input(t(5))
    m = b.node("matmul", [x, b.node("permute", [w], {"perm": (1, 0)})])
    zero = b.constant(np.array(0.0, np.float32), t())
    r = b.node("maximum", [b.node("add", [m, bias]), zero])
    out = b.node("add", [b.node("permute", [b.node("exp", [r])], {"perm": (1, 0)}), b.input(t(5, 4))])
    graph = b.build([out])
    check_pass(fuse, graph, """
        graph(%0: f32[4,3], %1: f32[5,3], %2: f32[5], %10: f32[5,4]) {
          %3: f32[3,5] = permute(%1) {perm=(1, 0)}
          %4: f32[4,5] = matmul(%0, %3)
          %11: f32[5,4] = kernel(%4, %2, %10) {name="k0", kind="elementwise"} {
            body(%4: f32[4,5], %2: f32[5], %10: f32[5,4]) {
              %6: f32[4,5] = add(%4, %2)
              %5: f32[] = constant() {name="c0"}
              %7: f32[4,5] = maximum(%6, %5)
              %8: f32[4,5] = exp(%7)
              %9: f32[5,4] = permute(%8) {perm=(1, 0)}
              %11: f32[5,4] = add(%9, %10)
              return (%11)
            }
          }
          return (%11)
        }
    """, [random_inputs(graph)])  # fmt: skip


def test_values_used_outside_become_outputs_and_smaller_values_another_kernel():
    b = GraphBuilder()
    x, v = b.input(t(4, 8)), b.input(t(8))
    s = b.node("sin", [v])  # used by the big kernel and returned: shape [8] is not the domain
    e = b.node("exp", [x])
    y = b.node("mul", [e, s])
    graph = b.build([y, e, s])
    fused = fused_and_checked(graph)
    assert kernels(fused) == ["elementwise", "elementwise"]
    big = [n for n in fused.nodes if n.op == KERNEL and n.outputs[0].type.shape == (4, 8)][0]
    assert [o.id for o in big.outputs] == [e.id, y.id]


def test_no_cycle_through_an_extern_node():
    # exp -> matmul -> add(exp, matmul): the add cannot join exp's kernel (it would wait for itself).
    b = GraphBuilder()
    x = b.input(t(4, 4))
    e = b.node("exp", [x])
    out = b.node("add", [e, b.node("matmul", [e, x])])
    fused = fused_and_checked(b.build([out]))
    assert kernels(fused) == ["elementwise", "elementwise"] and externs(fused) == ["matmul"]


def test_what_stays_extern():
    b = GraphBuilder()
    x = b.input(t(4, 6))
    h = b.input(t(3, dtype=float16))
    r0 = b.node("reduce_sum", [x], {"axes": (0,), "keepdim": False})  # not trailing
    am = b.node("argmax", [x], {"axis": 1, "keepdim": False})
    cs = b.node("cumsum", [x], {"axis": 1, "reverse": False})
    h2 = b.node("exp", [h])  # float16: the LLVM backend declines it
    view = b.node("reshape", [x], {"shape": (24,)})  # a lone view returned: free
    graph = b.build([r0, am, cs, h2, view])
    llvm = backend_named("llvm")
    fused = fused_and_checked(graph, supports=lambda node: llvm.declines(node) is None)
    assert kernels(fused) == [] and externs(fused) == ["reduce_sum", "argmax", "cumsum", "exp", "reshape"]
    # what stays out for the backend's sake only: without its answer, the float16 exp is a kernel
    assert kernels(fused_and_checked(graph)) == ["elementwise"]


def test_single_node_is_a_kernel_and_full_reduction():
    b = GraphBuilder()
    x = b.input(t(3, 5))
    sq = b.node("mul", [x, x])
    total = b.node("reduce_sum", [sq], {"axes": (0, 1), "keepdim": False})
    fused = fused_and_checked(b.build([total, b.node("neg", [b.input(t(2))])]))
    assert kernels(fused) == ["reduction", "elementwise"]


def test_reductions_over_different_axes_are_different_kernels():
    b = GraphBuilder()
    x = b.input(t(4, 6, 8))
    s1 = b.node("reduce_sum", [x], {"axes": (2,), "keepdim": False})  # [4,6]
    s2 = b.node("reduce_max", [s1], {"axes": (1,), "keepdim": True})  # [4,1] of a [4,6] domain
    out = b.node("sub", [s1, s2])
    fused = fused_and_checked(b.build([out]))
    assert kernels(fused) == ["reduction", "reduction"]


def test_horizontal_fusion_of_independent_identical_kernels():
    b = GraphBuilder()
    lr = b.constant(np.array(0.1, np.float32), t())
    outs = []
    for shape in [(4,), (2, 3), (5,), (1, 1, 7)]:
        p, g = b.input(t(*shape)), b.input(t(*shape))
        outs.append(b.node("sub", [p, b.node("mul", [g, lr])]))
    # The same structure but depending on a member (through an extern node): cannot join it.
    flipped = b.node("flip", [outs[0]], {"axes": (0,)})
    outs.append(b.node("sub", [flipped, b.node("mul", [b.input(t(4)), lr])]))
    graph = b.build(outs)
    fused = fused_and_checked(graph)
    assert kernels(fused) == ["horizontal", "elementwise"] and externs(fused) == ["flip"]
    horizontal = fused.nodes[0]
    assert [body.inputs[0].type.shape for body in horizontal.bodies] == [(4,), (2, 3), (5,), (1, 1, 7)]
    assert len(horizontal.inputs) == 8 and len(horizontal.outputs) == 4


def test_horizontal_members_that_would_make_a_cycle_are_not_merged():
    # A -> X -> D and C -> Y -> B (X, Y extern); merging {A, B} and {C, D} would make a cycle.
    b = GraphBuilder()
    x, y = b.input(t(3, 3)), b.input(t(3, 3))
    a = b.node("exp", [x])
    c = b.node("sin", [y])
    bb = b.node("exp", [b.node("matmul", [c, c])])
    d = b.node("sin", [b.node("matmul", [a, a])])
    fused_and_checked(b.build([bb, d]))


# ----------------------------------------------------------------------------- traced kiln code
def _x(*shape, seed=0):
    return kiln.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


# made outside the traced function: a tensor the call makes from numpy stops a trace (numpy_inputs.py)
_LN_AFFINE = (_x(8, seed=1), _x(8, seed=2))


@pytest.mark.parametrize(
    "fn, expected",
    [
        (lambda x: F.softmax(x, dim=-1), ["reduction"]),
        (lambda x: F.log_softmax(x, dim=-1), ["reduction"]),
        (lambda x: F.gelu(x, approximate="tanh"), ["elementwise"]),
        (lambda x: (x * x).sum(dim=-1), ["reduction"]),
        (lambda x: F.layer_norm(x, (8,), *_LN_AFFINE), ["reduction"]),
    ],
    ids=["softmax", "log_softmax", "gelu", "sum_of_squares", "layer_norm"],
)
def test_traced_functions_become_one_kernel(fn, expected):
    fused = fused_and_checked(traced(fn, _x(4, 8)))
    assert kernels(fused) == expected and externs(fused) == []


def test_layer_norm_forward_and_backward_is_one_reduction_kernel():
    ln = nn.LayerNorm(16)

    def step(x):
        x = x.detach().requires_grad_()
        out = ln(x)
        return kiln.autograd.grad((out * out).sum(), [x, ln.weight, ln.bias])

    fused = fused_and_checked(traced(step, _x(4, 16)))
    # The weight and bias gradients reduce over the batch axis (not trailing): extern, one sum
    # each straight to the parameter's shape (no reshape after a keepdim sum).
    assert kernels(fused) == ["reduction"]
    assert sorted(externs(fused)) == ["reduce_sum", "reduce_sum"]


def test_inner_reductions_that_include_the_last_axis_are_kernels():
    # BatchNorm's statistics: sums over N, H and W of an NCHW array; the product fuses into its sum.
    def stats(x, g):
        return x.sum((0, 2, 3), keepdim=True), (x * g).sum((0, 2, 3)), x.amax(dim=(0, 1, 3)), x.sum(1)

    fused = fused_and_checked(traced(stats, _x(2, 3, 4, 5), _x(2, 3, 4, 5, seed=1)))
    assert set(kernels(fused)) == {"reduction"}
    assert sorted(externs(fused)) == ["reduce_sum", "reshape"]  # x.sum(1) keeps the last axis: a column sum
    bodies = [body for node in fused.nodes for body in node.bodies]
    assert all(body.nodes[0].op == "permute" for body in bodies if "mul" not in body.op_counts())
    assert any("mul" in body.op_counts() and "permute" in body.op_counts() for body in bodies)


def test_batch_norm_forward_and_backward_reduce_in_kernels():
    kiln.manual_seed(0)
    bn = nn.BatchNorm2d(3)

    def step(x):
        x = x.detach().requires_grad_()
        out = bn(x)
        return kiln.autograd.grad((out * out).sum(), [x, bn.weight, bn.bias])

    fused = fused_and_checked(traced(step, _x(4, 3, 5, 5)))
    assert "reduce_sum" not in externs(fused)


# ----------------------------------------------------------------------------- recomputation
def _kernel_making(graph: Graph, value) -> object:
    return next(n for n in graph.nodes if n.op == KERNEL and any(o.id == value.id for o in n.outputs))


def _body_ops(node) -> list[str]:
    return [n.op for body in node.bodies for n in body.nodes]


def test_gelu_backward_computes_the_forward_values_again():
    # The forward kernel made h and four values of h for the backward (h*h*c + d, the tanh's two
    # forms, the activation); the backward reads h anyway and computes them again.
    kiln.manual_seed(0)
    w1, w2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def step(x):
        x = x.detach().requires_grad_()
        out = w2(F.gelu(w1(x), approximate="tanh"))
        return kiln.autograd.grad((out * out).sum(), [x, w1.weight, w2.weight])

    fused = fused_and_checked(traced(step, _x(6, 8)))
    gelu = [n for n in fused.nodes if n.op == KERNEL and "tanh" in _body_ops(n)]
    assert len(gelu) == 2  # the forward's kernel and the backward's, each with its tanh
    forward, backward = gelu
    assert len(forward.outputs) == 2  # h (the backward's input) and the activation (the next matmul's)
    assert any(v in backward.inputs for v in forward.outputs)


def _tanh_read_by(reader: str, also_extern: bool):
    """x -> t = tanh(x), u = exp(t) in one kernel; m = u @ w; a second kernel reads m, t and x."""
    b = GraphBuilder()
    x, w = b.input(t(4, 8)), b.input(t(8, 8))
    th = b.node("tanh", [x])
    u = b.node("exp", [th])
    m = b.node("matmul", [u, w])
    y = b.node("add", [b.node("mul", [m, th]), x])
    if reader == "reduction":
        y = b.node("reduce_sum", [y], {"axes": (1,), "keepdim": False})
    outputs = [y, b.node("matmul", [th, w])] if also_extern else [y]
    return th, fused_and_checked(b.build(outputs))


@pytest.mark.parametrize(
    "reader, also_extern, recomputed",
    [("elementwise", False, True), ("reduction", False, False), ("elementwise", True, False)],
    ids=["into_an_elementwise_kernel", "not_into_a_reduction", "not_when_a_matmul_reads_it_too"],
)
def test_a_transcendental_is_computed_again_only_where_it_saves_its_write_and_read(reader, also_extern, recomputed):
    th, fused = _tanh_read_by(reader, also_extern)
    second = [n for n in fused.nodes if n.op == KERNEL][-1]
    assert ("tanh" in _body_ops(second)) == recomputed
    made = [o.id for n in fused.nodes if n.op == KERNEL for o in n.outputs]
    assert (th.id in made) == (not recomputed or also_extern)


def test_batch_norm_reads_its_input_again_rather_than_its_deviation():
    # BatchNorm's forward (training): x - mean was a kernel's full-size output, read by the sum of
    # the deviations and by the next kernel. Both compute it from x and mean now (same bytes read);
    # one kernel writes full-size values: the result (and the normalized input the backward saves).
    kiln.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    fused = fused_and_checked(traced(lambda x: bn(x), _x(4, 3, 5, 5)))
    writers = [n for n in fused.nodes if n.op == KERNEL and any(o.type.shape == (4, 3, 5, 5) for o in n.outputs)]
    assert len(writers) == 1
    reductions = [n for n in fused.nodes if n.op == KERNEL and n.attrs["kind"] == "reduction"]
    assert sum("sub" in _body_ops(n) for n in reductions) == 2  # the deviations' sum and the squares' sum


def test_cheap_values_are_computed_again_even_where_an_extern_node_reads_them():
    b = GraphBuilder()
    x, w = b.input(t(4, 8)), b.input(t(8, 8))
    scaled = b.node("mul", [x, x])
    m = b.node("matmul", [scaled, w])  # the first kernel still makes `scaled` for the matmul
    y = b.node("reduce_sum", [b.node("add", [b.node("mul", [m, scaled]), x])], {"axes": (1,), "keepdim": False})
    fused = fused_and_checked(b.build([y]))
    reader = _kernel_making(fused, y)
    assert scaled.id not in [v.id for v in reader.inputs]  # computed from x, which it reads anyway
    assert _body_ops(reader).count("mul") == 2


def test_mlp_forward_is_matmuls_with_epilogue_kernels():
    kiln.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    fused = fused_and_checked(traced(lambda x: mlp(x), _x(5, 6)))
    assert kernels(fused) == ["elementwise", "elementwise"]
    assert externs(fused) == ["permute", "matmul", "permute", "matmul"]


def test_cross_entropy_logsumexp_is_one_reduction_kernel():
    y = kiln.tensor(np.array([0, 2, 1, 1, 0]))
    fused = fused_and_checked(traced(lambda x, y: F.cross_entropy(x, y), _x(5, 3), y))
    # the kernel over the logits: the targets' own kernels come first, the gathered logits join it
    (over_logits,) = [n for n in fused.nodes if n.op == KERNEL and any(m.op == "reduce_max" for m in n.bodies[0].nodes)]
    assert over_logits.attrs["kind"] == "reduction"
    assert [n.op for n in over_logits.bodies[0].nodes if n.op.startswith("reduce")] == ["reduce_max", "reduce_sum"]
    assert externs(fused) == ["reshape", "check", "gather"]  # the target check and the gather's merged into one


def test_adam_step_over_five_parameters_is_horizontal():
    rng = np.random.default_rng(0)
    params = [nn.Parameter(kiln.tensor(rng.standard_normal(s).astype(np.float32))) for s in
              [(4,), (3, 5), (7,), (2, 2, 2), (6,)]]  # fmt: skip
    opt = optim.Adam(params, lr=1e-2)
    for p in params:
        p.grad = kiln.ones_like(p)
    compiled = kiln.compile(lambda: opt.step(), options=INTERPRETER)
    compiled()
    compiled()
    fused = fused_and_checked(compiled.graph)
    assert externs(fused) == []
    updates = [n for n in fused.nodes if n.op == KERNEL and n.outputs[-1].type.shape == (6,)]
    assert len(updates) == 1 and updates[0].attrs["kind"] == "horizontal" and len(updates[0].bodies) == 5
    assert all(kind == "horizontal" for kind in kernels(fused))


def test_mlp_training_step_fuses_into_horizontal_kernels_and_eight_products():
    # How fast fusion runs is the compile_cost benchmark's to say (a timed test here failed under a
    # loaded CI run at 204 ms against a 200 ms bound, for a few milliseconds' work when quiet).
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = optim.Adam(model.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = kiln.compile(step, options=INTERPRETER)
    x, y = _x(16, 32), kiln.tensor(np.arange(16) % 10)
    compiled(x, y)
    compiled(x, y)
    graph = compiled.graph
    fused = fuse(graph)
    verify(fused)
    assert "horizontal" in kernels(fused) and externs(fused).count("matmul") == 8
    assert_same_results(graph, fused, random_inputs(graph))


# ----------------------------------------------------------------------------- property
UNARY = ["exp", "neg", "tanh", "abs", "sqrt"]
BINARY = ["add", "mul", "maximum", "sub", "div"]


@st.composite
def random_graphs(draw):
    """Graphs of elementwise, view, reduction (trailing and not) and extern nodes over 1-3 inputs,
    values used several times, several outputs."""
    b = GraphBuilder()
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    values = [b.input(t(*shape)) for _ in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(1, 10))):
        x = draw(st.sampled_from(values))
        kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "view", "extern", "const"]))
        if kind == "unary":
            values.append(b.node(draw(st.sampled_from(UNARY)), [x]))
        elif kind == "binary":
            same = [v for v in values if v.type.shape == x.type.shape or v.type.shape == x.type.shape[1:]]
            values.append(b.node(draw(st.sampled_from(BINARY)), [x, draw(st.sampled_from(same))]))
        elif kind == "const":
            c = b.constant(np.array(draw(st.sampled_from([0.5, -2.0, 0.0])), np.float32), t())
            values.append(b.node("mul", [x, c]))
        elif kind == "reduce" and x.type.ndim:
            start = draw(st.integers(0, x.type.ndim - 1))
            trailing = draw(st.booleans())
            axes = tuple(range(start, x.type.ndim)) if trailing else (start,)
            op = draw(st.sampled_from(["reduce_sum", "reduce_max"]))
            r = b.node(op, [x], {"axes": axes, "keepdim": draw(st.booleans())})
            values.append(r)
            if draw(st.booleans()) and r.type.ndim == x.type.ndim:  # broadcast the row back
                values.append(b.node("sub", [x, r]))
        elif kind == "view" and x.type.ndim:
            view = draw(st.sampled_from(["reshape", "permute", "slice", "expand"]))
            if view == "reshape":
                values.append(b.node("reshape", [x], {"shape": (x.type.numel,)}))
            elif view == "permute":
                values.append(b.node("permute", [x], {"perm": tuple(reversed(range(x.type.ndim)))}))
            elif view == "slice":
                stops = tuple(max(1, d - 1) for d in x.type.shape)
                attrs = {"starts": (0,) * x.type.ndim, "stops": stops, "steps": (1,) * x.type.ndim}
                values.append(b.node("slice", [x], attrs))
            else:
                values.append(b.node("expand", [x], {"shape": (2, *x.type.shape)}))
        elif kind == "extern":
            values.append(b.node("flip", [x], {"axes": tuple(range(x.type.ndim))}))
    outputs = draw(st.lists(st.sampled_from(values[1:] or values), min_size=1, max_size=3))
    return b.build(outputs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_property_fused_graphs_verify_and_compute_the_same(graph):
    fused = fuse(graph)
    verify(fused)
    for shift in range(2):
        inputs = [special(v.type.shape, np.float32, shift + 3 * i) for i, v in enumerate(graph.inputs)]
        assert_same_results(graph, fused, inputs)
    assert all(node.op != KERNEL or node.bodies for node in fused.nodes)
    # A node is in more than one kernel only as cheap elementwise work that a reader computes again
    # (fusion_recompute), and a transcendental only where no kernel writes its value any more.
    ops = {n.outputs[0].id: n.op for n in graph.nodes}
    made = {v.id for node in fused.nodes if node.op == KERNEL for v in node.outputs}
    body_ops = Counter(n.outputs[0].id for node in fused.nodes for body in node.bodies for n in body.nodes
                       if n.op != "constant")  # fmt: skip
    for value, count in body_ops.items():
        if count > 1:
            assert ops[value] in CHEAP | COSTLY, f"%{value} = {ops[value]} is computed in {count} kernels"
            assert ops[value] not in COSTLY or value not in made, f"%{value} is both written and computed again"


def test_every_elementwise_primitive_has_one_cost_class_that_recomputation_reads():
    """Cost is a field of the primitive (issue 37): recomputation's classes cover every elementwise
    primitive (ten of them, floor and sin among them, were in neither of two hand-kept lists, so never
    recomputed), and the kept-value rule of the LLVM kernels reads the same field."""
    from kiln.codegen.llvm import reduction
    from kiln.ir.primitives import ELEMENTWISE, PRIMITIVES, Cost, ops_of_cost
    from kiln.passes import fusion_recompute

    elementwise = {name for name, prim in PRIMITIVES.items() if prim.kind in ELEMENTWISE}
    assert fusion_recompute.CHEAP | fusion_recompute.COSTLY == elementwise
    assert not fusion_recompute.CHEAP & fusion_recompute.COSTLY
    assert reduction.COSTLY == ops_of_cost(Cost.ROUTINE) <= fusion_recompute.COSTLY
    assert {"floor", "sign", "logical_xor"} <= fusion_recompute.CHEAP
    assert {"sin", "pow", "remainder"} <= fusion_recompute.COSTLY


def test_a_costly_value_that_stays_written_is_read_not_computed_again():
    """``exp(d) + flip(d)`` with ``d = x / x``: the flip (no kernel) reads ``d`` from memory, so ``d``
    stays written; the kernel of ``exp`` and ``add`` reads it rather than dividing again (hypothesis
    seeds 100 and 120 of the property test above found the division made in two kernels)."""
    b = GraphBuilder()
    x = b.input(TensorType((2, 1), float32))
    d = b.node("div", [x, x])
    out = b.node("add", [b.node("flip", [d], {"axes": (0,)}), b.node("exp", [d])])
    graph = b.build([out])
    fused = fuse(graph)
    verify(fused)
    divisions = [
        n for node in fused.nodes if node.op == KERNEL for body in node.bodies for n in body.nodes if n.op == "div"
    ]
    assert len(divisions) == 1
    inputs = [np.array([[2.0], [-3.0]], np.float32)]
    assert_same_results(graph, fused, inputs)
