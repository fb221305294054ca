"""Kernels over a symbolic leading (batch) dimension: its size is read from the argument table.

A kernel whose values have a symbolic LEADING dimension (``kiln.ir.types.Sym``, the
same one in every value that has it, and nowhere else) reads that size at run time from the slot
after the pointers: ``args[n_in + n_out]`` holds it as an i64 (``KernelInfo.symbols`` names the
slots in order). Inner sizes and every stride stay static immediates, so inner loops vectorize as
before; only the outermost loop's bound and the number of units follow the size:
``KernelInfo.units(sizes)``. An elementwise kernel keeps the symbolic dimension as its own outer loop
(units: blocks of rows, pieces of a long row, or chunks of the symbolic loop when it is the only
one); a reduction's rows are the symbolic dimension times the static outer sizes, so it needs the
size only for the number of units. Horizontal kernels over a symbolic dimension are declined.
"""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from ...ir.graph import Graph, Node, kernel_bodies
from ...ir.types import Sym
from . import Unsupported
from .kernels import CHUNK, _Body, unit_loops
from .kernels_emit import POINTER, Scope, VarEnv, operand_pointers
from .loops import I64, for_range, i64, minimum, product


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
            per_size += product(shape[1:]) * itemsize
        else:
            fixed += v.type.numel * itemsize
    return fixed, per_size


def symbol_size(builder: ir.IRBuilder, args: ir.Value, slot: int) -> ir.Value:
    """The size in slot ``slot`` of the argument table (an i64 where a pointer would be)."""
    where = builder.gep(args, [i64(slot)], inbounds=True, source_etype=POINTER)
    return builder.load(where, typ=I64, name="size")


def elementwise_symbolic(builder: ir.IRBuilder, args, body: Graph, domain, outputs, groups) -> tuple[int, int]:
    """``_elementwise`` over a symbolic leading dimension (``groups[0] == [0]``), whose size is read
    from the argument table; returns ``(rows_per_size, rows_per_unit)`` (see ``KernelInfo.units``)."""
    static = [product(domain[j] for j in g) for g in groups[1:]]
    if product(static) == 0:
        builder.ret_void()
        return 0, 1
    args_ptr, begin, end = args
    operands = len(body.inputs) + len(body.outputs)
    env = VarEnv()
    target = _Body(builder, operand_pointers(builder, args_ptr, operands), env)
    size = symbol_size(builder, args_ptr, operands)

    def inner_loop(lo, hi) -> None:
        with for_range(builder, lo, hi, name="i", parallel=True) as i:
            env.bind_group(groups[-1], i)
            target.compute_then_store(outputs, Scope())

    if not static:  # the symbolic loop is the only one: a unit is a chunk of it
        with for_range(builder, begin, end, name="unit") as unit:
            lo = builder.mul(unit, i64(CHUNK), flags=("nsw",))
            inner_loop(lo, minimum(builder, builder.add(lo, i64(CHUNK)), size))
        builder.ret_void()
        return 1, CHUNK
    inner, middle = static[-1], product(static[:-1])
    sizes = [size, *static]  # bind_rows reads only the static sizes after the first
    rows = builder.mul(size, i64(middle), flags=("nsw",)) if middle > 1 else size
    per_unit = unit_loops(builder, env, groups, sizes, inner, rows, begin, end, inner_loop)
    builder.ret_void()
    return (middle * per_unit, 1) if inner >= CHUNK else (middle, per_unit)
