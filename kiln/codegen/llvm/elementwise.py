"""The ``elementwise`` kernel kind compiled: one loop nest over the domain, every output stored per element.

The domain's loop dimensions that every operand addresses as one are collapsed (kiln/codegen/plans.py:
``elementwise_plan``), so a contiguous chain is one long unit-stride loop that vectorizes. A
parallel unit is a chunk of about ``CHUNK`` elements: a piece of a long inner loop, or several
rows. Over a symbolic leading (batch) dimension the kernel reads its size from the argument table
(kiln/codegen/llvm/symbolic.py) and keeps it as its own outer loop: units are then blocks of rows,
pieces of a long row, or chunks of the symbolic loop when it is the only one. A short row of windows (a max pooling's
backward: 2 to 4 offsets a window, 4 to 15 windows a row) is a forced vector loop of the windows,
their offsets unrolled inside (``_window_lanes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod as product
from typing import cast

from llvmlite import ir

from ...ir.graph import Node
from ...ir.types import Dim
from ..index import static
from ..kernel_dag import loads
from ..plans import ElementwisePlan, checked_bodies, elementwise_plan
from .body import KernelBody, Scope, operand_pointers
from .loops import CHUNK, VarEnv, bind_rows, for_range, i64, minimum
from .symbolic import symbol_size

__all__ = ["emit_elementwise", "unit_loops"]


def emit_elementwise(builder: ir.IRBuilder, args, node: Node, layouts) -> int | tuple[int, int]:
    """An elementwise kernel's function body; its number of parallel units, or over a symbolic
    dimension ``(rows_per_size, rows_per_unit)`` (``KernelInfo.units``)."""
    (body,) = checked_bodies(node)
    plan = elementwise_plan(body, layouts)
    operands = len(body.inputs) + len(body.outputs)
    if plan.symbolic:
        return _symbolic(builder, args, plan, operands)
    if product(static(n) for n in plan.domain) == 0:
        builder.ret_void()
        return 0
    groups, sizes = plan.groups, cast(list[int], plan.sizes)
    width = _window_lanes(plan, sizes)
    tiny = sizes[-1] if width else _tiny_innermost(sizes)
    if not tiny:
        width = _short_row_lanes(plan, sizes)
    loops = groups[:-1] if tiny else groups  # a tiny innermost group is unrolled in the loop around it
    loop_sizes = sizes[: len(loops)]
    inner = loop_sizes[-1] if loops else 1
    rows = product(loop_sizes[:-1])
    args_ptr, begin, end = args
    env = VarEnv()
    target = KernelBody(builder, operand_pointers(builder, args_ptr, operands), env)

    def inner_loop(lo, hi) -> None:
        with for_range(builder, lo, hi, name="i", parallel=True, width=width, force=bool(width)) as i:
            if loops:
                env.bind_group(loops[-1], i)
            for t in range(tiny or 1):
                if tiny:
                    env.bind_group(groups[-1], i64(t))
                target.compute_then_store(plan.outputs, Scope())

    split = unit_loops(builder, env, loops, loop_sizes, inner, rows, begin, end, inner_loop)
    extent = rows * split if inner >= CHUNK else -(-rows // split)  # pieces per row, or rows per unit
    builder.ret_void()
    return extent


def _tiny_innermost(sizes: Sequence[int]) -> int:
    """The size of an innermost loop too short to vectorize (2 to 4: pooling's window offsets)
    inside a longer one, which is then unrolled in the longer loop's body; 0 where there is none.
    A loop of 2 spends as much on its own control as on its body, and unrolled, the values the
    offsets share (the window's maximum, its gradient) load once. LLVM still does not vectorize
    the loop around it when that is short (14), but LeNet's max pooling forward and backward,
    compiled together on one thread, go from 1.41 to 0.74 ms (64 x 6 x 28 x 28)."""
    if len(sizes) < 2:
        return 0
    last, around = sizes[-1], sizes[-2]
    return last if 2 <= last <= 4 and around >= 8 else 0


#: Lanes of the vector loop around an unrolled window (``_window_lanes``): measured on a max pooling's
#: backward (32 x 8 x 28 x 28, windows of 2 x 2, 14 windows a row), 4 lanes 119 us, 8 lanes 147 us
#: (the 6 windows past the vector run scalar), scalar 237 us.
WINDOW_LANES = 4


def _window_lanes(plan: ElementwisePlan, sizes: Sequence[int]) -> int | None:
    """Vector lanes for the loop around a tiny innermost group (a window's offsets, 2 to 4) when
    that loop is short (4 to 15 trips) and every load and store is one the vectorizer widens
    without gathers: the same for each trip (0), unit stride across trips and the same for each
    window offset (a window's gradient, read once per window), or the window's offsets
    interleaved (stride the window's size, offset 1 apart: each element of the row once); else
    None.

    Why: LLVM does not vectorize a loop it knows runs fewer than 16 times unless told to (it
    would fold the tail into masked gathers and scatters); told, with these loads it makes one
    vector pass plus a scalar remainder. A max pooling's backward over a refined domain
    (kiln/codegen/plans.py: ``elementwise_plan``) is such a loop: 14 or 7 windows a row. A load
    of another stride (two window offsets reading one input element) turns into gathers, slower
    than the scalar loop, so such a kernel keeps the scalar loop."""
    if len(sizes) < 2 or not 2 <= sizes[-1] <= 4 or not 4 <= sizes[-2] < 16:
        return None
    window, around = sizes[-1], plan.groups[-2][-1]
    offset = plan.groups[-1][-1]
    leaves = [load.offset for load in loads(plan.roots)] + [out.at for out in plan.outputs]
    for leaf in leaves:
        if not leaf.is_affine:
            return None
        stride, step = leaf.coef(around), leaf.coef(offset)
        if not (stride == 0 or (stride == 1 and step == 0) or (stride == window and step == 1)):
            return None
    return WINDOW_LANES


def _short_row_lanes(plan: ElementwisePlan, sizes: Sequence[int]) -> int | None:
    """Vector lanes (``WINDOW_LANES``) for an innermost loop of 8 to 15 trips inside another whose
    loads are each the same for every trip, unit stride, or complete interleaved groups (stride
    ``s`` of 2 to 4, ``s`` loads of one operand at consecutive offsets: a max pooling's forward reads
    each window's row at stride 2, offsets 0 and 1), at least one such group, and whose stores are
    unit stride; else None. LLVM leaves such a loop scalar (see ``_window_lanes``) or folds it into
    gathers; a row of unit-stride loads only it unrolls and packs itself (DCGAN's rows of 8 of a
    padded gradient: 4.1 us a call, forced at 4 lanes 6.1 us). A max pooling's forward after ReLU (the
    kernel alone, min of 5 x 200 calls): 32 x 8 x 28 x 28, rows of 14 windows, 260 us scalar, 134 us
    at 4 lanes (8 lanes gained nothing in the CNN); 32 x 16 x 14 x 14, rows of 7, 67 us scalar but
    98 us at 4 lanes (3 of 7 windows in the scalar remainder), so a row of fewer than 8 stays scalar."""
    if len(sizes) < 2 or not 8 <= sizes[-1] < 16:
        return None
    var = plan.groups[-1][-1]
    if any(out.at.coef(var) != 1 or not out.at.is_affine for out in plan.outputs):
        return None
    groups: dict[tuple, set[int]] = {}
    for load in loads(plan.roots):
        stride = load.offset.coef(var)
        if not load.offset.is_affine or stride < 0 or stride > 4:
            return None
        if stride > 1:  # a member of an interleaved group: the same other terms, offsets within s
            rest = tuple((atom, c) for atom, c in load.offset.terms if atom != var)
            key = (load.operand, stride, rest, load.offset.const // stride)
            groups.setdefault(key, set()).add(load.offset.const % stride)
    if not groups or any(len(residues) != key[1] for key, residues in groups.items()):
        return None  # (a row of unit-stride loads only: LLVM unrolls it and packs it well by itself)
    return WINDOW_LANES


def unit_loops(builder: ir.IRBuilder, env: VarEnv, groups, sizes: Sequence[Dim], inner: int, rows,
               begin: ir.Value, end: ir.Value, inner_loop) -> int:  # fmt: skip
    """The loop over parallel units ``[begin, end)`` of an elementwise kernel whose collapsed loops
    are ``groups`` of ``sizes`` (the last, of ``inner`` elements, innermost; ``rows`` the number of
    outer rows, an int or an i64 value). A unit is a piece of ``CHUNK`` elements of one long row, or
    a block of whole rows; ``inner_loop(lo, hi)`` emits the innermost loop. Returns the pieces per
    row (long rows) or the rows per unit (blocks)."""
    if inner >= CHUNK:  # a unit is a piece of one long row
        pieces = -(-inner // CHUNK)
        with for_range(builder, begin, end, name="unit") as unit:
            row = builder.sdiv(unit, i64(pieces)) if pieces > 1 else unit
            piece = builder.srem(unit, i64(pieces)) if pieces > 1 else i64(0)
            bind_rows(builder, env, groups[:-1], sizes[:-1], row)
            lo = builder.mul(piece, i64(CHUNK), flags=("nsw",))
            inner_loop(lo, minimum(builder, builder.add(lo, i64(CHUNK)), i64(inner)))
        return pieces
    per_unit = max(1, CHUNK // inner)  # a unit is a block of whole rows
    with for_range(builder, begin, end, name="unit") as unit:
        first = builder.mul(unit, i64(per_unit), flags=("nsw",))
        last = minimum(builder, builder.add(first, i64(per_unit)), i64(rows) if isinstance(rows, int) else rows)
        with for_range(builder, first, last, name="row") as row:
            bind_rows(builder, env, groups[:-1], sizes[:-1], row)
            inner_loop(0, inner)
    return per_unit


def _symbolic(builder: ir.IRBuilder, args, plan: ElementwisePlan, operands: int) -> tuple[int, int]:
    """The kernel over a symbolic leading dimension (``plan.groups[0] == [0]``), whose size is read
    from the argument table; returns ``(rows_per_size, rows_per_unit)`` (see ``KernelInfo.units``)."""
    groups = plan.groups
    static = cast(list[int], plan.sizes[1:])
    if product(static) == 0:
        builder.ret_void()
        return 0, 1
    args_ptr, begin, end = args
    env = VarEnv()
    target = KernelBody(builder, operand_pointers(builder, args_ptr, operands), env)
    size = symbol_size(builder, args_ptr, operands)

    def inner_loop(lo, hi) -> None:
        with for_range(builder, lo, hi, name="i", parallel=True) as i:
            env.bind_group(groups[-1], i)
            target.compute_then_store(plan.outputs, Scope())

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
