"""``pad`` compiled: constant padding without interior padding, as one function over parallel units.

A convolution pads its input (and its input's gradient) before ``unfold``: a CNN's step pads three
times, a DCGAN's nine. The eager kernel fills the output with the value and then copies the input
into its interior with one numpy assignment, which numpy runs row by row: 37 us for 32 x 16 x 14 x 14
floats into 18 x 18 planes (51 us with the fill), on one thread. Here a unit is a block of output
rows (all dims but the last); a row outside the input in a leading dim is the value, a row inside
is the value on its ``low`` and ``high`` margins and the input's row between them, copied with
``vectors.transfer_row`` (explicit vectors for a short contiguous row). Specialized on the static
shapes, the padding and the input's strides, as a fused kernel is (``kernels.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llvmlite import ir

from ...ir.graph import Node
from ..core import Unsupported
from .body import element_pointer, operand_pointers
from .emitter import memory_type
from .kernel_info import float_static
from .loops import CHUNK, dot, for_range, i64, minimum, row_major_indices, static_shape
from .vectors import transfer_row


def compilable(node: Node) -> str | None:
    """Why the pad node ``node`` is not compiled (None: it is)."""
    if node.op != "pad":
        return f"{node.op} is not pad"
    why = float_static(node)
    if why is not None:
        return why
    attrs = node.attrs
    if any(attrs["interior"]):
        return "pad with interior padding runs on its eager kernel"
    if not node.inputs[0].type.shape:
        return "pad of a 0-d tensor runs on its eager kernel"
    return None


def eager_by_choice(node: Node) -> str | None:
    """Every pad this module does not compile runs on its eager kernel as pads always have: nothing
    to report as a fallback."""
    return compilable(node)


def emit(builder: ir.IRBuilder, params: Sequence[ir.Value], node: Node, layouts: Sequence[tuple[int, ...]]) -> int:
    """Emit ``node``'s function body at ``builder``, the entry block of ``(args, begin, end)`` =
    ``params``; return its number of parallel units."""
    why = compilable(node)
    if why is not None:
        raise Unsupported(why)
    args, begin, end = params
    source, target = operand_pointers(builder, args, 2)
    in_shape, out_shape = static_shape(node.inputs[0]), static_shape(node.output)
    low, strides, dtype = node.attrs["low"], layouts[0], node.output.type.dtype
    value = ir.Constant(memory_type(dtype), float(node.attrs["value"]))
    width, rows = out_shape[-1], math.prod(out_shape[:-1])
    if rows * width == 0:
        builder.ret_void()
        return 0
    per_unit = max(1, CHUNK // width)
    first = builder.mul(begin, i64(per_unit), flags=("nsw",))
    last = minimum(builder, builder.mul(end, i64(per_unit), flags=("nsw",)), i64(rows))

    def fill(row_start: ir.Value, lo: int, hi: int) -> None:
        """output[row_start + lo : row_start + hi] = value."""
        if hi <= lo:
            return
        with for_range(builder, lo, hi, name="v", parallel=True) as k:
            at = builder.add(row_start, k, flags=("nsw",))
            builder.store(value, element_pointer(builder, target, at, dtype), align=dtype.itemsize)

    with for_range(builder, first, last, name="row", vectorize=False) as row:
        start = builder.mul(row, i64(width), flags=("nsw",))
        indices = row_major_indices(builder, row, out_shape[:-1])
        inside: ir.Value = ir.Constant(ir.IntType(1), 1)
        for index, lo, n in zip(indices, low[:-1], in_shape[:-1], strict=True):  # lo <= index < lo + n, unsigned
            shifted = builder.sub(index, i64(lo))
            inside = builder.and_(inside, builder.icmp_unsigned("<", shifted, i64(n)))
        with builder.if_else(inside) as (copy, margin):
            with copy:
                lo, n = low[-1], in_shape[-1]
                terms = [(builder.sub(index, i64(p)), s) for index, p, s in zip(indices, low, strides, strict=False)]
                fill(start, 0, lo)
                at_out = builder.add(start, i64(lo), flags=("nsw",))
                transfer_row(
                    builder, n, (source, dot(builder, terms)), (target, at_out), strides[-1], 1, dtype, add=False
                )
                fill(start, lo + n, width)
            with margin:
                fill(start, 0, width)
    builder.ret_void()
    return -(-rows // per_unit)
