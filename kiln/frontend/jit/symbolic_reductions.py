"""Sums across a symbolic batch, split into two sums the LLVM backend compiles over any batch size.

A static program reduces BatchNorm's per-channel sums (``(N, C, H, W)`` over axes ``(0, 2, 3)``)
in one kernel, through a permute to ``(C, N, H, W)`` (``passes/fusion.py``,
``reductions_to_trailing_axes``). Over a symbolic batch ``N`` that permuted value has its symbol
after its first dim, which no generator takes, so each such sum ran on numpy (about half of the
gap between a dynamic and a static CNN step). Here each such sum, and any sum of all of a symbolic
batch's elements (a loss's mean over the batch), becomes

- a sum over the other reduced axes, ``(N, C, H, W) -> (N, C)``: trailing axes, a reduction kernel
  over the symbolic leading rows (``codegen/llvm/symbolic.py``), then
- a sum over the leading axis, ``(N, C) -> (C,)`` (a ``(N,)`` vector is summed as ``(N, 1)``): a sum
  of rows over the symbolic leading size (``codegen/llvm/leading_sums.py``),

reshaped back to the shape the sum had. The same elements are added, per sample first: the rounding
differs from the static program's by the order of the additions only.
"""

from __future__ import annotations

import itertools

from ...ir.graph import Graph, Node, Value
from ...ir.types import Sym, TensorType, is_static

__all__ = ["split_batch_sums"]


def split_batch_sums(graph: Graph) -> Graph:
    """``graph`` with each float ``reduce_sum`` across a symbolic leading (batch) axis whose other
    sizes are static split in two (see the module docstring). Needs: a symbolic graph, before
    fusion. Establishes: the same values (up to the order of additions)."""
    ids = itertools.count(max((v.id for v in graph.values()), default=-1) + 1)
    nodes: list[Node] = []
    for node in graph.nodes:
        nodes += _split(node, ids) if _across_batch(node) else [node]
    if len(nodes) == len(graph.nodes):
        return graph
    return Graph(graph.inputs, tuple(nodes), graph.outputs, graph.constants)


def _across_batch(node: Node) -> bool:
    """Whether ``node`` sums a float input whose only symbolic size leads it, over that axis and
    others or over it alone when it is the only one (a sum the generators do not take as it is)."""
    if node.op != "reduce_sum" or not node.inputs:
        return False
    (x,) = node.inputs
    shape, axes = x.type.shape, tuple(node.attrs["axes"])
    if not shape or not isinstance(shape[0], Sym) or not is_static(shape[1:]) or 0 not in axes:
        return False
    if x.type.dtype.name not in ("float32", "float64"):
        return False
    return len(axes) > 1 or x.type.ndim == 1


def _split(node: Node, ids) -> list[Node]:
    (x,) = node.inputs
    shape, axes = x.type.shape, tuple(sorted(node.attrs["axes"]))

    def value(dims) -> Value:
        return Value(next(ids), TensorType(tuple(dims), x.type.dtype, x.type.device))

    nodes = []
    rows = x
    if x.type.ndim == 1:  # a vector: its elements as rows of one
        rows = value((shape[0], 1))
        nodes.append(Node("reshape", (x,), {"shape": rows.type.shape}, (rows,), node.loc))
    elif len(axes) > 1:  # the other reduced axes first: a sum per sample
        kept = [d for k, d in enumerate(shape) if k not in axes[1:]]
        rows = value(kept)
        nodes.append(Node("reduce_sum", (x,), {**node.attrs, "axes": axes[1:], "keepdim": False}, (rows,), node.loc))
    attrs = {**node.attrs, "axes": (0,), "keepdim": False}
    if rows.type.shape[1:] == node.output.type.shape:
        return [*nodes, Node("reduce_sum", (rows,), attrs, node.outputs, node.loc)]
    summed = value(rows.type.shape[1:])
    nodes.append(Node("reduce_sum", (rows,), attrs, (summed,), node.loc))
    nodes.append(Node("reshape", (summed,), {"shape": node.output.type.shape}, node.outputs, node.loc))
    return nodes
