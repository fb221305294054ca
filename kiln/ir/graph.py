"""The IR: ``Graph(inputs, nodes, outputs)`` of ``Node(op, inputs, attrs, outputs)`` over typed ``Value``s.

SSA, flat and typed. A ``Value`` is defined exactly once (as a graph input or a node output) and
carries its ``TensorType``. A ``Node`` applies one primitive of the registry (``op`` is its
name) or is a ``constant`` whose array lives in ``Graph.constants`` under ``attrs["name"]``.
Attributes are the primitive's keyword arguments (hashable plain values: ints, floats, bools,
strings, None, dtypes and tuples of them). Every node may carry the user's source location
(``loc``) so that errors at run time point at the line that made the op.

A ``kernel`` node (``KERNEL``) is what fusion makes: ``attrs = {"name": ..., "kind": "elementwise" |
"reduction" | "horizontal" | "conv" (or any kind of the registry, ``kiln.ir.kernel_kinds``), "bodies":
(Graph, ...)}``. Each body is an ordinary graph with its own
values and constants; the node's inputs and outputs are the bodies' (one body, or for a
horizontal kernel the members' concatenated in order). ``kernel_bodies(node)`` gives the bodies.
The body of a ``conv`` kernel is a convolution and its epilogue: its first node is a ``conv`` of
body inputs 0 and 1, and the rest are elementwise and view nodes that read the convolution's
result as an input (``conv_epilogue``); its outputs have the sample and channel dims of the
convolution's result, and may differ in the others (a pooled output).

A ``loop`` node (``LOOP``) runs one body graph a number of times, carrying values from one iteration
to the next (``kiln.ir.loops`` defines its attributes and semantics). Its body sits in ``attrs["bodies"]``
as a kernel's does, so the text form, the graph files and ``qualified_constants`` treat both alike
(``nested_bodies``).

Graphs are immutable: passes build new ones with a ``GraphBuilder`` rather than editing. Value
identity is object identity; the integer ``id`` only names a value in the text form.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .primitives import FUSIBLE_REDUCE_OPS, VIEW_OPS
from .types import TensorType

#: The op name of constant nodes (no inputs; ``attrs = {"name": key}`` into ``Graph.constants``).
CONSTANT = "constant"
#: The op name of fused kernel nodes (``attrs = {"name", "kind", "bodies"}``; see the module docstring).
KERNEL = "kernel"
#: The op name of loop nodes (``attrs = {"name", "bodies", "trips", ...}``; see ``kiln.ir.loops``).
LOOP = "loop"
#: The ops whose nodes hold graphs in ``attrs["bodies"]``.
NESTING_OPS = frozenset({KERNEL, LOOP})


@dataclass(frozen=True, eq=False)
class Value:
    """One SSA value: defined once, used any number of times. Compared by identity."""

    id: int
    type: TensorType

    def __repr__(self) -> str:
        return f"%{self.id}: {self.type}"


@dataclass(frozen=True)
class SourceLocation:
    """Where in the user's code an op was made: file, line and function name."""

    filename: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        where = f" in {self.function}" if self.function else ""
        return f"{self.filename}:{self.line}{where}"


@dataclass(frozen=True, eq=False)
class Node:
    """``outputs = op(*inputs, **attrs)``. Compared by identity."""

    op: str
    inputs: tuple[Value, ...]
    attrs: Mapping[str, Any]
    outputs: tuple[Value, ...]
    loc: SourceLocation | None = None

    @property
    def bodies(self) -> tuple[Graph, ...]:
        """The bodies of a kernel node (empty for any other node)."""
        return kernel_bodies(self)

    @property
    def output(self) -> Value:
        """The single output (every primitive has one; kernel nodes may have several)."""
        assert len(self.outputs) == 1, f"{self.op} has {len(self.outputs)} outputs"
        return self.outputs[0]

    def attr_key(self) -> tuple:
        """The attributes as a hashable, order-independent key (CSE, caching)."""
        return tuple(sorted((k, _hashable(v)) for k, v in self.attrs.items()))

    def __repr__(self) -> str:
        return f"<Node {self.op} -> {', '.join(f'%{v.id}' for v in self.outputs)}>"


def kernel_bodies(node: Node) -> tuple[Graph, ...]:
    """The bodies of a kernel node, or ``()`` for any other node."""
    if node.op != KERNEL:
        return ()
    return node.attrs.get("bodies", ())


