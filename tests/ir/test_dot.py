"""Graph.to_dot: the DOT text parsed back (nodes, clusters, edges and their labels) and, where
Graphviz's ``dot`` program is installed, rendered."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import kiln
from kiln.ir.dot import dot_available, render
from kiln.ir.dtypes import float32, int64
from kiln.ir.graph import KERNEL, GraphBuilder
from kiln.ir.types import TensorType

_STRING = r'"(?:[^"\\]|\\.)*"'
_NODE = re.compile(rf"^\s*({_STRING}) \[label=({_STRING})(.*)\];$")
_EDGE = re.compile(rf"^\s*({_STRING}) -> ({_STRING}) \[label=({_STRING})\];$")


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text[1:-1])


def parse_dot(text: str) -> dict:
    """A small reader of the DOT kiln writes: every line is a graph header, a setting, a node, an
    edge, a cluster's opening or closing; anything else fails the test. Returns the nodes (id ->
    label, attributes, enclosing clusters), the edges (source, target, label) and the clusters
    (id -> label)."""
    lines = text.splitlines()
    assert re.match(rf"^digraph {_STRING} {{$", lines[0]) and lines[-1] == "}", text[:200]
    nodes, edges, clusters, stack = {}, [], {}, []
    for line in lines[1:-1]:
        if m := _NODE.match(line):
            ident = _unquote(m.group(1))
            assert ident not in nodes, f"node {ident} declared twice"
            nodes[ident] = (_unquote(m.group(2)), m.group(3), tuple(stack))
        elif m := _EDGE.match(line):
            edges.append((_unquote(m.group(1)), _unquote(m.group(2)), _unquote(m.group(3))))
        elif m := re.match(rf"^\s*subgraph ({_STRING}) {{$", line):
            ident = _unquote(m.group(1))
            assert ident.startswith("cluster"), f"subgraph {ident} is not a cluster"
            stack.append(ident)
            clusters[ident] = None
        elif re.match(r"^\s*}$", line):
            assert stack, "a } closes no cluster"
            stack.pop()
        elif m := re.match(rf"^\s*label=({_STRING});$", line):
            assert stack, "a label outside any cluster"
            clusters[stack[-1]] = _unquote(m.group(1))
        else:
            assert re.match(r"^\s*(rankdir=|node \[|edge \[|style=)", line), f"unexpected DOT line: {line!r}"
    assert not stack, "a cluster is never closed"
    for source, target, _ in edges:
        assert source in nodes and target in nodes, f"edge {source} -> {target} to an undeclared node"
    return {"nodes": nodes, "edges": edges, "clusters": clusters}


def test_a_small_graph_has_one_node_per_op_and_one_edge_per_use():
    b = GraphBuilder()
    x = b.input(TensorType((2, 3), float32))
    i = b.input(TensorType((2,), int64))
    y = b.node("mul", [x, x])
    s = b.node("reduce_sum", [y], {"axes": (1,), "keepdim": False})
    c = b.node("cast", [i], {"dtype": float32})
    out = b.node("add", [s, c])
    graph = b.build([out, y])
    parsed = parse_dot(graph.to_dot(input_labels=["x", "index"], output_labels=["result 0", "result 1"]))
    labels = {ident: label for ident, (label, _, _) in parsed["nodes"].items()}
    assert labels["in0"] == "x\n%0: f32[2,3]" and labels["in1"] == "index\n%1: i64[2]"
    assert labels["out1"] == "result 1\n%2: f32[2,3]"
    ops = sorted(label.split("\n")[0] for ident, label in labels.items() if ident.startswith("n"))
    assert ops == ["add", "cast", "mul", "reduce_sum"]
    # mul reads x twice: two edges; every other use one; one edge per output
    assert len(parsed["edges"]) == 2 + 1 + 1 + 2 + 2
    assert ("in0", "n0", "f32[2,3]") in parsed["edges"] and parsed["edges"].count(("in0", "n0", "f32[2,3]")) == 2
    assert ("n1", "n3", "f32[2]") in parsed["edges"] and ("n2", "n3", "f32[2]") in parsed["edges"]
    assert ("n0", "out1", "f32[2,3]") in parsed["edges"]
    assert parsed["clusters"] == {}


def _fused_graph():
    w = kiln.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))

    def f(x):
        return ((x * 2).tanh() @ w).softmax(-1)

    compiled = kiln.compile(f)
    x = kiln.tensor(np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4))
    for _ in range(2):
        np.testing.assert_allclose(compiled(x).numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)
    return compiled.graph


def test_kernels_are_clusters_holding_their_bodies():
    graph = _fused_graph()
    kernels = [n for n in graph.nodes if n.op == KERNEL]
    assert len(kernels) == 2  # tanh(x * 2) and the softmax
    parsed = parse_dot(graph.to_dot())
    assert len(parsed["clusters"]) == 2
    names = sorted(label.split()[1] for label in parsed["clusters"].values())
    assert names == sorted(n.attrs["name"] for n in kernels)
    for kernel, (cluster, label) in zip(kernels, parsed["clusters"].items(), strict=True):
        inside = [lab.split("\n")[0] for lab, _, within in parsed["nodes"].values() if cluster in within]
        body_ops = [n.op if n.op != "constant" else f"constant %{n.outputs[0].id}" for n in kernel.bodies[0].nodes]
        assert sorted(inside) == sorted(body_ops), (inside, body_ops)
        assert f"({kernel.attrs['kind']})" in label and "test_dot.py:" in label
    matmul = next(i for i, (lab, _, within) in parsed["nodes"].items() if lab.startswith("matmul"))
    assert parsed["nodes"][matmul][2] == ()  # an extern node sits outside the clusters
    into_matmul = sorted(label for _, target, label in parsed["edges"] if target == matmul)
    assert into_matmul == ["f32[4,3]", "f32[5,4]"]  # the tanh kernel's output and the weight
    assert [label for source, target, label in parsed["edges"] if target == "out0"] == ["f32[5,3]"]


def test_collapsed_kernels_are_one_box_each():
    graph = _fused_graph()
    parsed = parse_dot(graph.to_dot(collapse_kernels=True))
    boxes = [lab for lab, attrs, _ in parsed["nodes"].values() if "box3d" in attrs]
    assert len(boxes) == 2 and any("tanh" in lab for lab in boxes) and any("exp" in lab for lab in boxes)
    assert parsed["clusters"] == {}


def test_labels_are_escaped_and_counts_are_checked():
    b = GraphBuilder()
    x = b.input(TensorType((1,), float32))
    text = b.build([x]).to_dot(name='odd "name"', input_labels=['a "quoted"\\label'])
    assert text.startswith('digraph "odd \\"name\\"" {')
    assert parse_dot(text)["nodes"]["in0"][0] == 'a "quoted"\\label\n%0: f32[1]'
    with pytest.raises(ValueError, match="2 input labels given for the graph's 1 inputs"):
        b.build([x]).to_dot(input_labels=["a", "b"])


def test_render_writes_dot_text_and_says_what_pictures_need(tmp_path):
    text = _fused_graph().to_dot()
    assert render(text, tmp_path / "g.dot").read_text() == text
    with pytest.raises(ValueError, match=r"expected a path ending in \.dot"):
        render(text, tmp_path / "g.txt")
    if not dot_available():
        with pytest.raises(RuntimeError, match="graphviz"):
            render(text, tmp_path / "g.svg")


def test_render_svg_with_graphviz(tmp_path):
    if not dot_available():
        if os.environ.get("KILN_REQUIRE_DOT"):  # CI installs Graphviz: there a skip would hide a missing step
            pytest.fail("KILN_REQUIRE_DOT is set but Graphviz's dot or the graphviz package is missing")
        pytest.skip("Graphviz's dot program (or the graphviz package) is not installed")
    path = render(_fused_graph().to_dot(), tmp_path / "g.svg")
    svg = path.read_text()
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg
    assert "matmul" in svg and "kernel k" in svg
