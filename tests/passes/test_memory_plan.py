"""plan_memory: hand-computed arenas, liveness through views, what is never planned, in-place
reuse (taken and refused), and a property test on random DAGs that no two values alive at once
share a byte."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.ir.dtypes import float32, float64, int32
from kiln.ir.graph import KERNEL, Graph, GraphBuilder, Value
from kiln.ir.types import TensorType
from kiln.passes.memory_plan import ALIGNMENT, MemoryPlan, eager_peak_bytes, plan_memory

F = TensorType((256,), float32)  # 1 KiB
SIZE = 1024


def body(types, make) -> Graph:
    """A kernel body: ``make(builder, *inputs)`` returns the body's outputs."""
    b = GraphBuilder()
    inputs = [b.input(t) for t in types]
    outputs = make(b, *inputs)
    return b.build(list(outputs) if isinstance(outputs, (list, tuple)) else [outputs])


def exp_kernel(b: GraphBuilder, *inputs: Value, kind: str = "elementwise") -> Value:
    """A one-output kernel: exp(input 0) plus every other input (same shape as input 0)."""

    def make(bb, first, *rest):
        acc = bb.node("exp", [first])
        for v in rest:
            acc = bb.node("add", [acc, v])
        return acc

    (out,) = b.kernel(inputs, [body([v.type for v in inputs], make)], kind)
    return out


def chain(n: int, t: TensorType = F) -> tuple[Graph, list[Value]]:
    """x -> k -> k -> ... (n kernels); the last is the output."""
    b = GraphBuilder()
    values = [b.input(t)]
    for _ in range(n):
        values.append(exp_kernel(b, values[-1]))
    return b.build([values[-1]]), values[1:]


# ----------------------------------------------------------------------------- hand-computed plans
def test_a_chain_of_kernels_reuses_two_buffers():
    graph, (a, b, c, d) = chain(4)
    plan = plan_memory(graph, allow_inplace=False)
    assert set(plan.offsets) == {a, b, c}  # d is the output
    assert plan.offsets[a] == plan.offsets[c] != plan.offsets[b]  # c takes dead a's buffer
    assert (plan.arena_bytes, plan.peak_bytes, plan.intermediate_bytes) == (2 * SIZE, 2 * SIZE, 3 * SIZE)
    assert plan.inplace == {}


def test_a_chain_of_elementwise_kernels_runs_in_place_in_one_buffer():
    graph, (a, b, c, _) = chain(4)
    plan = plan_memory(graph)
    assert plan.inplace == {b: a, c: b}
    assert plan.offsets == {a: 0, b: 0, c: 0}
    assert (plan.arena_bytes, plan.peak_bytes, plan.intermediate_bytes) == (SIZE, SIZE, 3 * SIZE)


def test_greedy_by_size_beats_first_fit_in_schedule_order():
    # A (1 KiB) lives at nodes 0..1, B (1 KiB) at 1..4, C (2 KiB) at 2..3. In schedule order A
    # takes 0, B 1K, and C no longer fits under B: 4 KiB. By size, C goes first at 0, A under it
    # (they never meet), B on top: 3 KiB, the peak (B and C alive together).
    b = GraphBuilder()
    x, y = b.input(F), b.input(TensorType((512,), float32))
    a = exp_kernel(b, x)
    big_b = exp_kernel(b, x, a)
    c = exp_kernel(b, y)
    graph = b.build([exp_kernel(b, c), exp_kernel(b, big_b)])
    plan = plan_memory(graph, allow_inplace=False)
    assert plan.offsets == {c: 0, a: 0, big_b: 2 * SIZE}
    assert plan.arena_bytes == plan.peak_bytes == 3 * SIZE


