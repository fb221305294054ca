"""Graphviz pictures of graphs: DOT text written by kiln (no dependency), rendered when Graphviz is there.

``graph_to_dot(graph)`` (also ``Graph.to_dot()``) draws every node as a box and every use of a value
as an edge labelled with the value's type (``f32[16,32]``); a fused kernel is a cluster holding its
bodies' nodes, so the picture shows what was fused; constants are small grey notes. Graph inputs
and outputs are ellipses, labelled by ``input_labels``/``output_labels`` when the caller knows
their kinds (an argument, a parameter, a captured tensor, a write-back).

``dot_statements(graph, prefix)`` gives the same drawing as statements to place inside a larger
``digraph`` (``kiln.explain(...).to_dot()`` draws each specialization as a cluster of its own).
``render(dot_text, path)`` writes an SVG, PNG or PDF through the ``graphviz`` package (the ``draw``
extra) and the ``dot`` executable; ``.dot`` paths get the text itself.

>>> from kiln.ir.graph import GraphBuilder
>>> from kiln.ir.types import TensorType
>>> from kiln.ir.dtypes import float32
>>> b = GraphBuilder()
>>> x = b.input(TensorType((2,), float32))
>>> print(b.build([b.node("exp", [x])]).to_dot(), end="")
digraph "graph" {
  rankdir=TB;
  node [fontname="Helvetica", fontsize=10];
  edge [fontname="Helvetica", fontsize=9];
  "in0" [label="input 0\\n%0: f32[2]", shape=ellipse, style=filled, fillcolor="#dbeafe"];
  "n0" [label="exp\\n%1", shape=box, style="rounded,filled", fillcolor="#f3f4f6"];
  "out0" [label="output 0\\n%1: f32[2]", shape=ellipse, style=filled, fillcolor="#dcfce7"];
  "in0" -> "n0" [label="f32[2]"];
  "n0" -> "out0" [label="f32[2]"];
}
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from .graph import CONSTANT, KERNEL, Graph, Node, Value, body_inputs_outputs
from .printer import format_type

INPUT_COLOR, OUTPUT_COLOR, NODE_COLOR = "#dbeafe", "#dcfce7", "#f3f4f6"
KERNEL_COLORS = {"elementwise": "#fef3c7", "reduction": "#fde68a", "horizontal": "#fed7aa", "conv": "#e9d5ff"}
BREAK_COLOR = "#fecaca"
RENDERED_FORMATS = ("svg", "png", "pdf")


def quote(text: str) -> str:
    """A DOT string literal (double quotes; newlines become DOT's centred line breaks)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _type(value: Value) -> str:
    return format_type(value.type)


def _location(node: Node) -> str:
    if node.loc is None:
        return ""
    return f"\n{os.path.basename(node.loc.filename)}:{node.loc.line}"


class _Drawing:
    """Collects one graph's statements: ``ports`` maps each value to the DOT node that makes it."""

    def __init__(self, prefix: str, collapse_kernels: bool) -> None:
        self.prefix, self.collapse = prefix, collapse_kernels
        self.lines: list[str] = []
        self.edges: list[str] = []
        self.clusters: set[str] = set()
        self.counter = 0

    def new_id(self, kind: str) -> str:
        self.counter += 1
        return f"{self.prefix}{kind}{self.counter - 1}"

    def box(self, ident: str, label: str, indent: str, **attrs: str) -> None:
        extra = "".join(f", {k}={v}" for k, v in attrs.items())
        self.lines.append(f"{indent}{quote(ident)} [label={quote(label)}{extra}];")

    def edge(self, source: str, target: str, value: Value) -> None:
        self.edges.append(f"  {quote(source)} -> {quote(target)} [label={quote(_type(value))}];")

    def nodes(self, graph: Graph, ports: dict[Value, str], indent: str) -> None:
        """Draw ``graph``'s nodes; ``ports`` holds where its inputs come from and gains its values."""
        for node in graph.nodes:
            if node.op == KERNEL and not self.collapse:
                self.kernel(node, ports, indent)
                continue
            ident = self.new_id("n")
            if node.op == CONSTANT:
                self.box(ident, f"constant %{node.outputs[0].id}", indent, shape="note", fontsize="8",
                         style="filled", fillcolor=quote("#e5e7eb"))  # fmt: skip
            elif node.op == KERNEL:
                ops = ", ".join(n.op for body in node.bodies for n in body.nodes if n.op != CONSTANT)
                label = f"kernel {node.attrs.get('name', '')} ({node.attrs.get('kind', '')})\n{_wrap(ops)}"
                self.box(ident, label + _location(node), indent, shape="box3d", style="filled",
                         fillcolor=quote(KERNEL_COLORS.get(node.attrs.get("kind", ""), NODE_COLOR)))  # fmt: skip
            else:
                outs = ", ".join(f"%{v.id}" for v in node.outputs)
                self.box(ident, f"{node.op}\n{outs}{_location(node)}", indent, shape="box",
                         style=quote("rounded,filled"), fillcolor=quote(NODE_COLOR))  # fmt: skip
            for v in node.inputs:
                self.edge(ports[v], ident, v)
            for v in node.outputs:
                ports[v] = ident

    def kernel(self, node: Node, ports: dict[Value, str], indent: str) -> None:
        """A kernel node as a cluster of its bodies' nodes, wired to the outer graph by position."""
        name, kind = node.attrs.get("name", "kernel"), node.attrs.get("kind", "")
        # Graphviz draws a subgraph as a box when its name starts with "cluster"
        cluster = f"cluster_{self.prefix}{name}"
        if cluster in self.clusters:  # kernel names are unique in a graph kiln made; others may repeat them
            cluster = "cluster_" + self.new_id("k")
        self.clusters.add(cluster)
        self.lines.append(f"{indent}subgraph {quote(cluster)} {{")
        inner = indent + "  "
        where = _location(node).strip()
        self.lines.append(f"{inner}label={quote(f'kernel {name} ({kind})' + (f' {where}' if where else ''))};")
        self.lines.append(f'{inner}style="rounded,filled"; fillcolor={quote(KERNEL_COLORS.get(kind, NODE_COLOR))};')
        for body, outer_inputs, outer_outputs in body_inputs_outputs(node):
            body_ports = {b: ports[o] for b, o in zip(body.inputs, outer_inputs, strict=True)}
            self.nodes(body, body_ports, inner)
            for b, o in zip(body.outputs, outer_outputs, strict=True):
                ports[o] = body_ports[b]
        self.lines.append(f"{indent}}}")


def _wrap(text: str, width: int = 40) -> str:
    """Break a long comma-separated list into lines of about ``width`` characters."""
    lines, line = [], ""
    for word in text.split(", "):
        if line and len(line) + len(word) > width:
            lines.append(line + ",")
            line = word
        else:
            line = f"{line}, {word}" if line else word
    return "\n".join([*lines, line])


def dot_statements(graph: Graph, prefix: str = "", *, input_labels: Sequence[str] | None = None,
                   output_labels: Sequence[str] | None = None, collapse_kernels: bool = False) -> list[str]:  # fmt: skip
    """The statements (node, cluster and edge lines, indented by two spaces) that draw ``graph``,
    with DOT identifiers starting with ``prefix`` (so several graphs can share one picture)."""
    drawing = _Drawing(prefix, collapse_kernels)
    ports: dict[Value, str] = {}
    for i, v in enumerate(graph.inputs):
        ident = f"{prefix}in{i}"
        label = input_labels[i] if input_labels is not None else f"input {i}"
        drawing.box(ident, f"{label}\n%{v.id}: {_type(v)}", "  ", shape="ellipse", style="filled",
                    fillcolor=quote(INPUT_COLOR))  # fmt: skip
        ports[v] = ident
    drawing.nodes(graph, ports, "  ")
    for i, v in enumerate(graph.outputs):
        ident = f"{prefix}out{i}"
        label = output_labels[i] if output_labels is not None else f"output {i}"
        drawing.box(ident, f"{label}\n%{v.id}: {_type(v)}", "  ", shape="ellipse", style="filled",
                    fillcolor=quote(OUTPUT_COLOR))  # fmt: skip
        drawing.edge(ports[v], ident, v)
    return drawing.lines + drawing.edges


def digraph(name: str, statements: Sequence[str]) -> str:
    """A whole DOT ``digraph`` around ``statements`` (ends with a newline)."""
    head = [f"digraph {quote(name)} {{", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];',
            '  edge [fontname="Helvetica", fontsize=9];']  # fmt: skip
    return "\n".join([*head, *statements, "}"]) + "\n"


