"""Index nodes compiled: ``take`` (a gather of rows) and ``index_put`` (a scatter, or scatter-add).

An embedding's forward is ``take(table, idx)`` and its gradient ``index_put(zeros, g, idx,
accumulate=True)``; their eager kernels are numpy's fancy indexing and a sorted ``add.reduceat``
(hundreds of microseconds for an NCF table). Here each is one function ``void @sym(ptr args, i64
begin, i64 end)`` like a fused kernel (``kernels.py``), specialized on the node's static shapes and
its inputs' strides, for one index tensor over the leading dim (``x[idx]``): other keys stay on
the eager kernel.

An index is read once per use, wrapped when negative and checked against the dim: an index out
of range writes nothing for it and sets the status word, the table slot after the outputs. The
executor then runs the node on its eager kernel, which raises the error the eager call raises
(``KernelCall``), so a compiled call fails exactly as an eager one.

- ``take``: a unit is a block of index positions; each copies its row (the trailing dims, read
  at their strides) into the C-order output, a short contiguous row as a few vectors.
- ``index_put``: a unit is a block of columns (elements of a row of ``x``): it copies its columns
  of ``x`` into the output, then writes (or adds) its columns of each indexed row, index after
  index in order. Threads own disjoint columns, so there are no races, and every element sees
  its updates in index order -- the eager kernel's result, bit for bit, however units are split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.graph import Node
from ...ir.types import is_static
from ..core import Unsupported
from .body import element_pointer, operand_pointers
from .emitter import memory_type
from .kernel_info import INDEX_OPS, moved_bytes
from .loops import CHUNK, I64, for_range, i64, minimum, static_shape
from .vectors import transfer_row

# A unit: about ``CHUNK`` elements, rows of a take, columns (times the rows they span) of an index_put.
_VALUE_DTYPES = (dt.float32, dt.float64, dt.int32, dt.int64)
_INDEX_DTYPES = (dt.int32, dt.int64)


def _collapse(shape: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    """``(size, stride)`` of the dims that address the same elements as ``shape``/``strides``,
    merged where one steps over the next exactly; size-1 dims dropped."""
    dims: list[tuple[int, int]] = []
    for size, stride in zip(shape, strides, strict=True):
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:
            dims[-1] = (dims[-1][0] * size, stride)
        else:
            dims.append((size, stride))
    return dims


def _flat(shape: Sequence[int], strides: Sequence[int]) -> int | None:
    """The one stride that walks ``shape`` in C order (0 for a single element), None if there is none."""
    dims = _collapse(shape, strides)
    if len(dims) > 1:
        return None
    return dims[0][1] if dims else 0


def _broadcast_strides(shape: Sequence[int], strides: Sequence[int], target: Sequence[int]) -> list[int]:
    """Strides that read an array of ``shape`` broadcast to ``target`` (0 along broadcast dims)."""
    pad = len(target) - len(shape)
    full = [1] * pad + list(shape)
    steps = [0] * pad + list(strides)
    return [0 if n == 1 and t != 1 else s for n, t, s in zip(full, target, steps, strict=True)]


def compilable(node: Node, layouts: Sequence[tuple[int, ...]] | None = None) -> str | None:
    """Why the index node ``node`` is not compiled (None: it is); with ``layouts`` (its inputs'
    element strides) also whether they can be walked with one stride per part."""
    if node.op not in INDEX_OPS:
        return f"{node.op} is not an index op"
    x = node.inputs[0]
    indices = node.inputs[1:] if node.op == "take" else node.inputs[2:]
    if len(indices) != 1:
        return f"{node.op} with {len(indices)} index tensors runs on its eager kernel"
    if x.type.ndim < 1 or x.type.dtype not in _VALUE_DTYPES:
        return f"{node.op} of {x.type.dtype.name} runs on its eager kernel"
    if 0 in x.type.shape[1:]:  # rows of no elements: no unit would read an index to check it
        return f"{node.op} of empty rows runs on its eager kernel"
    if indices[0].type.dtype not in _INDEX_DTYPES:
        return f"{node.op} with {indices[0].type.dtype.name} indices runs on its eager kernel"
    if not all(is_static(v.type.shape) for v in (*node.inputs, *node.outputs)):
        return f"{node.op} over a symbolic dimension runs on its eager kernel"
    if layouts is not None and _geometry(node, layouts) is None:
        return f"{node.op} of inputs with these strides runs on its eager kernel"
    return None


class _Geometry:
    """A node's parts, each walked with one stride: ``positions`` index positions (the index
    tensor's elements, and the rows of values) of ``columns`` elements (a row of ``x``)."""

    def __init__(self, x_shape, positions, columns, idx_stride, x_row, x_column, v_row=0, v_column=0):
        self.rows = x_shape[0]  # the indexed dim
        self.positions, self.columns = positions, columns
        self.idx_stride = idx_stride
        self.x_row, self.x_column = x_row, x_column  # x's strides: leading dim, a row's elements
        self.v_row, self.v_column = v_row, v_column  # values' strides: per position, per column


def _geometry(node: Node, layouts: Sequence[tuple[int, ...]]) -> _Geometry | None:
    x_shape = static_shape(node.inputs[0])
    x_strides = layouts[0]
    idx_pos = 1 if node.op == "take" else 2
    idx_shape = static_shape(node.inputs[idx_pos])
    positions, columns = math.prod(idx_shape), math.prod(x_shape[1:])
    idx_stride = _flat(idx_shape, layouts[idx_pos])
    x_column = _flat(x_shape[1:], x_strides[1:])
    if idx_stride is None or x_column is None:
        return None
    if node.op == "take":
        return _Geometry(x_shape, positions, columns, idx_stride, x_strides[0], x_column)
    indexed = idx_shape + x_shape[1:]
    v_strides = _broadcast_strides(static_shape(node.inputs[1]), layouts[1], indexed)
    v_row = _flat(idx_shape, v_strides[: len(idx_shape)])
    v_column = _flat(x_shape[1:], v_strides[len(idx_shape) :])
    if v_row is None or v_column is None:
        return None
    return _Geometry(x_shape, positions, columns, idx_stride, x_strides[0], x_column, v_row, v_column)


