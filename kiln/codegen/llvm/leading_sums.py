"""Sums over leading or middle axes compiled: ``reduce_sum`` that keeps the last axis (a bias or
LayerNorm-weight gradient, ``g.sum((0, 1))``), a function of its own beside the fused kernels.

Fusion takes the reductions over trailing axes (a kernel's unit is an output row); these sum
*rows* into one, which the eager kernel does as a BLAS matrix-vector product. Inside a compiled
step that product costs 50-200 us for a (1024, 256) float32 gradient, against 22 us called in a
loop: BLAS wakes its sleeping threads and the other core reads the rows from memory. Here a unit
is a block of ``BLOCK_VECTORS`` vectors of output columns (under one index of the kept leading
axes): its accumulators sum the rows below it, loaded as vectors along the contiguous last axis
(the last partial vector under a lane mask). The innermost reduced axis is summed in runs of at
most ``RUN_ROWS`` rows, each run's sum added to the total, so the rounding error grows with
``RUN_ROWS + rows / RUN_ROWS`` rather than with the number of rows. Units own disjoint outputs
and sum in one fixed order: the same bits on any number of threads. Every loop is kept from
LLVM's unroller (``interleave=1``): a row's 8 independent vector adds are work enough per
iteration, and unrolled, three such kernels took 48 ms of LLVM instead of 34, at the same speed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.graph import Node
from ...ir.types import Sym, is_static
from ..core import Unsupported
from .body import operand_pointers
from .kernel_info import float_static
from .loops import for_range, i64
from .symbolic import symbol_size
from .vectors import Rows

#: Vectors of output columns a unit sums at once: independent accumulators (registers), each row's
#: loads one contiguous run of 8 vectors.
BLOCK_VECTORS = 8
#: The most rows summed into one partial sum before it is added to the total (see the docstring).
RUN_ROWS = 64

_NSW = ("nsw",)


def compilable(node: Node) -> str | None:
    """Why the ``reduce_sum`` node is not compiled as a row sum (None: it is); the layout of its
    input is checked when the kernel is built."""
    if node.op != "reduce_sum":
        return f"{node.op} is not a sum"
    (x,) = node.inputs
    why = float_static(node) if not _sums_the_symbol(node) else None
    if why is not None:
        return why
    if not node.attrs["axes"]:
        return "reduce_sum over no axes is a copy, not a sum of rows"
    if x.type.ndim - 1 in node.attrs["axes"]:
        return "reduce_sum over the last axis is fused into a kernel, not compiled on its own"
    return None


def _sums_the_symbol(node: Node) -> bool:
    """A float sum whose input's only symbolic size is its leading one, summed away (a bias gradient
    over a dynamic batch): the size is read from the table, after the two pointers."""
    (x,) = node.inputs
    shape = x.type.shape
    return (bool(shape) and isinstance(shape[0], Sym) and 0 in node.attrs["axes"] and is_static(shape[1:])
            and node.output.type.is_static and x.type.dtype in (dt.float32, dt.float64))  # fmt: skip


def emit(builder: ir.IRBuilder, params: Sequence[ir.Value], node: Node, layouts) -> int:
    """Emit ``node``'s function body at ``builder`` (the entry block of ``(args, begin, end)``);
    return its number of parallel units."""
    why = compilable(node)
    if why is not None:
        raise Unsupported(why)
    (x,) = node.inputs
    shape, strides = cast(tuple[int, ...], tuple(x.type.shape)), tuple(layouts[0])
    axes = sorted(node.attrs["axes"])
    columns = shape[-1]
    if strides[-1] != 1 and columns > 1 and math.prod(shape[1:] if isinstance(shape[0], Sym) else shape):
        raise Unsupported("reduce_sum of an input whose last axis is not contiguous runs on its eager kernel")
    if node.output.type.numel == 0:
        builder.ret_void()
        return 0
    args, begin, end = params
    x_ptr, out_ptr = operand_pointers(builder, args, 2)
    if _sums_the_symbol(node):  # its size follows the two pointers (symbolic.symbol_size)
        shape = cast(tuple[int, ...], (symbol_size(builder, args, 2), *shape[1:]))
    rows = Rows(x.type.dtype, columns)
    width = rows.lanes * BLOCK_VECTORS
    full_blocks, tail = divmod(columns, width)
    blocks = full_blocks + (tail > 0)
    kept = [(shape[a], strides[a]) for a in range(len(shape) - 1) if a not in axes]
    reduced = [(shape[a], strides[a]) for a in axes]
    totals = rows.slots(builder, min(BLOCK_VECTORS, -(-columns // rows.lanes)))
    partials = rows.slots(builder, len(totals))
    with for_range(builder, begin, end, name="unit", vectorize=False, interleave=1) as unit:
        outer = builder.udiv(unit, i64(blocks))
        column = builder.mul(builder.urem(unit, i64(blocks)), i64(width), flags=_NSW)
        x_at = builder.add(_offset(builder, outer, kept), column, flags=_NSW)
        out_at = builder.add(builder.mul(outer, i64(columns), flags=_NSW), column, flags=_NSW)

        def block(vectors: int, masked_last: bool) -> None:
            _block(builder, rows, x_ptr, out_ptr, x_at, out_at, reduced, totals[:vectors], partials, masked_last)

        if not tail:
            block(BLOCK_VECTORS, False)
        elif not full_blocks:
            block(-(-tail // rows.lanes), bool(rows.tail))
        else:
            is_full = builder.icmp_unsigned("<", builder.urem(unit, i64(blocks)), i64(full_blocks))
            with builder.if_else(is_full, likely=True) as (full, last):
                with full:
                    block(BLOCK_VECTORS, False)
                with last:
                    block(-(-tail // rows.lanes), bool(rows.tail))
    builder.ret_void()
    return math.prod(size for size, _ in kept) * blocks


def _offset(builder: ir.IRBuilder, index: ir.Value, dims: Sequence[tuple[int, int]]) -> ir.Value:
    """The element offset of the C-order linear ``index`` over ``dims`` ((size, stride) pairs)."""
    offset: ir.Value = i64(0)
    for size, stride in reversed(dims):
        position = builder.urem(index, i64(size)) if size > 1 else i64(0)
        offset = builder.add(offset, builder.mul(position, i64(stride), flags=_NSW), flags=_NSW)
        index = builder.udiv(index, i64(size))
    return offset


def _block(builder, rows: Rows, x_ptr, out_ptr, x_at, out_at, reduced, totals, partials, masked_last: bool) -> None:
    """Sum the rows under ``len(totals)`` vectors of columns at ``x_at`` into the output at ``out_at``."""
    last = len(totals) - 1
    for slot in totals:
        builder.store(rows.zero(), slot)

    def run(at, first, stop, stride: int) -> None:
        """Add rows ``first .. stop`` of the innermost reduced axis to the totals."""
        for slot in partials[: len(totals)]:
            builder.store(rows.zero(), slot)
        with for_range(builder, first, stop, name="row", vectorize=False, interleave=1) as row:
            row_at = builder.add(at, builder.mul(row, i64(stride), flags=_NSW), flags=_NSW)
            for k, slot in enumerate(partials[: len(totals)]):
                offset = builder.add(row_at, i64(k * rows.lanes), flags=_NSW)
                value = rows.load(builder, x_ptr, offset, masked_last and k == last)
                builder.store(builder.fadd(builder.load(slot, typ=rows.vector), value), slot)
        for total, partial in zip(totals, partials, strict=False):
            builder.store(
                builder.fadd(builder.load(total, typ=rows.vector), builder.load(partial, typ=rows.vector)), total
            )

    def nest(at, dims) -> None:
        (size, stride), rest = dims[0], dims[1:]
        if rest:
            with for_range(builder, 0, size, name="outer_row", vectorize=False, interleave=1) as index:
                nest(builder.add(at, builder.mul(index, i64(stride), flags=_NSW), flags=_NSW), rest)
            return
        if not isinstance(size, int):  # a symbolic size, read at run time: the same runs, counted there
            runs = builder.udiv(size, i64(RUN_ROWS))
            with for_range(builder, 0, runs, name="run", vectorize=False, interleave=1) as index:
                run(builder.add(at, builder.mul(index, i64(RUN_ROWS * stride), flags=_NSW), flags=_NSW),
                    0, RUN_ROWS, stride)  # fmt: skip
            run(at, builder.mul(runs, i64(RUN_ROWS), flags=_NSW), size, stride)
            return
        runs, remainder = divmod(size, RUN_ROWS)
        if runs:
            with for_range(builder, 0, runs, name="run", vectorize=False, interleave=1) as index:
                run(builder.add(at, builder.mul(index, i64(RUN_ROWS * stride), flags=_NSW), flags=_NSW),
                    0, RUN_ROWS, stride)  # fmt: skip
        if remainder:
            run(at, runs * RUN_ROWS, size, stride)

    if all(not isinstance(size, int) or size for size, _ in reduced):
        nest(x_at, reduced)
    for k, slot in enumerate(totals):
        offset = builder.add(out_at, i64(k * rows.lanes), flags=_NSW)
        rows.store(builder, builder.load(slot, typ=rows.vector), out_ptr, offset, masked_last and k == last)