def graph_to_dot(graph: Graph, *, name: str = "graph", input_labels: Sequence[str] | None = None,
                 output_labels: Sequence[str] | None = None, collapse_kernels: bool = False) -> str:  # fmt: skip
    """``graph`` as a Graphviz ``digraph`` (see the module docstring); ``collapse_kernels=True`` draws
    each kernel as one box listing its ops instead of a cluster of its bodies' nodes."""
    for labels, values, what in ((input_labels, graph.inputs, "input"), (output_labels, graph.outputs, "output")):
        if labels is not None and len(labels) != len(values):
            raise ValueError(f"to_dot: {len(labels)} {what} labels given for the graph's {len(values)} {what}s")
    return digraph(name, dot_statements(graph, input_labels=input_labels, output_labels=output_labels,
                                        collapse_kernels=collapse_kernels))  # fmt: skip


def render(dot_text: str, path: str | os.PathLike, format: str | None = None) -> Path:
    """Write ``dot_text`` to ``path``: as text for ``.dot``/``.gv``, else rendered by Graphviz in the
    format the suffix names (``svg``, ``png``, ``pdf``). Rendering needs the ``graphviz`` package
    (``pip install kiln[draw]``) and Graphviz's ``dot`` program (Debian: ``apt install graphviz``)."""
    path = Path(path)
    fmt = (format or path.suffix.lstrip(".")).lower()
    if fmt in ("dot", "gv"):
        path.write_text(dot_text)
        return path
    if fmt not in RENDERED_FORMATS:
        raise ValueError(f"render: cannot write {fmt or 'a file without a suffix'!r}; expected a path ending in "
                         f".dot, .gv, {', '.join('.' + f for f in RENDERED_FORMATS)}")  # fmt: skip
    try:
        import graphviz  # noqa: PLC0415 - optional: the ``draw`` extra
    except ImportError:
        raise RuntimeError(f"render: writing {fmt.upper()} needs the graphviz package (pip install 'kiln[draw]'); "
                           f"write a .dot file instead to get the text") from None  # fmt: skip
    try:
        data = graphviz.Source(dot_text).pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        raise RuntimeError(f"render: writing {fmt.upper()} needs Graphviz's dot program on the PATH (Debian/Ubuntu: "
                           "apt install graphviz; macOS: brew install graphviz); write a .dot file instead") from None  # fmt: skip
    path.write_bytes(data)
    return path


def dot_available() -> bool:
    """Whether ``render`` can make pictures here (the graphviz package and the ``dot`` program)."""
    try:
        import graphviz  # noqa: F401, PLC0415
    except ImportError:
        return False
    return shutil.which("dot") is not None
