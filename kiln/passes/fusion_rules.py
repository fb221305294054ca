"""The rules of fusion: which nodes may be fused. Whether a set of them makes a legal kernel is
``kiln.ir.analysis``'s (the verifier checks kernel bodies by the same rules).

``classify`` sorts each node of a graph into one of:

- ``ELEMENTWISE``: a UNARY/BINARY/TERNARY/CAST primitive;
- ``VIEW``: ``reshape``/``expand``/``permute``/``slice`` that only fused nodes read (inside a
  kernel it is index remapping); a view that an extern node or the graph's outputs read stays
  extern, since numpy views are free and kernels read strided inputs anyway, and so does a
  ``slice`` that would make the kernels of an unrolled loop's steps differ by its start
  (``_hoist_slices_of_extern_values``), and one that starts at a symbolic offset (``y[:, -1]`` of a
  dynamic length: a kernel's index offsets are whole numbers);
- ``REDUCE``: ``reduce_sum``/``max``/``min``/``prod`` of one or more *trailing* axes;
- ``EXTERN``: everything else (matmul, gather/scatter/take/index_put, random bits, cumsum,
  pad, concatenate, flip, copy, unfold/fold, argmax/argmin, reductions of other axes -- ``fuse``
  has already made trailing those that include the last axis), every
  node the backend does not compile in a kernel (``supports``; the LLVM backend: nothing
  touching float16), and constants.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from ..ir.analysis import ELEMENTWISE_ROLE, REDUCE_ROLE, VIEW_ROLE, body_role, trailing_axes
from ..ir.graph import CONSTANT, Node, Value
from ..ir.types import Sym

ELEMENTWISE, VIEW, REDUCE, EXTERN = ELEMENTWISE_ROLE, VIEW_ROLE, REDUCE_ROLE, "extern"

#: The most nodes one kernel takes. LLVM's optimizer takes time that grows faster than the size of
#: the function it optimizes (measured on a chain of fused elementwise ops, per op: 1.4 ms at 100
#: ops, 2.6 ms at 800, 9 ms at 3,000, 40 ms at 10,000), so a longer chain is cut into kernels of
#: this size: its compile time stays linear, for one extra pass over memory per 256 nodes.
MAX_KERNEL_NODES = 256


def _base_class(node: Node, supports: Callable[[Node], bool] | None) -> str:
    role = body_role(node.op) if node.op != CONSTANT else None
    if role is None or (supports is not None and not supports(node)):
        return EXTERN
    if node.op == "slice" and any(isinstance(start, Sym) for start in node.attrs["starts"]):
        return EXTERN  # (``y[:, -1]`` of a dynamic length: kernels' index offsets are whole numbers)
    if role == REDUCE and not trailing_axes(node.attrs["axes"], node.inputs[0].type.ndim):
        return EXTERN
    return role


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
    _hoist_slices_of_extern_values(nodes, classes)
    for node in reversed(nodes):
        if classes[node] != VIEW:
            continue
        out = node.outputs[0]
        if out in outputs or any(classes[u] == EXTERN for u in users.get(out, ())):
            classes[node] = EXTERN
    return classes


def _hoist_slices_of_extern_values(nodes: Sequence[Node], classes: dict[Node, str]) -> None:
    """A ``slice`` stays extern (a numpy view, which kernels read as a strided input) when it reads
    a value no kernel makes (an input, an extern node's result, a view of those) or when it takes
    one index of the leading axis whole (``x[t]``). Inside a kernel its start would be part of the
    code, so the steps of an unrolled loop (``x[t]`` of a sequence, an LSTM's input projection at
    step ``t``) would each compile a kernel of their own; outside, they share one (and a cheap
    value sliced at each step, a bias added to the whole projection, is computed once)."""
    outside: set[Value] = set()  # values no kernel makes
    made = {v for node in nodes for v in node.outputs}
    for node in nodes:
        if classes[node] == EXTERN:
            outside.update(node.outputs)
        elif classes[node] == VIEW:
            reads_outside = all(v in outside or v not in made for v in node.inputs)
            if reads_outside:
                outside.update(node.outputs)  # a view of such a value: not made by a kernel either
            if node.op == "slice" and (reads_outside or _one_leading_index(node)):
                classes[node] = EXTERN
                outside.update(node.outputs)


def _one_leading_index(node: Node) -> bool:
    """Whether the slice ``node`` takes one index of its input's leading axis and all of the others
    (of two axes or more: one element of a vector is not a loop's step)."""
    shape = node.inputs[0].type.shape
    starts, stops, steps = node.attrs["starts"], node.attrs["stops"], node.attrs["steps"]
    if not all(isinstance(n, int) for n in (*shape, *starts, *stops, *steps)):  # a symbolic size: not a loop's
        return False
    if len(shape) < 2 or stops[0] - starts[0] != 1 or any(step != 1 for step in steps):  # a row, not an element
        return False
    return all(lo == 0 and hi == size for lo, hi, size in zip(starts[1:], stops[1:], shape[1:], strict=True))
