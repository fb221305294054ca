"""Kernel plans shared by every code generator: a kernel node's domain, its outputs' DAG roots and
store offsets, and its loop groups, decided once from the body and the inputs' layouts.

``elementwise_plan`` (elementwise and horizontal members) and ``reduction_rows`` with
``check_row_values`` (row reductions) are what the LLVM and CUDA kernel generators both start
from (kiln/codegen/llvm/kernels.py, kiln/codegen/cuda/kernels.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..ir.graph import Graph
from ..ir.types import Dim, Sym
from . import index as ix
from .core import Unsupported
from .kernel_dag import REDUCES, Apply, DagBuilder, Load, Reduce, Rows, loads


def product(values) -> int:
    """The product of ints (1 for none)."""
    out = 1
    for v in values:
        out *= v
    return out


def same_size(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    """Whether two shapes have the same number of elements for every value of their symbols."""

    def split(shape: Sequence[Dim]) -> tuple[Counter, int]:
        return Counter(d for d in shape if isinstance(d, Sym)), product(d for d in shape if isinstance(d, int))

    return split(a) == split(b)


def elementwise_plan(body: Graph, layouts: Sequence[Sequence[int]]):
    """The domain, its DAG outputs ``(operand, root, store offset)`` and the collapsed loop groups."""
    if not body.outputs:
        raise Unsupported("a kernel with no outputs")
    domain = body.outputs[0].type.shape
    for v in body.outputs:
        if v.type.shape != domain:
            raise Unsupported(f"elementwise outputs of shapes {list(domain)} and {list(v.type.shape)}")
    space = ix.Space(domain)
    dag = DagBuilder(body, space, layouts)
    store_at = ix.offset(space.identity(), ix.contiguous_strides(domain))
    n_in = len(body.inputs)
    outputs = [(n_in + j, dag.element(v, space.identity()), store_at) for j, v in enumerate(body.outputs)]
    leaves = [load.offset for load in loads([root for _, root, _ in outputs])] + [store_at]
    if domain and isinstance(domain[0], Sym):  # the symbolic dimension is a loop of its own
        return domain, outputs, [[0], *ix.collapse(domain, range(1, len(domain)), leaves)]
    groups = ix.collapse(domain, range(len(domain)), leaves)
    return domain, outputs, groups


def reduction_rows(body: Graph) -> tuple[tuple[Dim, ...], Rows]:
    """The domain and the rows: every reduce reduces the same trailing axes of the same shape."""
    reduces = [n for n in body.nodes if n.op in REDUCES]
    if not reduces:
        raise Unsupported("a reduction kernel without a reduction")
    domain = reduces[0].inputs[0].type.shape
    axes = tuple(reduces[0].attrs["axes"])
    for n in reduces:
        if n.inputs[0].type.shape != domain or tuple(n.attrs["axes"]) != axes:
            raise Unsupported(f"reductions over different shapes or axes: {axes} of {list(domain)} and "
                              f"{n.attrs['axes']} of {list(n.inputs[0].type.shape)}")  # fmt: skip
    outer = len(domain) - len(axes)
    if axes != tuple(range(outer, len(domain))):
        raise Unsupported(f"reduction axes {axes} of {list(domain)} are not the trailing axes")
    return domain, Rows(outer, axes)


def check_row_values(roots: Sequence, outer: int) -> None:
    """A row-valued output may read only row values and elements at the row's own index."""
    pending, seen = list(roots), set()
    while pending:
        node = pending.pop()
        if id(node) in seen or isinstance(node, Reduce):
            continue
        seen.add(id(node))
        if isinstance(node, Load) and any(v >= outer for v in node.offset.variables()):
            raise Unsupported("a row-valued output reads the elements of the row")
        if isinstance(node, Apply):
            pending.extend(node.args)
