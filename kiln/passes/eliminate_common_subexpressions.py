"""Common-subexpression elimination: compute each distinct expression once."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping

import numpy as np

from ..ir.graph import CONSTANT, Graph, Node, Value
from ..ir.primitives import PRIMITIVES, Kind


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Merge nodes with the same op, the same inputs and equal attributes (and constants holding
    identical arrays): later duplicates are dropped and their uses read the first one.

    Needs: a graph in topological order. Establishes: no two nodes compute the same expression,
    except random nodes, which are never merged (two draws from one state are still two draws
    in the program the user wrote; merging them is the tracer's business, not an optimization).
    A check merges with an earlier check of the same condition value, whatever their messages:
    when the condition fails the earlier one raises first, as in eager code, so the later one can
    never raise (a gather's backward re-checks the forward's index; a loss checks its targets
    before its gather does). The survivor is never dropped (``eliminate_dead_code`` keeps effects).
    """
    first: dict[Hashable, Value] = {}
    replace: dict[Value, Value] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        node = substitute(node, replace)
        key = expression_key(node, graph.constants)
        if key is not None and key in first:
            replace[node.output] = first[key]
            continue
        if key is not None:
            first[key] = node.output
        nodes.append(node)
    if not replace:
        return graph
    outputs = tuple(replace.get(v, v) for v in graph.outputs)
    return Graph(graph.inputs, tuple(nodes), outputs, used_constants(nodes, graph.constants))


def expression_key(node: Node, constants: Mapping[str, np.ndarray]) -> Hashable | None:
    """What makes two nodes interchangeable, or None for a node never merged (random, or not
    exactly one output). Values are compared by identity, attributes by ``Node.attr_key``."""
    if len(node.outputs) != 1:
        return None
    if node.op == CONSTANT:
        return constant_key(constants[node.attrs["name"]], node)
    prim = PRIMITIVES.get(node.op)
    if prim is None:  # a loop or kernel node: its body is a program of its own, never merged
        return None
    if prim.kind in (Kind.RANDOM, Kind.COLLECTIVE):  # each collective is a meeting the other processes wait for
        return None
    if prim.kind is Kind.CHECK:
        return (node.op, node.inputs[0])  # the condition alone: see eliminate_common_subexpressions
    return (node.op, node.inputs, node.attr_key(), node.output.type)


def constant_key(array: np.ndarray, node: Node) -> Hashable:
    """Equal for constants whose arrays are identical bit for bit (dtype, shape and bytes: so
    0.0 and -0.0 differ, and nan equals a nan with the same bits) and whose types agree."""
    array = np.asarray(array)
    return (CONSTANT, array.dtype.str, array.shape, array.tobytes(), node.output.type)


def used_constants(nodes: list[Node], constants: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The entries of ``constants`` that some constant node of ``nodes`` names."""
    names = {node.attrs["name"] for node in nodes if node.op == CONSTANT}
    return {name: array for name, array in constants.items() if name in names}


def substitute(node: Node, replace: Mapping[Value, Value]) -> Node:
    """``node`` reading ``replace[v]`` for each input ``v`` that ``replace`` maps (itself if none)."""
    if not replace or not any(v in replace for v in node.inputs):
        return node
    return dataclasses.replace(node, inputs=tuple(replace.get(v, v) for v in node.inputs))