def test_views_keep_their_base_alive_until_their_last_use():
    b = GraphBuilder()
    x = b.input(F)
    a = exp_kernel(b, x)  # node 0
    view = b.node("reshape", [b.node("reshape", [a], {"shape": (16, 16)})], {"shape": (256,)})  # nodes 1, 2
    c = exp_kernel(b, x)  # node 3
    d = exp_kernel(b, c)  # node 4
    graph = b.build([exp_kernel(b, view, d)])  # node 5: the view is read here, so a lives 0..5
    plan = plan_memory(graph, allow_inplace=False)
    assert set(plan.offsets) == {a, c, d}
    assert len({plan.offsets[a], plan.offsets[c], plan.offsets[d]}) == 3  # a overlaps both c and d
    assert plan.arena_bytes == 3 * SIZE  # without the view's use a would die at node 1: 2 buffers
    plan = plan_memory(graph)
    assert plan.inplace == {d: c}  # the last kernel reads a through a view: not in place
    assert plan.arena_bytes == 2 * SIZE


def test_inputs_constants_outputs_externs_and_views_are_never_planned():
    b = GraphBuilder()
    x = b.input(TensorType((4, 4), float32))
    const = b.constant(np.ones((4, 4), np.float32), TensorType((4, 4), float32))
    extern = b.node("exp", [x])  # numpy allocates it
    mm = b.node("matmul", [extern, const])  # planned: the executor writes it with out=
    out_kernel = exp_kernel(b, mm)  # a graph output
    escapes = exp_kernel(b, mm)
    escaping_view = b.node("permute", [escapes], {"perm": (1, 0)})  # a view of it is a graph output
    inner = exp_kernel(b, mm, out_kernel)  # planned
    graph = b.build([out_kernel, escaping_view, b.node("neg", [inner])])
    plan = plan_memory(graph)
    assert set(plan.offsets) == {mm, inner}
    assert plan.inplace == {inner: mm}  # mm dies there; out_kernel (not planned) is merely read


def test_alignment_of_odd_sizes():
    graph, (a, b, _) = chain(3, TensorType((3,), float32))  # 12 bytes each
    plan = plan_memory(graph, allow_inplace=False)
    assert plan.offsets[a] % ALIGNMENT == 0 and plan.offsets[b] % ALIGNMENT == 0
    assert plan.offsets[a] != plan.offsets[b]
    assert (plan.arena_bytes, plan.intermediate_bytes) == (2 * ALIGNMENT, 2 * ALIGNMENT)


def test_size_zero_values_take_no_room():
    graph, values = chain(3, TensorType((0, 4), float32))
    plan = plan_memory(graph)
    assert plan.arena_bytes == plan.peak_bytes == plan.intermediate_bytes == 0
    assert set(plan.offsets) == set(values[:-1])


def test_an_empty_graph_and_a_graph_of_externs_plan_nothing():
    b = GraphBuilder()
    x = b.input(F)
    plan = plan_memory(b.build([b.node("exp", [b.node("exp", [x])])]))
    assert (plan.offsets, plan.arena_bytes, plan.peak_bytes, plan.intermediate_bytes) == ({}, 0, 0, 0)
    assert "arena 0 B for 0 intermediates in 0 buffers" in plan.describe()


# ----------------------------------------------------------------------------- in place
def _inplace_of(make, in_types, *, kind="elementwise", extra_read=False):
    """x -> planned producer p (of in_types[0]) -> kernel(make) -> output; the plan's inplace."""
    b = GraphBuilder()
    x = b.input(in_types[0])
    p = exp_kernel(b, x, kind="reduction")  # planned, never in place itself
    others = [b.input(t) for t in in_types[1:]]
    inputs = [p, *others]
    if extra_read:
        inputs.append(b.node("permute", [p], {"perm": (1, 0)}))
    bodies = [body([v.type for v in inputs], make)]
    outs = b.kernel(inputs, bodies, kind)
    (k,) = b.kernel(outs[:1], [body([outs[0].type], lambda bb, v: bb.node("abs", [v]))], "reduction")
    plan = plan_memory(b.build([k]))
    return plan, p, outs[0]


SQ = TensorType((4, 4), float32)


def test_inplace_is_taken_for_an_elementwise_body_reading_its_own_element():
    plan, p, out = _inplace_of(
        lambda bb, v, w: bb.node("mul", [bb.node("exp", [v]), w]), [SQ, TensorType((4,), float32)]
    )
    assert plan.inplace == {out: p} and plan.offsets[out] == plan.offsets[p]
    assert "in place: 1 kernel output(s)" in plan.describe()


