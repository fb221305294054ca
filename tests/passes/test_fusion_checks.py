"""The fused graph keeps the checks' order: checks in program order, each before the extern nodes
that read what its condition is computed from (a gather after its index check), even where
fusion moves the kernel computing a condition late (horizontal fusion with a later condition),
and where a kernel both feeds a check and reads the guarded op's result (fusion again, with the
conditions left out of kernels)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.ir.dtypes import float32, int64
from kiln.ir.graph import KERNEL, Graph, GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.types import TensorType
from kiln.ir.verifier import verify
from kiln.passes.fusion import fuse
from kiln.passes.fusion_checks import checks_first, is_check
from tests.passes import assert_same_results

INTERPRETER = kiln.CompileOptions(backend="interpreter")


def _positions(graph: Graph, op: str) -> list[int]:
    return [k for k, node in enumerate(graph.nodes) if node.op == op]


def _messages(graph: Graph) -> list[str]:
    return [node.attrs["message"] for node in graph.nodes if is_check(node)]


def _gather_then_cross_entropy(x, t):
    g = x.gather(1, t[:, None])
    return F.cross_entropy(x, t) + g.sum()


def _cross_entropy_then_scatter_add(x, t):
    loss = F.cross_entropy(x, t)
    s = x.scatter_add(1, t[:, None], x[:, :1])
    return loss + s.sum()


@pytest.mark.parametrize("fn", [_gather_then_cross_entropy, _cross_entropy_then_scatter_add])
def test_checks_run_in_order_and_before_the_ops_they_guard(fn):
    compiled = kiln.compile(fn, options=INTERPRETER)
    compiled(kiln.randn(4, 5), kiln.tensor([0, 1, 2, 3]))
    graph = compiled.graph
    fused = fuse(graph)
    verify(fused)
    assert _messages(fused) == _messages(graph), "the checks keep their program order"
    waits = checks_first(fused, {n for n in fused.nodes if n.op != KERNEL})
    position = {node: k for k, node in enumerate(fused.nodes)}
    guarded = [node for node in waits if not is_check(node)]
    assert {node.op for node in guarded} >= {"gather", "scatter_add" if "scatter" in fn.__name__ else "gather"}
    for node, checks in waits.items():
        assert all(position[c] < position[node] for c in checks), f"{node.op} runs before its check"
    # Before this order existed, the first gather ran before its check: horizontal fusion put the
    # kernel of its condition after the cross-entropy's target kernel.
    first_gather = min(_positions(fused, "gather") + _positions(fused, "scatter_add"))
    assert min(k for k, node in enumerate(fused.nodes) if is_check(node)) < first_gather


def _kernel_feeds_check_and_reads_gather() -> Graph:
    """``ok = i < 5; check(ok); g = gather(x, i); where(ok, g, 0)``: fused plainly, ``lt`` and
    ``where`` share a kernel that the check reads and that reads the gather."""
    b = GraphBuilder()
    x = b.input(TensorType((4, 5), float32))
    i = b.input(TensorType((4, 1), int64))
    ok = b.node("lt", [i, b.constant(np.array(5), TensorType((), int64))])
    b.node("check", [ok, i], {"error": "RuntimeError", "message": "index {value} is out of bounds"})
    g = b.node("gather", [x, i], {"axis": 1})
    zero = b.constant(np.array(0, np.float32), TensorType((), float32))
    return b.build([b.node("where", [ok, g, zero])])


def test_a_kernel_that_feeds_a_check_and_reads_what_it_guards_is_split():
    graph = _kernel_feeds_check_and_reads_gather()
    fused = fuse(graph)
    verify(fused)
    order = [node.op for node in fused.nodes if node.op != "constant"]
    assert order.index("lt") < order.index("check") < order.index("gather"), order
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    assert_same_results(graph, fused, [x, np.array([[0], [4], [2], [1]])])
    with pytest.raises(RuntimeError, match="index 5 is out of bounds"):
        interpret(fused, [x, np.array([[0], [5], [2], [1]])])
