"""Constant folding: evaluate at compile time what depends on constants alone."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from ..ir.graph import CONSTANT, Graph, Node, Value
from ..ir.primitives import PRIMITIVES, Kind
from .eliminate_common_subexpressions import constant_key, substitute, used_constants

#: A folded result may hold this many elements, or as many as its inputs together, whichever is
#: more: an ``expand`` of a scalar to a big shape stays symbolic instead of becoming a big array.
FOLD_LIMIT = 4096


def fold_constants(graph: Graph) -> Graph:
    """Replace each node whose inputs are all constants by a constant holding its eager result,
    and merge constant nodes holding identical arrays (dtype, shape and bytes).

    Needs: a graph in topological order whose constant nodes name arrays of ``graph.constants``.
    Establishes: no foldable node reads only constants. Random nodes are never folded (their
    state input is what changes per call), nor are nodes whose result would be large from small
    inputs, nor nodes whose kernel fails (the error belongs to run time, with its source line).
    So a ``check`` of constants folds away when it holds and stays, to raise, when it fails.
    The constant nodes that folding leaves unused stay for ``eliminate_dead_code``.
    """
    constants = dict(graph.constants)
    arrays: dict[Value, np.ndarray] = {}  # the array of each constant value seen so far
    first: dict[Hashable, Value] = {}
    replace: dict[Value, Value] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        node = substitute(node, replace)
        array = constants[node.attrs["name"]] if node.op == CONSTANT else _evaluate(node, arrays)
        if array is None:
            nodes.append(node)
            continue
        key = constant_key(array, node)
        if key in first:
            replace[node.output] = first[key]
            continue
        if node.op != CONSTANT:
            name = _fresh_name(constants)
            constants[name] = array
            # The constant defines the folded node's own output value: its uses need no rewrite.
            node = Node(CONSTANT, (), {"name": name}, node.outputs, node.loc)
        first[key] = node.output
        arrays[node.output] = array
        nodes.append(node)
    outputs = tuple(replace.get(v, v) for v in graph.outputs)
    return Graph(graph.inputs, tuple(nodes), outputs, used_constants(nodes, constants))


def _evaluate(node: Node, arrays: dict[Value, np.ndarray]) -> np.ndarray | None:
    """The eager result of ``node`` if every input is a known constant and folding is worth it."""
    if not node.inputs or len(node.outputs) != 1 or any(v not in arrays for v in node.inputs):
        return None
    prim = PRIMITIVES.get(node.op)
    if prim is None:  # a loop or kernel node: a program of its own, never folded
        return None
    out = node.output.type
    if (
        prim.kind in (Kind.RANDOM, Kind.COLLECTIVE)
        or not out.is_static
        or out.numel > max(FOLD_LIMIT, sum(v.type.numel for v in node.inputs))
    ):
        return None
    try:
        with np.errstate(all="ignore"):  # inf and nan are values, as at run time
            result = np.asarray(prim.eager(np, *(arrays[v] for v in node.inputs), **node.attrs))
    except Exception:  # noqa: BLE001 - a failing kernel stays in the graph and fails at run time
        return None
    if result.shape != out.shape or result.dtype != out.dtype.np:
        return None  # the kernel disagrees with the type rule: leave it to the verifier and the run
    if not result.flags.owndata or not result.flags.c_contiguous:
        result = np.array(result, order="C", copy=True)  # views (of inputs, or broadcasts) become arrays
    return result


def _fresh_name(constants: dict[str, np.ndarray]) -> str:
    index = len(constants)
    while f"c{index}" in constants:
        index += 1
    return f"c{index}"
