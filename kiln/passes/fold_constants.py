"""Constant folding: evaluate at compile time what depends on constants alone."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from ..ir.graph import CONSTANT, Graph, Node, Value
from ..ir.primitives import PRIMITIVES, Kind
from ..ir.types import TensorType
from .eliminate_common_subexpressions import constant_key, substitute, used_constants

#: A folded result may hold this many elements, or as many as its inputs together, whichever is
#: more: an ``expand`` of a scalar to a big shape stays symbolic instead of becoming a big array.
FOLD_LIMIT = 4096


def fold_constants(graph: Graph) -> Graph:
    """Replace each node whose inputs are all constants by a constant holding its eager result,
    and merge constant nodes holding identical arrays (dtype, shape and bytes); a large constant that
    is one value throughout becomes that value expanded (``_Spread``).

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
    spread = _Spread(graph)
    for node in graph.nodes:
        node = substitute(node, replace)
        one = spread.one_element(node, constants)
        if one is not None:  # a fill: its one element, expanded (the expand folds no further)
            one_node, node = one
            key = constant_key(constants[one_node.attrs["name"]], one_node)
            if key not in first:
                first[key] = one_node.output
                arrays[one_node.output] = constants[one_node.attrs["name"]]
                nodes.append(one_node)
            node = substitute(node, {one_node.output: first[key]})
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


class _Spread:
    """Turns a constant of more than ``FOLD_LIMIT`` elements that are all one value (bit for bit) into
    ``expand`` of a constant of that one element, as a trace over a dynamic size records a fill.

    A trace records ``torch.ones_like(x)`` or ``torch.full(...)`` as a constant holding every element:
    the program then read them per call, the disk cache stored them and folding and CSE hashed them
    (GAT's ``-9e16 * ones_like(e)`` over (8, 1700, 1700) attention scores: a 92 MB constant, a 100 MB
    cache entry). Expanded, the fill is an index map that kernels fuse. A constant the graph returns
    stays (a program's output must be memory of its own).
    """

    def __init__(self, graph: Graph) -> None:
        self.outputs = set(graph.outputs)
        self.last_id = max((v.id for v in (*graph.inputs, *(o for n in graph.nodes for o in n.outputs))), default=0)

    def one_element(self, node: Node, constants: dict[str, np.ndarray]) -> tuple[Node, Node] | None:
        """The new one-element constant node and the ``expand`` node replacing ``node``, or None."""
        if node.op != CONSTANT or node.output in self.outputs:
            return None
        array = constants[node.attrs["name"]]
        if array.size <= FOLD_LIMIT or array.dtype.kind not in "biuf":
            return None
        bits = array.reshape(-1).view(f"u{array.dtype.itemsize}") if array.dtype.kind == "f" else array.reshape(-1)
        if not bool(np.all(bits == bits[0])):
            return None
        out = node.output.type
        self.last_id += 1
        one_type = TensorType((1,) * out.ndim, out.dtype, out.device)
        name = _fresh_name(constants)
        constants[name] = np.ascontiguousarray(array.reshape(-1)[:1].reshape((1,) * out.ndim))
        one = Node(CONSTANT, (), {"name": name}, (Value(self.last_id, one_type),), node.loc)
        return one, Node("expand", (one.output,), {"shape": out.shape}, node.outputs, node.loc)


def _fresh_name(constants: dict[str, np.ndarray]) -> str:
    index = len(constants)
    while f"c{index}" in constants:
        index += 1
    return f"c{index}"