def nested_bodies(node: Node) -> tuple[Graph, ...]:
    """The bodies of a kernel or loop node, or ``()`` for any other node."""
    if node.op not in NESTING_OPS:
        return ()
    return node.attrs.get("bodies", ())


def body_inputs_outputs(node: Node) -> list[tuple[Graph, tuple[Value, ...], tuple[Value, ...]]]:
    """For each body of a kernel node: ``(body, the node's inputs it reads, the node's outputs it makes)``
    (one body takes them all; the members of a horizontal kernel take consecutive slices)."""
    result = []
    i = o = 0
    for body in kernel_bodies(node):
        n, m = len(body.inputs), len(body.outputs)
        result.append((body, node.inputs[i : i + n], node.outputs[o : o + m]))
        i, o = i + n, o + m
    return result


def conv_epilogue(body: Graph) -> tuple[Node, Graph]:
    """The ``conv`` node of a conv kernel's body and its epilogue: the body's other nodes as a graph
    whose first input is the convolution's result, then the body's inputs after the two operands."""
    conv = body.nodes[0]
    return conv, Graph((conv.outputs[0], *body.inputs[2:]), body.nodes[1:], body.outputs, body.constants)


#: Separates a kernel's name, the body's index and a body constant's name in ``qualified_constants``.
QUALIFIER = "/"


def qualified_constants(graph: Graph) -> dict[str, np.ndarray]:
    """Every constant array of ``graph`` and of its kernels' bodies, in one flat table.

    The graph's own constants keep their names; a body's constant ``c0`` of body 1 of kernel
    ``k3`` is ``"k3/1/c0"``. The text form and graph files carry constants this way, and
    ``parse_graph``/``graph_from_json`` read the same table back (``split_constants``).
    """
    table = dict(graph.constants)
    for node in graph.nodes:
        for index, body in enumerate(nested_bodies(node)):
            prefix = f"{node.attrs['name']}{QUALIFIER}{index}{QUALIFIER}"
            table.update((prefix + key, value) for key, value in qualified_constants(body).items())
    return table


def body_constants(table: Mapping[str, np.ndarray], kernel: str, index: int) -> dict[str, np.ndarray]:
    """The entries of a flat table (``qualified_constants``) that belong to body ``index`` of ``kernel``,
    with the qualifying prefix removed."""
    prefix = f"{kernel}{QUALIFIER}{index}{QUALIFIER}"
    return {key[len(prefix) :]: value for key, value in table.items() if key.startswith(prefix)}


#: The view movement ops a kernel body may hold: index remapping, never a copy (those with an index map).
BODY_VIEW_OPS = VIEW_OPS
#: The reductions a reduction kernel's body may hold (those with a combine op).
BODY_REDUCE_OPS = FUSIBLE_REDUCE_OPS


def structure_key(body: Graph) -> tuple:
    """What the members of a horizontal kernel share: the ops, how they connect, the dtypes, the
    attributes other than those of view ops (which name shapes), and the constants' bytes.
    Two bodies that differ only in their shapes have the same key."""
    index: dict[Value, int] = {v: i for i, v in enumerate(body.values())}
    nodes = []
    for node in body.nodes:
        if node.op == CONSTANT:
            array = np.asarray(body.constants.get(str(node.attrs.get("name")), np.zeros(())))
            attrs: Any = (array.dtype.str, array.tobytes())
        elif node.op in BODY_VIEW_OPS:
            attrs = tuple(sorted(node.attrs))
        else:
            attrs = node.attr_key()
        inputs = tuple(index.get(v, -1) for v in node.inputs)
        nodes.append((node.op, inputs, attrs, tuple(v.type.dtype for v in node.outputs)))
    return (
        tuple(v.type.dtype for v in body.inputs),
        tuple(nodes),
        tuple(index.get(v, -1) for v in body.outputs),
    )


def _hashable(value: Any) -> Any:
    # float('nan') != nan would make two equal attribute sets different keys; repr is exact for floats.
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, tuple):
        return tuple(_hashable(v) for v in value)
    return value