def test_inplace_across_dtypes_of_the_same_size():
    cast = lambda bb, v: bb.node("cast", [v], {"dtype": int32})  # noqa: E731
    plan, p, out = _inplace_of(cast, [SQ])
    assert plan.inplace == {out: p}
    widen = lambda bb, v: bb.node("cast", [v], {"dtype": float64})  # noqa: E731
    plan, _, _ = _inplace_of(widen, [SQ])
    assert plan.inplace == {}  # 128 bytes out of 64: not the same buffer


@pytest.mark.parametrize(
    "make",
    [
        lambda bb, v: bb.node("add", [bb.node("permute", [v], {"perm": (1, 0)}), v]),  # reads v[j, i] too
        lambda bb, v: bb.node("exp", [bb.node("reshape", [bb.node("exp", [v])], {"shape": (4, 4)})]),  # a view
        lambda bb, v: bb.node("reshape", [bb.node("permute", [v], {"perm": (1, 0)})], {"shape": (4, 4)}),
    ],
    ids=["permute", "view-of-derived", "permute-output"],
)
def test_inplace_is_refused_where_the_body_reads_other_elements(make):
    plan, _, _ = _inplace_of(make, [SQ])
    assert plan.inplace == {}


def test_inplace_is_refused_for_a_broadcast_input_of_the_same_size():
    # f64[4,1] (32 bytes) broadcast into an f32[4,2] domain (32 bytes): element k is read by 2 outputs.
    def make(bb, v, w):
        return bb.node("add", [bb.node("cast", [v], {"dtype": float32}), w])

    plan, _, _ = _inplace_of(make, [TensorType((4, 1), float64), TensorType((4, 2), float32)])
    assert plan.inplace == {}


def test_inplace_is_refused_when_the_kernel_also_reads_the_input_through_a_view():
    plan, _, _ = _inplace_of(lambda bb, v, t: bb.node("add", [v, t]), [SQ], extra_read=True)
    assert plan.inplace == {}


def test_inplace_is_refused_for_reduction_kernels():
    plan, _, _ = _inplace_of(lambda bb, v: bb.node("exp", [v]), [SQ], kind="reduction")
    assert plan.inplace == {}


def test_inplace_never_takes_a_graph_input_or_a_value_still_needed():
    b = GraphBuilder()
    x = b.input(F)
    a = exp_kernel(b, x)  # x is the caller's: a may not overwrite it
    c = exp_kernel(b, a)  # a is read again below: c may not overwrite it
    d = exp_kernel(b, a, c)  # a and c both die here: d takes a's (the first eligible input)
    plan = plan_memory(b.build([exp_kernel(b, d)]))
    assert plan.inplace == {d: a}
    assert plan.offsets[c] != plan.offsets[a]


def test_inplace_in_a_horizontal_kernel_stays_within_a_member():
    b = GraphBuilder()
    x = b.input(F)
    p0, p1 = exp_kernel(b, x, kind="reduction"), exp_kernel(b, x, kind="reduction")
    member = body([F], lambda bb, v: bb.node("neg", [v]))
    q0, q1 = b.kernel([p0, p1], [member, member], "horizontal")
    # A second horizontal kernel whose member 0 reads member 1's input too: refused for that one.
    r = b.kernel([q0, q1, q0], [body([F, F], lambda bb, v, w: bb.node("add", [v, w])), member], "horizontal")
    plan = plan_memory(b.build([exp_kernel(b, *r)]))
    assert plan.inplace == {q0: p0, q1: p1, r[0]: q1}  # q0 is read by both members: nobody takes it


# ----------------------------------------------------------------------------- eager peak
def test_eager_peak_counts_intermediates_freed_after_their_last_use():
    b = GraphBuilder()
    x = b.input(F)
    a = b.node("exp", [x])  # node 0: a (1K)
    v = b.node("reshape", [a], {"shape": (16, 16)})  # node 1: a view costs nothing
    c = b.node("exp", [x])  # node 2: a, c (2K)
    m = b.node("lt", [c, x])  # node 3: a, c, m (2K + 256 B); c dies
    out = b.node("where", [m, b.node("reshape", [v], {"shape": (256,)}), x])  # node 4/5: a, m, out (not counted)
    assert eager_peak_bytes(b.build([out])) == 2 * SIZE + 256


