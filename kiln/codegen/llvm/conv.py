"""Direct convolution compiled: ``conv`` and ``conv_weight`` (``kiln/ir/primitives/convolution.py``)
as loop nests over the input where it lies, no im2col windows, for 2-d unit-stride convolutions.

Both run along rows. An output row (or an output-gradient row) of ``OW`` positions is a few
vectors; for kernel offset (kh, kw) they read the input row ``oh + kh * dh`` from column
``kw * dw`` on: a contiguous run at a constant shift, which a vector load reads at any shift. The
last, partial vector of a row is loaded and stored under a lane mask (``llvm.masked.load``), so
no access leaves its row and masked lanes read zeros.

- ``conv``: a unit is one sample and a block of up to ``CHANNEL_BLOCK`` output channels; for each
  vector of an output row, one accumulator per channel of the block sums ``w[o, c, kh, kw] *
  x[shifted]`` over every input channel and kernel offset (one load of ``x`` feeds the block),
  then is stored into the C-order output (N, O, OH, OW).
- ``conv_weight``: a unit is one (output channel, input channel) pair: its kernel's taps. For each
  vector of each output-gradient row of each sample, one accumulator per tap sums ``g * x[shifted]``;
  the taps go in groups of ``TAP_GROUP`` (their accumulators in registers) and each tap's lanes
  are added up once at the end. Units own disjoint outputs and sum in one fixed order, so results
  do not depend on how units are split over threads.

Over a symbolic batch (the leading dim of ``conv``'s input and result, of both of ``conv_weight``'s
inputs; every other size static) the code is the same: ``conv``'s units are ``batch * blocks``, so
only their number follows the size (``symbolic_info``); ``conv_weight`` sums over the samples in
each unit and reads their number from the argument table, the slot after the pointers
(``symbolic.symbol_size``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.graph import Node
from ...ir.types import Sym, is_static
from ..core import Unsupported
from .body import element_pointer, operand_pointers
from .kernel_info import CONV_OPS, moved_bytes
from .loops import for_range, i64, static_shape
from .symbolic import symbol_size
from .vectors import Rows

#: Tap accumulators of ``conv_weight`` held at once (each a vector register).
TAP_GROUP = 12
#: The most output channels a ``conv`` unit computes together (their accumulators share each load).
CHANNEL_BLOCK = 4


def compilable(node: Node) -> str | None:
    """Why the ``conv``/``conv_weight`` node is not compiled (None: it is); its layout is checked
    when the kernel is built."""
    if node.op not in CONV_OPS:
        return f"{node.op} is not a direct convolution"
    dtype = node.output.type.dtype
    if dtype not in (dt.float32, dt.float64):
        return f"{node.op} of {dtype.name} runs on its eager kernel"
    if batch_symbol(node) is None and not all(is_static(v.type.shape) for v in (*node.inputs, *node.outputs)):
        return f"{node.op} over symbolic sizes other than one batch size runs on its eager kernel"
    if len(node.attrs["stride"]) != 2:
        return f"{node.op} of {len(node.attrs['stride'])} spatial dims runs on its eager kernel (2-d only)"
    if tuple(node.attrs["stride"]) != (1, 1):
        return f"{node.op} with stride {tuple(node.attrs['stride'])} runs on its eager kernel (unit strides only)"
    return None


def batch_symbol(node: Node) -> Sym | None:
    """The symbolic batch size of a ``conv``/``conv_weight`` node: one symbol that leads ``conv``'s
    input and result (both of ``conv_weight``'s inputs), every other size static; None otherwise."""
    batched = (node.inputs[0], node.output) if node.op == "conv" else node.inputs
    lead = {v.type.shape[0] for v in batched}
    sym = lead.pop() if len(lead) == 1 else None
    if not isinstance(sym, Sym):
        return None
    others = [v for v in (*node.inputs, *node.outputs) if all(v is not b for b in batched)]
    shapes = [*(v.type.shape[1:] for v in batched), *(v.type.shape for v in others)]
    return sym if all(is_static(shape) for shape in shapes) else None


def multiply_adds(node: Node) -> int:
    """The multiply-adds of a ``conv`` or ``conv_weight`` node: each output element sums over the
    filter (conv) or over every sample's output positions (conv_weight). Per sample over a symbolic
    batch (``batch_symbol``)."""
    first, second = node.inputs[0].type.shape, static_shape(node.inputs[1])
    samples = first[0] if isinstance(first[0], int) else 1
    if node.op == "conv":
        return samples * math.prod(static_shape(node.output)[1:]) * math.prod(second[1:])
    return node.output.type.numel * samples * math.prod(static_shape(node.inputs[0])[2:])


def work_bytes(node: Node) -> int:
    """Bytes moved, plus the multiply-adds as the time of moving 2 bytes each (compute-bound)."""
    return moved_bytes(node) + 2 * multiply_adds(node)


def symbolic_info(node: Node, extent: int | tuple[int, int]) -> tuple:
    """``(symbols, fixed_extent, rows_per_size, rows_per_unit, fixed_bytes, bytes_per_size)`` of a node
    over a symbolic batch (``KernelInfo``): a ``conv``'s units are samples times channel blocks, a
    ``conv_weight``'s are its filter's (static); the work of a sample is its share of the bytes and
    of the multiply-adds."""
    sym = batch_symbol(node)
    assert sym is not None, f"{node.op} over symbolic sizes other than a batch"
    fixed = per_sample = 0
    for v in (*node.inputs, *node.outputs):
        itemsize = v.type.dtype.itemsize
        if v.type.shape[0] == sym:
            per_sample += math.prod(static_shape(v)[1:]) * itemsize
        else:
            fixed += math.prod(static_shape(v)) * itemsize
    per_sample += 2 * multiply_adds(node)
    if isinstance(extent, tuple):
        return (sym,), 0, extent[0], extent[1], fixed, per_sample
    return (sym,), extent, 0, 1, fixed, per_sample


def emit(builder: ir.IRBuilder, params: Sequence[ir.Value], node: Node, layouts) -> int | tuple[int, int]:
    """Emit ``node``'s function body at ``builder`` (the entry block of ``(args, begin, end)``);
    return its number of parallel units (over a symbolic batch: units per sample, 1)."""
    why = compilable(node)
    if why is not None:
        raise Unsupported(why)
    if 0 in (node.output.type.shape[1:] if node.op == "conv" else node.output.type.shape):
        builder.ret_void()  # no output channels (or input channels of a filter gradient)
        return 0 if batch_symbol(node) is None else (0, 1)
    args, begin, end = params
    pointers = operand_pointers(builder, args, 3)
    if node.op == "conv":
        extent = forward(builder, pointers, begin, end, node, [tuple(s) for s in layouts])
    else:
        first = node.inputs[0].type.shape[0]
        samples = i64(first) if isinstance(first, int) else symbol_size(builder, args, 3)
        extent = _weight(builder, pointers, begin, end, node, [tuple(s) for s in layouts], samples)
    builder.ret_void()
    return extent


def _add(builder, *terms):
    total = terms[0]
    for term in terms[1:]:
        total = builder.add(total, term, flags=("nsw",))
    return total


def _mul(builder, value, constant: int):
    return builder.mul(value, i64(constant), flags=("nsw",))


def channel_block(channels: int) -> int:
    return next(b for b in range(CHANNEL_BLOCK, 0, -1) if channels % b == 0)


def _unit_columns(node: Node, operand: int, what: str, strides) -> None:
    """The kernels read rows as contiguous vectors: an input of several columns needs unit column
    steps (an empty one, or one of single columns, reads none)."""
    shape = node.inputs[operand].type.shape  # its batch may be symbolic (never 0 then)
    if strides[3] != 1 and shape[3] != 1 and 0 not in shape:
        raise Unsupported(f"{node.op} of a {what} whose rows are not contiguous runs on its eager kernel")


def _taps(node: Node, kernel, row_stride: int) -> list[int]:
    """Each kernel offset's shift into the input, in (kh, kw) order."""
    dh, dw = node.attrs["dilation"]
    return [i * dh * row_stride + j * dw for i in range(kernel[0]) for j in range(kernel[1])]


def forward(builder, pointers, begin, end, node: Node, layouts, epilogue=None) -> int | tuple[int, int]:
    """``conv``'s loops; with an ``epilogue`` (``conv_epilogue``), each unit's block of output
    channels goes to the epilogue's stack slab instead, and the epilogue then runs on it. Returns the
    number of units (over a symbolic batch: units per sample, 1)."""
    x_ptr, w_ptr, out_ptr = pointers
    n_size, (_, c_size, *_) = node.inputs[0].type.shape[0], static_shape(node.inputs[0])  # n_size: maybe a Sym
    o_size, _, kh, kw = static_shape(node.inputs[1])
    oh_size, ow_size = static_shape(node.output)[2:]
    _unit_columns(node, 0, "input", layouts[0])
    xn, xc, xr, _ = layouts[0]
    wo, wc, wkh, wkw = layouts[1]
    rows = Rows(node.output.type.dtype, ow_size)
    block = channel_block(o_size)
    blocks = o_size // block
    slots = rows.slots(builder, block)
    out_base = out_ptr if epilogue is None else epilogue.slab
    taps = list(zip(_taps(node, (kh, kw), xr), [i * wkh + j * wkw for i in range(kh) for j in range(kw)], strict=True))
    with for_range(builder, begin, end, name="unit", vectorize=False) as unit:
        n = builder.udiv(unit, i64(blocks))
        o0 = _mul(builder, builder.urem(unit, i64(blocks)), block)
        if epilogue is None:
            out_at = _mul(builder, _add(builder, _mul(builder, n, o_size), o0), oh_size * ow_size)
        else:  # the unit's block of channels, (block, OH, OW) in C order
            out_at = i64(0)
        with for_range(builder, 0, oh_size, name="oh", vectorize=False) as oh:
            x_row = _add(builder, _mul(builder, n, xn), _mul(builder, oh, xr))
            out_row = _add(builder, out_at, _mul(builder, oh, ow_size))

            def chunk(column, masked: bool, x_row=x_row, out_row=out_row) -> None:
                for slot in slots:
                    builder.store(rows.zero(), slot)
                with for_range(builder, 0, c_size, name="c", vectorize=False) as c:
                    x_at = _add(builder, x_row, _mul(builder, c, xc), column)
                    w_at = [_add(builder, _mul(builder, builder.add(o0, i64(b)), wo), _mul(builder, c, wc))
                            for b in range(block)]  # fmt: skip
                    sums = [builder.load(slot, typ=rows.vector) for slot in slots]
                    for shift, w_offset in taps:
                        xv = rows.load(builder, x_ptr, builder.add(x_at, i64(shift), flags=("nsw",)), masked)
                        for b in range(block):
                            w_elem = element_pointer(builder, w_ptr, builder.add(w_at[b], i64(w_offset)), rows.dtype)
                            weight = rows.splat(builder, builder.load(w_elem, typ=rows.kind))
                            sums[b] = rows.fma(builder, weight, xv, sums[b])
                    for slot, total in zip(slots, sums, strict=True):
                        builder.store(total, slot)
                for b, slot in enumerate(slots):
                    at = _add(builder, out_row, i64(b * oh_size * ow_size), column)
                    rows.store(builder, builder.load(slot, typ=rows.vector), out_base, at, masked)

            rows.chunks(builder, chunk)
        if epilogue is not None:
            epilogue.emit(n, o0)
    return n_size * blocks if isinstance(n_size, int) else (blocks, 1)


def _weight(builder, pointers, begin, end, node: Node, layouts, samples: ir.Value) -> int:
    """``conv_weight``'s loops, over ``samples`` samples (an i64: the batch size)."""
    g_ptr, x_ptr, out_ptr = pointers
    (_, o_size, oh_size, ow_size), (_, c_size, *_) = static_shape(node.inputs[0]), static_shape(node.inputs[1])
    _unit_columns(node, 0, "output gradient", layouts[0])
    _unit_columns(node, 1, "input", layouts[1])
    gn, go, goh, _ = layouts[0]
    xn, xc, xr, _ = layouts[1]
    rows = Rows(node.output.type.dtype, ow_size)
    shifts = _taps(node, node.attrs["kernel_size"], xr)
    taps = len(shifts)
    groups = -(-taps // TAP_GROUP)
    slots = rows.slots(builder, min(taps, TAP_GROUP))
    with for_range(builder, begin, end, name="unit", vectorize=False) as unit:
        o = builder.udiv(unit, i64(c_size))
        c = builder.urem(unit, i64(c_size))
        out_at = _mul(builder, unit, taps)  # the output (O, C, KH, KW) is C order: unit o * C + c
        for group in range(groups):
            first = taps * group // groups
            group_shifts = shifts[first : taps * (group + 1) // groups]
            group_slots = slots[: len(group_shifts)]
            for slot in group_slots:
                builder.store(rows.zero(), slot)
            with for_range(builder, 0, samples, name="n", vectorize=False) as n:
                g_at = _add(builder, _mul(builder, n, gn), _mul(builder, o, go))
                x_at = _add(builder, _mul(builder, n, xn), _mul(builder, c, xc))
                with for_range(builder, 0, oh_size, name="oh", vectorize=False) as oh:
                    g_row = _add(builder, g_at, _mul(builder, oh, goh))
                    x_row = _add(builder, x_at, _mul(builder, oh, xr))

                    def chunk(column, masked: bool, g_row=g_row, x_row=x_row, group_shifts=group_shifts,
                              group_slots=group_slots) -> None:  # fmt: skip
                        gv = rows.load(builder, g_ptr, builder.add(g_row, column, flags=("nsw",)), masked)
                        x_start = builder.add(x_row, column, flags=("nsw",))
                        for shift, slot in zip(group_shifts, group_slots, strict=True):
                            xv = rows.load(builder, x_ptr, builder.add(x_start, i64(shift), flags=("nsw",)), masked)
                            builder.store(rows.fma(builder, gv, xv, builder.load(slot, typ=rows.vector)), slot)

                    rows.chunks(builder, chunk)
            for t, slot in enumerate(group_slots):
                vector = builder.load(slot, typ=rows.vector)
                total = builder.extract_element(vector, i64(0))
                for k in range(1, rows.lanes):
                    total = builder.fadd(total, builder.extract_element(vector, i64(k)))
                builder.store(total, element_pointer(builder, out_ptr, builder.add(out_at, i64(first + t)), rows.dtype))
    return o_size * c_size