@dataclass(frozen=True, eq=False)
class Graph:
    """A whole program: inputs, nodes in topological order, outputs, and constant arrays."""

    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __str__(self) -> str:
        from .printer import print_graph  # noqa: PLC0415 - the printer imports this module

        return print_graph(self)

    def to_dot(self, **options: Any) -> str:
        """This graph as Graphviz DOT text: kernels as clusters, edges labelled with types
        (``kiln.ir.dot.graph_to_dot``'s options: ``name``, ``input_labels``, ``output_labels``,
        ``collapse_kernels``)."""
        from .dot import graph_to_dot  # noqa: PLC0415 - the drawing imports this module

        return graph_to_dot(self, **options)

    def values(self) -> Iterable[Value]:
        """Every value, in definition order: inputs, then each node's outputs."""
        yield from self.inputs
        for node in self.nodes:
            yield from node.outputs

    def producers(self) -> dict[Value, Node]:
        """For each node output, the node that defines it."""
        return {v: node for node in self.nodes for v in node.outputs}

    def uses(self) -> dict[Value, list[Node]]:
        """For each value, the nodes that read it (in order; a node reading twice appears twice)."""
        users: dict[Value, list[Node]] = {v: [] for v in self.values()}
        for node in self.nodes:
            for v in node.inputs:
                users.setdefault(v, []).append(node)
        return users

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts


class GraphBuilder:
    """Builds a graph node by node, numbering values in definition order.

    >>> from kiln.ir.dtypes import float32
    >>> b = GraphBuilder()
    >>> x = b.input(TensorType((2,), float32))
    >>> y = b.node("exp", [x])
    >>> print(b.build([y]), end="")
    graph(%0: f32[2]) {
      %1: f32[2] = exp(%0)
      return (%1)
    }
    """

    def __init__(self) -> None:
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self._next_id = 0

    def value(self, type: TensorType) -> Value:
        v = Value(self._next_id, type)
        self._next_id += 1
        return v

    def input(self, type: TensorType) -> Value:
        v = self.value(type)
        self.inputs.append(v)
        return v

    def node(
        self,
        op: str,
        inputs: Sequence[Value],
        attrs: Mapping[str, Any] | None = None,
        type: TensorType | None = None,
        loc: SourceLocation | None = None,
    ) -> Value:
        """Append ``op(*inputs, **attrs)``; its output type is ``type`` or the registry's rule."""
        attrs = dict(attrs or {})
        if type is None:
            from .primitives import PRIMITIVES  # noqa: PLC0415 - the registry is heavy; graphs alone are not

            type = PRIMITIVES[op].infer(*(v.type for v in inputs), **attrs)
        out = self.value(type)
        self.nodes.append(Node(op, tuple(inputs), attrs, (out,), loc))
        return out

    def constant(self, array: np.ndarray, type: TensorType, loc: SourceLocation | None = None) -> Value:
        """A constant node holding ``array`` (stored in the graph's constant table)."""
        name = f"c{len(self.constants)}"
        while name in self.constants:
            name += "_"
        self.constants[name] = array
        out = self.value(type)
        self.nodes.append(Node(CONSTANT, (), {"name": name}, (out,), loc))
        return out

    def kernel(
        self,
        inputs: Sequence[Value],
        bodies: Sequence[Graph],
        kind: str,
        name: str | None = None,
        loc: SourceLocation | None = None,
    ) -> tuple[Value, ...]:
        """Append a kernel node running ``bodies`` on ``inputs``; its outputs' types are the bodies'.

        ``name`` defaults to ``k<N>`` with N the number of kernels so far; ``loc`` to the first body
        node's location."""
        bodies = tuple(bodies)
        if name is None:
            name = f"k{sum(node.op == KERNEL for node in self.nodes)}"
        if loc is None:
            loc = next((n.loc for n in bodies[0].nodes if n.loc is not None), None) if bodies else None
        outputs = tuple(self.value(v.type) for body in bodies for v in body.outputs)
        attrs = {"name": name, "kind": kind, "bodies": bodies}
        self.nodes.append(Node(KERNEL, tuple(inputs), attrs, outputs, loc))
        return outputs

    def append(self, node: Node) -> None:
        """Append an existing node (its values keep their ids; passes that copy nodes use this)."""
        self.nodes.append(node)
        self._next_id = max(self._next_id, 1 + max((v.id for v in node.outputs), default=-1))

    def build(self, outputs: Sequence[Value]) -> Graph:
        return Graph(tuple(self.inputs), tuple(self.nodes), tuple(outputs), dict(self.constants))
