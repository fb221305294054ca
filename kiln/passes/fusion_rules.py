"""The rules of fusion: which nodes may be fused, and whether a set of nodes makes a legal kernel.

``classify`` sorts each node of a graph into one of:

- ``ELEMENTWISE``: a UNARY/BINARY/TERNARY/CAST primitive;
- ``VIEW``: ``reshape``/``expand``/``permute``/``slice`` that only fused nodes read (inside a
  kernel it is index remapping); a view that an extern node or the graph's outputs read stays
  extern, since numpy views are free and kernels read strided inputs anyway;
- ``REDUCE``: ``reduce_sum``/``max``/``min``/``prod`` of one or more *trailing* axes;
- ``EXTERN``: everything else (matmul, gather/scatter/take/index_put, random bits, cumsum,
  pad, concatenate, flip, copy, unfold/fold, argmax/argmin, reductions of other axes), every
  node the backend does not compile in a kernel (``supports``; the LLVM backend: nothing
  touching float16), and constants.

``kernel_kind`` checks a candidate kernel (a set of fusable nodes) against the contract of
``kiln.ir.graph``'s kernel nodes and returns its kind, or None when it is not a legal kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from ..ir.graph import BODY_REDUCE_OPS, BODY_VIEW_OPS, CONSTANT, Node, Value
from ..ir.primitives import ELEMENTWISE as ELEMENTWISE_KINDS
from ..ir.primitives import PRIMITIVES

ELEMENTWISE, VIEW, REDUCE, EXTERN = "elementwise", "view", "reduce", "extern"

#: The most nodes one kernel takes. LLVM's optimizer takes time that grows faster than the size of
#: the function it optimizes (measured on a chain of fused elementwise ops, per op: 1.4 ms at 100
#: ops, 2.6 ms at 800, 9 ms at 3,000, 40 ms at 10,000), so a longer chain is cut into kernels of
#: this size: its compile time stays linear, for one extra pass over memory per 256 nodes.
MAX_KERNEL_NODES = 256


def trailing_axes(axes: Sequence[int], ndim: int) -> bool:
    """Whether ``axes`` (sorted) are the last ``len(axes) >= 1`` axes of an ``ndim``-d input."""
    k = len(axes)
    return k > 0 and tuple(axes) == tuple(range(ndim - k, ndim))


def _base_class(node: Node, supports: Callable[[Node], bool] | None) -> str:
    if node.op == CONSTANT or node.op not in PRIMITIVES or (supports is not None and not supports(node)):
        return EXTERN
    prim = PRIMITIVES[node.op]
    if prim.kind in ELEMENTWISE_KINDS:
        return ELEMENTWISE
    if node.op in BODY_VIEW_OPS:
        return VIEW
    if node.op in BODY_REDUCE_OPS and trailing_axes(node.attrs["axes"], node.inputs[0].type.ndim):
        return REDUCE
    return EXTERN


def classify(
    nodes: Sequence[Node],
    users: Mapping[Value, list[Node]],
    outputs: Collection[Value],
    supports: Callable[[Node], bool] | None = None,
) -> dict[Node, str]:
    """Each node's class (see the module docstring); ``supports(node)`` is False for the nodes the
    backend does not compile in a kernel (None: every node it could). A view is fusable only if
    every node that reads it is fusable (looked at from the last node back, so chains of views agree)."""
    classes = {node: _base_class(node, supports) for node in nodes}
    for node in reversed(nodes):
        if classes[node] != VIEW:
            continue
        out = node.outputs[0]
        if out in outputs or any(classes[u] == EXTERN for u in users.get(out, ())):
            classes[node] = EXTERN
    return classes


def broadcasts_to(shape: tuple[int, ...], domain: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to exactly ``domain`` (numpy's right-aligned rule)."""
    if len(shape) > len(domain):
        return False
    offset = len(domain) - len(shape)
    return all(d == 1 or d == domain[offset + i] for i, d in enumerate(shape))


