"""Why fusion declined a merge (``kiln.passes.fusion_refusals``): for each reason a built graph whose
two kernels cannot merge, and the reason's words (both sides named as the fused graph names them);
the count of the rest of a kind; refusals that a later merge made moot are left out; ``kiln.explain``,
``dump_dir`` and the disk cache carry them."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.dtypes import float32, int64
from kiln.ir.graph import KERNEL, Graph, GraphBuilder
from kiln.ir.types import TensorType
from kiln.ir.verifier import verify
from kiln.passes.fusion import fuse
from kiln.passes.fusion_refusals import WORDING, Refusal, SideNames, summarize, word
from kiln.passes.fusion_rules import MAX_KERNEL_NODES
from tests.passes import assert_same_results
from tests.passes.test_fusion import random_inputs


def t(*shape, dtype=float32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def refused(graph: Graph, per_kind: int = 3, **options) -> tuple[list[str], list[str], Graph]:
    """``(kinds, worded lines, fused graph)`` of ``fuse(graph)``, the fused graph checked against ``graph``."""
    refusals: list = []
    fused = fuse(graph, refusals=refusals, **options)
    verify(fused)
    assert_same_results(graph, fused, random_inputs(graph))
    assert str(fuse(graph, **options)) == str(fused), "recording refusals changes nothing fused"
    return [r.kind for r in refusals], summarize(refusals, fused, per_kind), fused


def kernel_names(graph: Graph) -> list[str]:
    return [f"{n.attrs['kind']} {n.attrs['name']}" for n in graph.nodes if n.op == KERNEL]


# ----------------------------------------------------------------------------- one graph per reason
def test_a_chain_longer_than_a_kernel_takes_is_cut_and_says_so():
    b = GraphBuilder()
    v = b.input(t(8))
    for _ in range(MAX_KERNEL_NODES + 44):
        v = b.node("neg", [v])
    kinds, lines, fused = refused(b.build([v]))
    assert kernel_names(fused) == ["elementwise k0", "elementwise k1"]
    assert (
        lines[0]
        == f"elementwise k0 + elementwise k1: {MAX_KERNEL_NODES + 44} nodes together, more than one kernel takes ({MAX_KERNEL_NODES})"
    )


def test_elementwise_outputs_of_two_shapes_make_no_kernel():
    b = GraphBuilder()
    x, v = b.input(t(4, 8)), b.input(t(8))
    s = b.node("sin", [v])  # returned: the union would make a [4,8] and an [8]
    e = b.node("exp", [x])
    kinds, lines, _ = refused(b.build([b.node("mul", [e, s]), e, s]))
    assert kinds == ["outputs"]
    assert lines == [
        "elementwise k0 + elementwise k1: outputs of shapes [4,8], [8]: an elementwise kernel has one domain"
    ]


def test_reductions_of_different_rows_are_apart():
    b = GraphBuilder()
    x = b.input(t(4, 6, 8))
    s1 = b.node("reduce_sum", [x], {"axes": (2,), "keepdim": False})
    s2 = b.node("reduce_max", [s1], {"axes": (1,), "keepdim": True})
    kinds, lines, _ = refused(b.build([b.node("sub", [s1, s2])]))
    assert "reductions" in kinds
    assert ("reduction k0 + reduction k1: different rows: [4,6,8] reduced over axes (2,) and [4,6] reduced over "
            "axes (1,)") in lines  # fmt: skip


def test_a_reduction_takes_no_elementwise_work_of_another_shape():
    b = GraphBuilder()
    x = b.input(t(4, 8))
    s = b.node("reduce_sum", [x], {"axes": (1,), "keepdim": False})
    n = b.node("neg", [b.node("reshape", [s], {"shape": (2, 2)})])
    kinds, lines, fused = refused(b.build([n]))
    assert kinds == ["row outputs"] and kernel_names(fused) == ["reduction k0", "elementwise k1"]
    assert lines == ["reduction k0 + elementwise k1: an output of shape [2,2] is neither the full value [4,8] nor a "
                     "row value [4]"]  # fmt: skip


def test_a_row_value_read_at_another_rows_index_stays_apart():
    # sum over each row of x (a [3] value), then added to y[3,3]: broadcasting reads it by column
    b = GraphBuilder()
    x, y = b.input(t(3, 3)), b.input(t(3, 3))
    r = b.node("reduce_sum", [x], {"axes": (1,), "keepdim": False})
    kinds, lines, _ = refused(b.build([b.node("add", [y, r])]))
    assert kinds == ["row read"]
    assert lines == [f"reduction k0 + elementwise k1: %{r.id}, computed from a reduction, would be read at another "
                     "row's index"]  # fmt: skip


def test_a_merge_that_would_wait_for_itself_names_the_node_between():
    b = GraphBuilder()
    x = b.input(t(4, 4))
    e = b.node("exp", [x])
    m = b.node("matmul", [e, x])
    kinds, lines, _ = refused(b.build([b.node("add", [e, m])]))
    assert kinds == ["cycle"]
    assert lines == [f"elementwise k0 + elementwise k1: a path leaves k0 and comes back through matmul %{m.id}"]


def test_identical_kernels_one_depending_on_the_other_stay_apart():
    b = GraphBuilder()
    lr = b.constant(np.array(0.1, np.float32), t())
    p = b.input(t(4))
    first = b.node("sub", [p, b.node("mul", [b.input(t(4)), lr])])
    flipped = b.node("flip", [first], {"axes": (0,)})
    second = b.node("sub", [flipped, b.node("mul", [b.input(t(4)), lr])])
    kinds, lines, fused = refused(b.build([first, second]))
    assert kinds == ["horizontal"] and kernel_names(fused) == ["elementwise k0", "elementwise k1"]
    assert lines == ["elementwise k0 + elementwise k1: the same body, but k1 depends on k0"]


def _conv(b: GraphBuilder):
    x, w = b.input(t(2, 3, 6, 6)), b.input(t(4, 3, 3, 3))
    return b.node("conv", [x, w], {"stride": (1, 1), "dilation": (1, 1)})


def test_a_convolution_takes_no_reduction_kernel():
    b = GraphBuilder()
    c = _conv(b)
    kinds, lines, _ = refused(b.build([b.node("reduce_sum", [b.node("exp", [c])], {"axes": (3,), "keepdim": False})]),
                              takes_epilogue=lambda node: True)  # fmt: skip
    assert kinds == ["conv reader"]
    assert lines == [f"conv %{c.id} + reduction k0: a conv kernel takes elementwise kernels only"]


def test_a_convolution_whose_result_is_read_elsewhere_keeps_it():
    b = GraphBuilder()
    c = _conv(b)
    kinds, lines, _ = refused(b.build([b.node("tanh", [c]), c]), takes_epilogue=lambda node: True)
    assert kinds == ["conv result"]
    assert lines == [f"conv %{c.id} + elementwise k0: the convolution's result is also read elsewhere (a conv "
                     "kernel keeps it on the stack)"]  # fmt: skip


def test_a_conv_kernel_the_backend_does_not_take_stays_two():
    b = GraphBuilder()
    c = _conv(b)
    graph = b.build([b.node("tanh", [c])])
    kinds, lines, fused = refused(graph, takes_epilogue=lambda node: False)
    assert kinds == ["conv backend"] and kernel_names(fused) == ["elementwise k0"]
    assert lines == [f"conv %{c.id} + elementwise k0: the backend compiles no conv kernel of the two (takes_epilogue)"]
    kinds, lines, fused = refused(graph, takes_epilogue=lambda node: True)  # taken: nothing to say
    assert kinds == [] and lines == [] and kernel_names(fused) == ["conv k0"]


def test_what_a_checks_condition_is_computed_from_stays_out_of_kernels():
    b = GraphBuilder()
    x = b.input(t(4, 5))
    i = b.input(t(4, 1, dtype=int64))
    ok = b.node("lt", [i, b.constant(np.array(5), t(dtype=int64))])
    b.node("check", [ok, i], {"error": "RuntimeError", "message": "index {value} is out of bounds"})
    g = b.node("gather", [x, i], {"axis": 1})
    graph = b.build([b.node("where", [ok, g, b.constant(np.array(0, np.float32), t())])])
    refusals: list = []
    fused = fuse(graph, refusals=refusals)
    assert [r.kind for r in refusals] == ["check"]
    assert summarize(refusals, fused) == [
        f"lt %{ok.id} and 0 other node(s) a check's condition is computed from stay out of kernels: a kernel "
        "would feed a check and read what the check guards"
    ]


def test_a_reduction_that_keeps_the_last_axis_stays_out_of_kernels():
    b = GraphBuilder()
    x = b.input(t(4, 6))
    s = b.node("reduce_sum", [b.node("exp", [x])], {"axes": (0,), "keepdim": False})
    kinds, lines, _ = refused(b.build([s]))
    assert kinds == ["axes"]
    assert lines == [f"reduce_sum %{s.id} stays out of kernels: it reduces axes (0,) of [4,6], and keeps the last "
                     "one (a kernel's row of it would read a column)"]  # fmt: skip


def test_every_kind_of_refusal_has_words():
    # "no domain" and "remap" guard merges that the checks before them already rule out for the graphs
    # fusion meets (a fusable node makes one value that something reads; values that fit the outputs'
    # shapes fit the domain): their words are checked here on made-up refusals
    b = GraphBuilder()
    x = b.input(t(4, 6))
    e, n = b.node("exp", [x]), b.node("neg", [x])
    graph = b.build([e, n])
    details = {"size": (300, 256), "no domain": (1,), "outputs": (((4, 6), (6,)),), "reductions": (((4, 6), (1,)), ((4,), (0,))),
               "row outputs": (((4, 6), (1,)), ((2, 2),)), "remap": (x, (6, 4)), "row read": (x,), "cycle": (x,),
               "far": (256,), "axes": ((0,), (4, 6)), "check": (3,)}  # fmt: skip
    words = {kind: word(Refusal(kind, e, n, details.get(kind, ())), SideNames(graph)) for kind in WORDING}
    assert set(words) == set(WORDING)
    assert words["no domain"] == "exp %1 + neg %2: neg %2 has no single domain (its outputs have several shapes)"
    assert (
        words["remap"] == "exp %1 + neg %2: %0 of shape [4,6] reaches no element of the domain [6,4] by index remapping"
    )
    assert "more than 256 kernels or nodes on each side" in words["far"]


# ----------------------------------------------------------------------------- bounds and moot refusals
def test_the_first_few_of_a_kind_are_worded_and_the_rest_counted():
    b = GraphBuilder()
    v = b.input(t(8))
    for _ in range(3 * MAX_KERNEL_NODES + 1):
        v = b.node("neg", [v])
    kinds, lines, _ = refused(b.build([v]), per_kind=1)
    assert kinds.count("size") == 3
    assert lines[0].startswith("elementwise k0 + elementwise k1: ") and lines[1] == "... and 2 more of this kind (size)"


def test_a_merge_refused_early_and_made_later_is_not_reported(monkeypatch):
    # sub's merge into the slice is refused first (outputs [2] for the sum and [1] for exp); once sub
    # joined the sum's reduction kernel, the slice and exp join it too: one kernel, nothing refused
    from kiln.passes import fusion_groups

    attempts: list = []
    final = fusion_groups.Grouping._final_refusals

    def seen(self, failed):
        attempts.append(list(failed))  # per fusion
        return final(self, attempts[-1])

    monkeypatch.setattr(fusion_groups.Grouping, "_final_refusals", seen)
    b = GraphBuilder()
    d = b.node("sub", [b.input(t(2)), b.input(t(2))])
    e = b.node("exp", [b.node("slice", [d], {"starts": (0,), "stops": (1,), "steps": (1,)})])
    kinds, lines, fused = refused(b.build([e, b.node("reduce_sum", [d], {"axes": (0,), "keepdim": False})]))
    assert [declined[0] for _, _, declined in attempts[0]] == ["outputs"], "the refusal this test is about happened"
    assert kinds == [] and lines == [] and kernel_names(fused) == ["reduction k0"]


def test_a_graph_that_fuses_whole_declines_nothing():
    b = GraphBuilder()
    x = b.input(t(4, 8))
    m = b.node("reduce_max", [x], {"axes": (1,), "keepdim": True})
    e = b.node("exp", [b.node("sub", [x, m])])
    s = b.node("reduce_sum", [e], {"axes": (1,), "keepdim": True})
    kinds, lines, fused = refused(b.build([b.node("div", [e, s])]))  # softmax: one kernel
    assert kinds == [] and lines == [] and kernel_names(fused) == ["reduction k0"]


# ----------------------------------------------------------------------------- explain, dump_dir, cache
def _exp_matmul(x):
    e = x.exp()
    return e + e @ x


def test_explain_shows_what_was_not_fused_and_dump_dir_writes_it(tmp_path):
    compiled = kiln.compile(_exp_matmul, options=kiln.CompileOptions(dump_dir=str(tmp_path)))
    x = kiln.tensor(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    np.testing.assert_allclose(compiled(x).numpy(), _exp_matmul(x).numpy(), rtol=1e-5, atol=1e-5)
    summary = kiln.explain(compiled).summary()
    lines = [line.strip() for line in summary.splitlines() if "not fused:" in line]
    assert len(lines) == 1 and lines[0].startswith("not fused: elementwise k0 + elementwise k1: a path leaves k0 "
                                                   "and comes back through matmul %"), summary  # fmt: skip
    dumped = [p for p in tmp_path.iterdir() if p.name.endswith("-not_fused.txt")]
    assert len(dumped) == 1 and dumped[0].read_text() == lines[0].removeprefix("not fused: ") + "\n"


def test_a_program_from_the_disk_cache_keeps_its_refusals(tmp_path, monkeypatch):
    from kiln.compiler import program_cache
    from kiln.compiler.driver import compile_graph
    from kiln.runtime.cache import DiskCache

    cache = DiskCache(tmp_path / "cache")
    monkeypatch.setattr(program_cache, "disk_cache", lambda: cache)
    b = GraphBuilder()
    x = b.input(t(4, 4))
    e = b.node("exp", [x])
    graph = b.build([b.node("add", [e, b.node("matmul", [e, x])])])
    first = compile_graph(graph, kiln.CompileOptions(backend="llvm"))
    second = compile_graph(graph, kiln.CompileOptions(backend="llvm"))
    assert (first.report.cache, second.report.cache) == ("miss", "hit")
    assert len(first.report.not_fused) == 1 and second.report.not_fused == first.report.not_fused
    assert ("not_fused", first.report.not_fused[0] + "\n") in second.stages
    assert f"not fused: {first.report.not_fused[0]}" in second.report.describe()


@pytest.mark.parametrize("per_kind", [0, 2])
def test_summarize_bounds_each_kind(per_kind):
    b = GraphBuilder()
    v = b.input(t(8))
    for _ in range(2 * MAX_KERNEL_NODES + 1):
        v = b.node("neg", [v])
    refusals: list = []
    fused = fuse(b.build([v]), refusals=refusals)
    lines = summarize(refusals, fused, per_kind)
    sizes = [line for line in lines if "more than one kernel takes" in line]
    assert len(sizes) == min(per_kind, 2)
    assert ("... and 2 more of this kind (size)" in lines) == (per_kind == 0)


def test_horizontal_fusion_reuses_the_units_ancestors_until_a_merge():
    """The ancestor sets are computed once per state of the dependency graph: a bucket whose last round
    merged nothing hands the next bucket the graph as it was (DCGAN: 24 computations -> 17)."""
    from kiln.passes.fusion_emit import _Dependencies, _Unit  # noqa: PLC0415 - the pass's internals

    b = GraphBuilder()
    x = b.input(TensorType((4,), float32))
    first, second = b.node("exp", [x]), b.node("exp", [x])
    total = b.node("add", [first, second])
    graph = b.build([total])
    units = [_Unit(k, node=node) for k, node in enumerate(graph.nodes)]
    deps = _Dependencies(units, {})
    found = deps.ancestors()
    assert deps.ancestors() is found  # nothing merged: the same sets
    bit = deps.bit
    assert found[id(units[2])] == (1 << bit[id(units[0])]) | (1 << bit[id(units[1])])
    merged = _Unit(0)
    deps.merge(units[:2], merged)
    after = deps.ancestors()
    assert after is not found and after[id(units[2])] == 1 << bit[id(merged)] and after[id(merged)] == 0
