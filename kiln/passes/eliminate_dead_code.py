"""Dead-code elimination: drop the nodes no graph output depends on."""

from __future__ import annotations

from ..ir.graph import CONSTANT, Graph, Node, Value, nested_bodies
from ..ir.primitives import has_effect


def eliminate_dead_code(graph: Graph) -> Graph:
    """Keep only the nodes some graph output or some node with an effect (a ``check``) depends on
    (transitively), and only the constant arrays the kept constant nodes name. Inputs stay, used
    or not: they are the signature.

    Needs: a graph in topological order. Establishes: every node output is used or is a graph
    output, except the outputs of nodes with an effect (a check raises whether or not its
    output is read, as eager code raises whether or not the checked op's result is used).

    Random nodes are dropped like any other when unused: ``random_bits`` is a pure function of
    its state input (counter-based Philox), and advancing the generator is not a side effect of
    the node but separate arithmetic on the state whose result is a graph output (written back
    after each call). Dropping an unused draw therefore cannot change later draws.
    """
    live: set[Value] = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(v in live for v in node.outputs) or _has_effect(node):
            kept.append(node)
            live.update(node.inputs)
    kept.reverse()
    names = {node.attrs["name"] for node in kept if node.op == CONSTANT}
    if len(kept) == len(graph.nodes) and len(names) == len(graph.constants):
        return graph  # nothing to drop; the same (immutable) graph keeps its interpreter cache
    constants = {name: array for name, array in graph.constants.items() if name in names}
    return Graph(graph.inputs, tuple(kept), graph.outputs, constants)


def _has_effect(node: Node) -> bool:
    """Whether ``node`` must run though nothing reads it: a node with an effect, or a loop whose body
    holds one (a check in a rolled step raises at its trip, read or not)."""
    return has_effect(node.op) or any(_has_effect(n) for body in nested_bodies(node) for n in body.nodes)