def work_bytes(node: Node) -> int:
    """Bytes moved: take reads only the rows it takes (the output's size) and writes the output;
    index_put reads and writes every operand."""
    if node.op == "take":
        return sum(v.type.numel * v.type.dtype.itemsize for v in (*node.inputs[1:], node.output, node.output))
    return moved_bytes(node)


def emit(builder: ir.IRBuilder, params: Sequence[ir.Value], node: Node, layouts: Sequence[tuple[int, ...]]) -> int:
    """Emit ``node``'s function body at ``builder``, the entry block of ``(args, begin, end)`` =
    ``params``; return its extent."""
    why = compilable(node, layouts)
    if why is not None:
        raise Unsupported(why)
    geometry = _geometry(node, layouts)
    assert geometry is not None  # compilable checked it
    args, begin, end = params
    pointers = operand_pointers(builder, args, len(node.inputs) + 2)  # the inputs, the output, the status word
    write = _take if node.op == "take" else _index_put
    extent = write(builder, pointers, begin, end, node, geometry)
    builder.ret_void()
    return extent


def _row(builder: ir.IRBuilder, idx: ir.Value, idx_dtype: dt.DType, position: ir.Value, g: _Geometry,
         status: ir.Value) -> tuple[ir.Value, ir.Value]:  # fmt: skip
    """The row index at ``position`` (wrapped when negative) and whether it is in range; an index out
    of range sets the status word."""
    at = builder.mul(position, i64(g.idx_stride), flags=("nsw",))
    value = builder.load(element_pointer(builder, idx, at, idx_dtype), typ=memory_type(idx_dtype))
    if idx_dtype is not dt.int64:
        value = builder.sext(value, I64)
    wrapped = builder.select(builder.icmp_signed("<", value, i64(0)), builder.add(value, i64(g.rows)), value)
    ok = builder.icmp_unsigned("<", wrapped, i64(g.rows))
    with builder.if_then(builder.not_(ok), likely=False):
        builder.store(i64(1), status)  # every unit that finds one stores the same 1
    return wrapped, ok


def _take(builder, pointers, begin, end, node: Node, g: _Geometry) -> int:
    x, idx, out, status = pointers
    dtype, idx_dtype = node.output.type.dtype, node.inputs[1].type.dtype
    per_unit = max(1, CHUNK // max(1, g.columns))
    extent = -(-g.positions // per_unit) if g.positions and g.columns else 0
    first = builder.mul(begin, i64(per_unit), flags=("nsw",))
    last = minimum(builder, builder.mul(end, i64(per_unit), flags=("nsw",)), i64(g.positions))
    with for_range(builder, first, last, name="p", vectorize=False) as position:
        row, ok = _row(builder, idx, idx_dtype, position, g, status)
        with builder.if_then(ok, likely=True):
            src = builder.mul(row, i64(g.x_row), flags=("nsw",))
            dst = builder.mul(position, i64(g.columns), flags=("nsw",))
            transfer_row(builder, g.columns, (x, src), (out, dst), g.x_column, 1, dtype, add=False)
    return extent


def _index_put(builder, pointers, begin, end, node: Node, g: _Geometry) -> int:
    x, values, idx, out, status = pointers
    dtype, idx_dtype = node.output.type.dtype, node.inputs[2].type.dtype
    accumulate = bool(node.attrs["accumulate"])
    # a unit: ``width`` columns over every row of x (the copy) and every index position (the writes)
    width = min(g.columns, max(1, CHUNK // max(1, g.rows + g.positions)))
    extent = -(-g.columns // width) if g.columns else 0
    first = builder.mul(begin, i64(width), flags=("nsw",))
    last = minimum(builder, builder.mul(end, i64(width), flags=("nsw",)), i64(g.columns))
    element = memory_type(dtype)
    with for_range(builder, 0, g.rows, name="r", vectorize=False) as r:
        src = builder.mul(r, i64(g.x_row), flags=("nsw",))
        dst = builder.mul(r, i64(g.columns), flags=("nsw",))
        with for_range(builder, first, last, name="c", parallel=True) as c:
            at = builder.add(src, builder.mul(c, i64(g.x_column), flags=("nsw",)), flags=("nsw",))
            value = builder.load(element_pointer(builder, x, at, dtype), typ=element)
            builder.store(value, element_pointer(builder, out, builder.add(dst, c, flags=("nsw",)), dtype))
    with for_range(builder, 0, g.positions, name="p", vectorize=False) as position:
        row, ok = _row(builder, idx, idx_dtype, position, g, status)
        with builder.if_then(ok, likely=True):
            src = builder.mul(position, i64(g.v_row), flags=("nsw",))
            dst = builder.mul(row, i64(g.columns), flags=("nsw",))
            # one index's columns are distinct elements; the next index may hit the same row
            with for_range(builder, first, last, name="c", parallel=True) as c:
                at = builder.add(src, builder.mul(c, i64(g.v_column), flags=("nsw",)), flags=("nsw",))
                value = builder.load(element_pointer(builder, values, at, dtype), typ=element)
                target = element_pointer(builder, out, builder.add(dst, c, flags=("nsw",)), dtype)
                if accumulate:
                    old = builder.load(target, typ=element)
                    value = builder.fadd(old, value) if dtype.is_floating_point else builder.add(old, value)
                builder.store(value, target)
    return extent