def test_traced_mlp_forward_eager_peak_and_a_fused_plan():
    kiln = pytest.importorskip("kiln")
    from kiln.compiler.options import CompileOptions

    def forward(x, w1, b1, w2):
        return kiln.relu(x @ w1 + b1) @ w2

    f = kiln.compile(forward, options=CompileOptions(backend="interpreter"))
    args = (kiln.randn(64, 784), kiln.randn(784, 512), kiln.randn(512), kiln.randn(512, 10))
    f(*args)
    graph = f.graph
    hidden = 64 * 512 * 4
    # add reads x@w1 while writing h; le makes a bool mask; where reads h and the mask: 2 hidden + mask.
    assert graph.op_counts().get("matmul") == 2
    assert eager_peak_bytes(graph) == 2 * hidden + hidden // 4
    # The unfused graph planned as is: only the matmul outputs that are not outputs are planned.
    assert plan_memory(graph).arena_bytes == hidden

    # What fusion makes of it: matmul; one kernel for bias + relu; matmul. The kernel runs in place.
    fused = fuse_bias_relu(graph)
    plan = plan_memory(fused, eager_graph=graph)
    assert plan.eager_peak_bytes == 2 * hidden + hidden // 4
    assert (plan.arena_bytes, plan.peak_bytes, plan.intermediate_bytes) == (hidden, hidden, 2 * hidden)
    assert len(plan.inplace) == 1
    text = plan.describe()
    assert "arena 128.0 KiB for 2 intermediates in 1 buffer" in text and "eager would hold up to 288.0 KiB" in text, (
        text
    )
    assert "(0.44x)" in text, text


def fuse_bias_relu(graph: Graph) -> Graph:
    """The traced MLP forward with its elementwise nodes in one kernel (as the fusion pass would)."""
    matmul1, *middle, matmul2 = [n for n in graph.nodes if n.op != "constant"]
    b = GraphBuilder()
    for v in graph.inputs:
        b.input(v.type)
    x, w1, b1, w2 = b.inputs
    h = b.node("matmul", [x, w1])

    def make(bb, hh, bias):
        z = bb.node("add", [hh, bias])
        zero = bb.constant(np.zeros((), np.float32), TensorType((), float32))
        return bb.node("where", [bb.node("le", [z, zero]), zero, z])

    assert [n.op for n in middle] == ["add", "le", "where"]
    (r,) = b.kernel([h, b1], [body([h.type, b1.type], make)], "elementwise")
    return b.build([b.node("matmul", [r, w2])])


# ----------------------------------------------------------------------------- random DAGs
@st.composite
def random_graphs(draw) -> Graph:
    lengths = st.sampled_from([1, 3, 16, 40, 64])
    b = GraphBuilder()
    values = [b.input(TensorType((draw(lengths),), draw(st.sampled_from([float32, float64, int32]))))
              for _ in range(draw(st.integers(1, 3)))]  # fmt: skip
    for _ in range(draw(st.integers(1, 30))):
        op = draw(st.sampled_from(["kernel", "kernel", "kernel", "kernel", "view", "extern", "matmul"]))
        src = draw(st.sampled_from(values))
        if op == "view":
            values.append(b.node("reshape", [src], {"shape": (1, *src.type.shape)}))
        elif op == "extern":
            values.append(b.node("neg", [src]))
        elif op == "matmul":
            n = src.type.numel
            col = b.node("reshape", [b.node("cast", [src], {"dtype": float32})], {"shape": (n, 1)})
            values.append(b.node("matmul", [col, b.node("reshape", [col], {"shape": (1, n)})]))
        else:
            others = draw(st.lists(st.sampled_from(values), max_size=2))
            kind = draw(st.sampled_from(["elementwise", "elementwise", "reduction"]))
            n_out = draw(st.integers(1, 2))
            bodies = [body([src.type, *(v.type for v in others)],
                           lambda bb, s, *rest, n=n_out: [bb.node("abs", [s]) for _ in range(n)])]  # fmt: skip
            values.extend(b.kernel([src, *others], bodies, kind))
    outputs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    return b.build(outputs)


