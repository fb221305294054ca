"""Fusion: group the graph's elementwise, view and reduction nodes into kernel nodes.

``fuse(graph)`` returns an equivalent graph whose nodes are extern nodes (primitives run by
their eager kernel: matmul, gather, random bits, views that extern nodes read...), constants and
kernel nodes (``kiln.ir.graph``), each fused node in exactly one kernel, except the cheap
elementwise work a later kernel computes again rather than read (step 4).

0. Reductions of inner axes that include the last one (BatchNorm's sums over N, H and W of an
   NCHW array) read their input through a ``permute`` that puts the kept axes first, so they are
   trailing-axes reductions and fuse (with what computes their input) like any other; each row
   still reads its elements' innermost run contiguously. A reduction that keeps the last axis (a
   bias gradient's sum over rows) stays extern: a row of it would read one column.
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
4. Recomputation (``fusion_recompute``): a kernel computes again the cheap elementwise values of
   another kernel that it would read (a training step's backward and the forward's activations,
   BatchNorm's deviations), from values it reads anyway or, where every reader computes the value,
   from what its maker read; the maker stops writing what no one reads any more.
5. Horizontal fusion (``fusion_emit``): mutually independent elementwise kernels whose bodies
   are structurally identical (same ops, attributes, dtypes and constants; any shapes) -- the
   per-parameter updates of an optimizer step -- become one horizontal kernel.
6. Checks (``fusion_checks``): the fused graph keeps the checks in their order, and the extern
   nodes they guard (a gather after its index check) after them. In the rare graph where a kernel
   both feeds a check and reads what the check guards, fusion runs again with every node a
   check depends on left out of kernels.
7. Epilogues (``epilogues``), for a backend that takes them: a convolution and the elementwise
   kernels after it that read its results (bias, activation, pooling) become one kernel of kind
   ``conv``.

Each merge that a step declines says why (``fusion_refusals``): ``fuse(..., refusals=[])`` fills
the list with the refusals of the final fusion, which ``kiln.explain`` shows.

The result is ordered topologically (ties broken by the position of each unit's first node in
the input graph), so the pass is deterministic. It is not in ``DEFAULT_PIPELINE``: the compile
driver runs it for a backend that runs kernels, with that backend's ``supports``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from ..ir.graph import BODY_REDUCE_OPS, CONSTANT, Graph, Node, Value
from ..ir.types import TensorType
from .eliminate_dead_code import eliminate_dead_code
from .epilogues import fuse_epilogues
from .fusion_checks import CheckOrderCycle, condition_nodes
from .fusion_emit import emit
from .fusion_groups import Grouping
from .fusion_refusals import Refusal


def fuse(graph: Graph, supports: Callable[[Node], bool] | None = None,
         takes_epilogue: Callable[[Node], bool] | None = None, refusals: list[Refusal] | None = None) -> Graph:  # fmt: skip
    """``graph`` with its fusable nodes grouped into kernel nodes (see the module docstring);
    ``supports(node)``: whether the backend compiles ``node`` inside a kernel (None: every node);
    ``takes_epilogue(node)``: whether it compiles the conv kernel ``node`` (None: it makes none);
    ``refusals``: a list that receives why each declined merge was declined (``fusion_refusals``).

    Needs: a verified graph in topological order. Establishes: every elementwise, fusable view
    and trailing-axes reduction node is in one kernel body (and cheap elementwise ones in the
    bodies that recompute them, ``fusion_recompute``); the graph verifies; running
    it gives the same results as ``graph``, bit for bit, on the interpreter, and raises what
    ``graph`` raises (the checks keep their order and run before the extern nodes they guard).
    """
    graph = eliminate_dead_code(graph)  # a kernel makes at least one output that something reads
    if not graph.nodes:
        return graph
    graph = reductions_to_trailing_axes(graph, supports)
    found: list[Refusal] = []
    try:
        fused = _group_and_emit(graph, supports, found)
    except CheckOrderCycle:
        conditions = condition_nodes(graph)
        kept_out = [node for node in graph.nodes if node in conditions and node.op != CONSTANT]
        found = [Refusal("check", kept_out[0].outputs[0], None, (len(kept_out),))]
        fused = _group_and_emit(
            graph, lambda node: node not in conditions and (supports is None or supports(node)), found
        )
    if takes_epilogue is not None:
        fused = fuse_epilogues(fused, takes_epilogue, found)
    if refusals is not None:
        refusals += found
    return fused


def _group_and_emit(graph: Graph, supports: Callable[[Node], bool] | None, refusals: list[Refusal]) -> Graph:
    grouping = Grouping(graph, supports)
    groups = grouping.groups()
    refusals += grouping.refusals
    return emit(graph, groups, [grouping.space(g) for g in groups], refusals)


def reductions_to_trailing_axes(graph: Graph, supports: Callable[[Node], bool] | None = None) -> Graph:
    """``graph`` with each reduction of inner axes that include the last one (static shapes, one the
    backend compiles) made a reduction of trailing axes: ``reduce(x, axes)`` becomes
    ``reduce(permute(x, kept + axes), trailing axes)``, reshaped back where ``keepdim`` asked for
    the reduced axes. The result is the same reduction of the same elements."""
    ids = itertools.count(max((v.id for v in graph.values()), default=-1) + 1)
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.op in BODY_REDUCE_OPS and _inner_reduction(node) and (supports is None or supports(node)):
            nodes += _trailing(node, ids)
        else:
            nodes.append(node)
    if len(nodes) == len(graph.nodes):
        return graph
    return Graph(graph.inputs, tuple(nodes), graph.outputs, graph.constants)


def _trailing(node: Node, ids: Iterator[int]) -> list[Node]:
    """The nodes that compute reduction ``node`` over trailing axes of a permuted input."""
    (x,) = node.inputs
    axes, keepdim = tuple(node.attrs["axes"]), node.attrs["keepdim"]
    kept = tuple(a for a in range(x.type.ndim) if a not in axes)

    def value(shape) -> Value:
        return Value(next(ids), TensorType(tuple(shape), x.type.dtype, x.type.device))

    permuted = value(x.type.shape[a] for a in kept + axes)
    attrs = {**node.attrs, "axes": tuple(range(len(kept), x.type.ndim)), "keepdim": False}
    reduced = value(x.type.shape[a] for a in kept) if keepdim else node.output
    nodes = [Node("permute", (x,), {"perm": kept + axes}, (permuted,), node.loc),
             Node(node.op, (permuted,), attrs, (reduced,), node.loc)]  # fmt: skip
    if keepdim:
        nodes.append(Node("reshape", (reduced,), {"shape": node.output.type.shape}, node.outputs, node.loc))
    return nodes


def _inner_reduction(node: Node) -> bool:
    """Whether ``node`` reduces its static input over axes that include the last but are not trailing."""
    x = node.inputs[0]
    axes, ndim = tuple(node.attrs["axes"]), x.type.ndim
    trailing = axes == tuple(range(ndim - len(axes), ndim))
    return bool(axes) and not trailing and axes[-1] == ndim - 1 and x.type.is_static