def kernel_kind(
    members: Sequence[Node],
    inside: Callable[[Node], bool],
    users: Mapping[Value, list[Node]],
    graph_outputs: Collection[Value],
) -> str | None:
    """``"elementwise"`` or ``"reduction"`` if ``members`` (``inside(node)`` tells membership) make
    a legal kernel, else None. The kernel's outputs are the values that a node outside it or the
    graph's outputs read; every other value must fit the domain (see ``kiln.ir.graph``)."""
    defined = [v for node in members for v in node.outputs]
    outputs = [v for v in defined if v in graph_outputs or not all(inside(u) for u in users.get(v, ()))]
    reduces = [node for node in members if node.op in BODY_REDUCE_OPS]
    space = kernel_space(reduce_signature(reduces), {v.type.shape for v in outputs})
    if space is None:
        return None
    values = defined[::-1]  # readers before what they read: the order the remapping check needs
    seen = set(defined)
    for node in members:
        for v in node.inputs:
            if v not in seen:
                seen.add(v)
                values.append(v)
    misfits = [v for v in values if not fits(v, space)]
    if not remaps(misfits, inside, users, set(outputs)):
        return None
    return "reduction" if reduces else ELEMENTWISE


#: A kernel's iteration space: its domain and, for a reduction kernel, the shapes of its row values.
Space = tuple[tuple[int, ...], frozenset]
#: A reduction kernel's reductions: the shape they reduce and their axes (None: no reduction).
ReduceSignature = tuple[tuple[int, ...], tuple[int, ...]] | None


def reduce_signature(reduces: Sequence[Node]) -> ReduceSignature | bool:
    """The common (shape, axes) of ``reduces``; None when there are none, False when they differ."""
    if not reduces:
        return None
    signatures = {(n.inputs[0].type.shape, tuple(n.attrs["axes"])) for n in reduces}
    return signatures.pop() if len(signatures) == 1 else False


def kernel_space(signature: ReduceSignature | bool, output_shapes: Collection[tuple[int, ...]]) -> Space | None:
    """The space of a kernel whose reductions have ``signature`` and whose outputs have these shapes,
    or None when they make no kernel (no outputs, outputs of different shapes, mixed reductions)."""
    if isinstance(signature, bool) or not output_shapes:  # False: reductions that differ
        return None
    if signature is None:
        if len(output_shapes) != 1:
            return None
        return next(iter(output_shapes)), frozenset()
    domain, axes = signature
    outer = domain[: len(domain) - len(axes)]
    rows = frozenset(outer + (1,) * j for j in range(len(axes) + 1))
    if any(shape != domain and shape not in rows for shape in output_shapes):
        return None
    return domain, rows


def fits(v: Value, space: Space) -> bool:
    """Whether ``v`` is read at the domain element's own index (broadcast) or is a row value."""
    return v.type.shape in space[1] or broadcasts_to(v.type.shape, space[0])


def remaps(
    misfits: Sequence[Value],
    inside: Callable[[Node], bool],
    users: Mapping[Value, list[Node]],
    outputs: Collection[Value],
) -> bool:
    """Whether every value of ``misfits`` (readers before what they read) that is not an output
    reaches the domain by index remapping: every reader inside is a view, or an elementwise node
    (the value broadcasting to its result) whose result does."""
    remapped: set[Value] = set()
    for v in misfits:
        if v in outputs:
            continue
        readers = [u for u in users.get(v, ()) if inside(u)]
        if readers and all(_remaps(u, v, remapped) for u in readers):
            remapped.add(v)
        else:
            return False
    return True


def _remaps(reader: Node, v: Value, remapped: set[Value]) -> bool:
    if reader.op in BODY_VIEW_OPS:
        return True
    out = reader.outputs[0]
    return reader.op not in BODY_REDUCE_OPS and out in remapped and broadcasts_to(v.type.shape, out.type.shape)
