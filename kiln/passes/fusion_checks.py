"""The order a graph's checks impose on the fused graph.

A check has no data edge to the op it guards: ``x.gather(1, i)`` records ``check(0 <= i < n)``
and then ``gather(x, i)``, both reading ``i``. Eagerly the check raises before the gather runs;
in the fused graph the gather must still run after the check, or an out-of-range index reaches
the gather's kernel (numpy's ``IndexError`` instead of kiln's message, or a read outside memory
in compiled code). Fusion orders units by data edges only, so these edges are added:

- the checks keep their program order (the first failing check is the one eager raises);
- an extern node (one that runs alone: gather, scatter_add, take, index_put...) that comes after
  a check in the graph and reads a value the check's condition is computed from runs after the
  check. The condition's values are those reached back from the check's inputs through nodes that
  a kernel body may hold (elementwise, views, reductions), up to and including the values of
  extern nodes and graph inputs; constants guard nothing.

Kernels need no such edge: what they compute from a bad index is never out of bounds (their
reads are index maps of static shapes) and is dropped when the check raises.
"""

from __future__ import annotations

from ..ir.analysis import body_role
from ..ir.graph import CONSTANT, Graph, Node, Value
from ..ir.primitives import PRIMITIVES, Kind


class CheckOrderCycle(Exception):
    """The fused units cannot keep the checks' order: a kernel computes both a check's condition
    and something made from a value the check guards (``fuse`` then fuses again, leaving every
    check's condition out of kernels)."""


def is_check(node: Node) -> bool:
    prim = PRIMITIVES.get(node.op)
    return prim is not None and prim.kind is Kind.CHECK


def checks_first(graph: Graph, extern: set[Node]) -> dict[Node, set[Node]]:
    """For each extern node of ``graph`` (``extern``: the nodes that are not in a kernel) that must
    wait for checks (see the module docstring): the checks it waits for.

    >>> from kiln.ir.graph import GraphBuilder
    >>> from kiln.ir.types import TensorType
    >>> from kiln.ir import dtypes as dt
    >>> b = GraphBuilder()
    >>> x, i = b.input(TensorType((4, 5), dt.float32)), b.input(TensorType((4, 1), dt.int64))
    >>> ok = b.node("lt", [i, b.constant(__import__("numpy").array(5), TensorType((), dt.int64))])
    >>> _ = b.node("check", [ok, i], {"error": "RuntimeError", "message": "bad {value}"})
    >>> g = b.build([b.node("gather", [x, i], {"axis": 1})])
    >>> gather, check = g.nodes[-1], g.nodes[-2]
    >>> checks_first(g, {gather, check}) == {gather: {check}}
    True
    """
    producer: dict[Value, Node] = {v: node for node in graph.nodes for v in node.outputs}
    guard: dict[Value, Node] = {}  # value -> the last check so far whose condition reads it
    waits: dict[Node, set[Node]] = {}
    previous: Node | None = None
    for node in graph.nodes:
        if is_check(node):
            if previous is not None:
                waits[node] = {previous}
            for v in _condition_values(node, producer):
                guard[v] = node
            previous = node
        elif node in extern:
            first = {guard[v] for v in node.inputs if v in guard}
            if first:
                waits[node] = first
    return waits


def _condition_values(check: Node, producer: dict[Value, Node]) -> set[Value]:
    """The values ``check``'s condition is computed from (see the module docstring)."""
    seen: set[Value] = set()
    stack = list(check.inputs)
    while stack:
        v = stack.pop()
        node = producer.get(v)
        if v in seen or (node is not None and node.op == CONSTANT):
            continue
        seen.add(v)
        if node is not None and body_role(node.op) is not None:
            stack.extend(node.inputs)
    return seen


def condition_nodes(graph: Graph) -> set[Node]:
    """Every node that a check of ``graph`` depends on, directly or not: left out of kernels, they
    keep every check's ancestors extern, and then the checks' order makes no cycle."""
    producer: dict[Value, Node] = {v: node for node in graph.nodes for v in node.outputs}
    found: set[Node] = set()
    stack = [v for node in graph.nodes if is_check(node) for v in node.inputs]
    while stack:
        node = producer.get(stack.pop())
        if node is not None and node not in found:
            found.add(node)
            stack.extend(node.inputs)
    return found