def reference_lifetimes(graph: Graph) -> tuple[dict[Value, Value], dict[Value, tuple[int, int]]]:
    """Naive liveness: each value's storage owner, and each owner's [definition, last use]."""
    root: dict[Value, Value] = {v: v for v in graph.inputs}
    life: dict[Value, tuple[int, int]] = {}
    for i, node in enumerate(graph.nodes):
        for out in node.outputs:
            root[out] = root[node.inputs[0]] if node.op in ("reshape", "permute", "expand", "slice") else out
            if root[out] is out:
                life[out] = (i, i)
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            r = root[v]
            if r in life:
                life[r] = (life[r][0], max(life[r][1], i))
    return root, life


def check_plan(plan: MemoryPlan, graph: Graph) -> None:
    root, life = reference_lifetimes(graph)
    producer = {v: n for n in graph.nodes for v in n.outputs}
    escaped = {root[v] for v in graph.outputs}
    expected = {r for r in life if producer[r].op in (KERNEL, "matmul") and r not in escaped}
    assert set(plan.offsets) == expected

    def nbytes(v):
        return v.type.numel * v.type.dtype.itemsize

    for v, offset in plan.offsets.items():
        assert offset % ALIGNMENT == 0 and offset + nbytes(v) <= plan.arena_bytes
    for out, inp in plan.inplace.items():
        node = producer[out]
        assert node.op == KERNEL and inp in node.inputs and inp in expected and out in expected
        assert life[inp][1] == graph.nodes.index(node) and nbytes(inp) == nbytes(out)
        assert plan.offsets[out] == plan.offsets[inp]
    assert len(set(plan.inplace.values())) == len(plan.inplace)
    for a, c in itertools.combinations(plan.offsets, 2):
        (a0, a1), (c0, c1) = life[a], life[c]
        if a0 > c1 or c0 > a1 or not nbytes(a) or not nbytes(c):
            continue  # never alive together, or empty
        if plan.inplace.get(c) is a or plan.inplace.get(a) is c:
            continue  # the kernel writes each element over the one it has just read
        overlap = plan.offsets[a] < plan.offsets[c] + nbytes(c) and plan.offsets[c] < plan.offsets[a] + nbytes(a)
        assert not overlap, (a, c, life[a], life[c], plan.offsets[a], plan.offsets[c])
    assert plan.peak_bytes <= plan.arena_bytes <= plan.intermediate_bytes
    assert plan.intermediate_bytes == sum(-(-nbytes(v) // ALIGNMENT) * ALIGNMENT for v in expected)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.booleans())
def test_values_alive_together_never_share_a_byte(graph, allow_inplace):
    check_plan(plan_memory(graph, allow_inplace=allow_inplace), graph)


def test_the_vectorized_gap_search_places_exactly_as_the_plain_one(monkeypatch):
    from kiln.passes import memory_plan

    rng = np.random.default_rng(0)
    n = 400
    starts = rng.integers(0, 300, n).tolist()
    ends = [s + int(d) for s, d in zip(starts, rng.integers(0, 120, n))]
    sizes = (rng.choice([0, 64, 128, 1024, 4096], n)).tolist()
    monkeypatch.setattr(memory_plan, "_VECTOR_ABOVE", 10**9)
    plain = memory_plan.place(sizes, starts, ends)
    monkeypatch.setattr(memory_plan, "_VECTOR_ABOVE", 0)
    assert memory_plan.place(sizes, starts, ends) == plain
    offsets, arena = plain
    for a, c in itertools.combinations(range(n), 2):
        if starts[a] <= ends[c] and starts[c] <= ends[a] and sizes[a] and sizes[c]:
            assert offsets[a] + sizes[a] <= offsets[c] or offsets[c] + sizes[c] <= offsets[a]
    assert memory_plan.peak(sizes, starts, ends) <= arena <= 1.1 * memory_plan.peak(sizes, starts, ends)
