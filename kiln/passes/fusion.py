"""Fusion: group the graph's elementwise, view and reduction nodes into kernel nodes.

``fuse(graph)`` returns an equivalent graph whose nodes are extern nodes (primitives run by
their eager kernel: matmul, gather, random bits, views that extern nodes read...), constants and
kernel nodes (``kiln.ir.graph``), each fused node in exactly one kernel: no work is duplicated.

1. Classify (``fusion_rules``): elementwise, view, trailing-axes reduction, or extern. A node the
   backend does not compile in a kernel (``supports(node)`` False: the LLVM backend and float16)
   is extern, so fusion never forms a kernel that the backend then declines.
2. Vertical fusion (``fusion_groups``): walking the graph in order, each fusable node joins the kernel of each of
   its fusable producers in turn when the union is still a legal kernel (``kiln.ir.analysis``: one
   domain for an elementwise kernel; reductions of the same trailing axes of one shape, with
   full and row values, for a reduction kernel) and no path leaves the union and comes back
   (which would make the kernel depend on itself). Chains fuse; elementwise work before and
   after an extern node fuses around it (matmul -> add bias -> relu is matmul + one kernel);
   softmax, log_softmax, layer_norm and a sum of squares become one reduction kernel each.
   Values read outside a kernel, and graph outputs, are its outputs.
3. What is left of views alone (no elementwise or reduction work) stays extern; every other
   group, a single elementwise node included, is a kernel.
4. Horizontal fusion (``fusion_emit``): mutually independent elementwise kernels whose bodies
   are structurally identical (same ops, attributes, dtypes and constants; any shapes) -- the
   per-parameter updates of an optimizer step -- become one horizontal kernel.

The result is ordered topologically (ties broken by the position of each unit's first node in
the input graph), so the pass is deterministic. It is not in ``DEFAULT_PIPELINE``: the compile
driver runs it for a backend that runs kernels, with that backend's ``supports``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.graph import Graph, Node
from .eliminate_dead_code import eliminate_dead_code
from .fusion_emit import emit
from .fusion_groups import Grouping


def fuse(graph: Graph, supports: Callable[[Node], bool] | None = None) -> Graph:
    """``graph`` with its fusable nodes grouped into kernel nodes (see the module docstring);
    ``supports(node)``: whether the backend compiles ``node`` inside a kernel (None: every node).

    Needs: a verified graph in topological order. Establishes: every elementwise, fusable view
    and trailing-axes reduction node is in exactly one kernel body; the graph verifies; running
    it gives the same results as ``graph``, bit for bit, on the interpreter.
    """
    graph = eliminate_dead_code(graph)  # a kernel makes at least one output that something reads
    if not graph.nodes:
        return graph
    return emit(graph, Grouping(graph, supports).groups())
