"""Kernels over a symbolic leading (batch) dimension: which one a kernel has, and its size read from
the argument table (``symbol_size``).

A kernel whose values have a symbolic LEADING dimension (``kiln.ir.types.Sym``, the
same one in every value that has it, and nowhere else) reads that size at run time from the slot
after the pointers: ``args[n_in + n_out]`` holds it as an i64 (``KernelInfo.symbols`` names the
slots in order). Inner sizes and every stride stay static immediates, so inner loops vectorize as
before; only the outermost loop's bound and the number of units follow the size:
``KernelInfo.units(sizes)``. An elementwise kernel keeps the symbolic dimension as its own outer loop
(kiln/codegen/llvm/elementwise.py); a reduction's rows are the symbolic dimension times the static
outer sizes, so it needs the size only for the number of units. A kind whose generator does not
take a symbolic dimension (``KindGenerator.symbolic``: horizontal, for one) is declined.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod as product

from llvmlite import ir

from ...ir.graph import Node, kernel_bodies
from ...ir.types import Sym
from ..core import Unsupported
from ..index import static
from .body import POINTER
from .loops import I64, i64

__all__ = ["symbol_size", "symbolic_dimension", "symbolic_work_bytes"]


def symbolic_dimension(node: Node, layouts: Sequence[tuple[int, ...]], static_kind: str | None) -> Sym | None:
    """The kernel's symbolic dimension (None for a static kernel); ``Unsupported`` unless there is
    one, it leads every shape that has it, the layouts are static and the kernel's generator handles
    one (``static_kind``: the kind of a kernel whose generator does not)."""
    values = [*node.inputs, *node.outputs, *(v for body in kernel_bodies(node) for v in body.values())]
    found = {d for v in values for d in v.type.shape if isinstance(d, Sym)}
    if not found:
        return None
    if static_kind is not None:
        raise Unsupported(f"a {static_kind} kernel over a symbolic dimension")
    if len(found) > 1:
        raise Unsupported(f"a kernel over several symbolic dimensions ({', '.join(sorted(map(str, found)))})")
    for v in values:
        if any(isinstance(d, Sym) for d in v.type.shape[1:]):
            raise Unsupported(f"%{v.id} of shape {list(map(str, v.type.shape))} has a symbolic dimension after its "
                              "first (only a leading symbolic dimension is compiled)")  # fmt: skip
    if not all(isinstance(s, int) for strides in layouts for s in strides):
        raise Unsupported(f"symbolic strides in the layouts {list(layouts)}")
    return found.pop()


def symbolic_work_bytes(node: Node, sym: Sym) -> tuple[int, int]:
    """Bytes read and written that do not depend on the symbol, and bytes per unit of its size."""
    fixed = per_size = 0
    for v in (*node.inputs, *node.outputs):
        shape, itemsize = v.type.shape, v.type.dtype.itemsize
        if shape and shape[0] == sym:
            per_size += product(static(n) for n in shape[1:]) * itemsize
        else:
            fixed += v.type.numel * itemsize
    return fixed, per_size


def symbol_size(builder: ir.IRBuilder, args: ir.Value, slot: int) -> ir.Value:
    """The size in slot ``slot`` of the argument table (an i64 where a pointer would be)."""
    where = builder.gep(args, [i64(slot)], inbounds=True, source_etype=POINTER)
    return builder.load(where, typ=I64, name="size")
