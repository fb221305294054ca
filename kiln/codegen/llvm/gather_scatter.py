"""Index nodes compiled: ``take`` (a gather of rows) and ``index_put`` (a scatter, or scatter-add).

An embedding's forward is ``take(table, idx)`` and its gradient ``index_put(zeros, g, idx,
accumulate=True)``; their eager kernels are numpy's ``take`` and rows added in rounds of distinct
rows (``indexing._add_rows``: hundreds of microseconds for an NCF table's gradient). Here each is one function ``void @sym(ptr args, i64
begin, i64 end)`` like a fused kernel (``kernels.py``), specialized on the node's static shapes and
its inputs' strides, for one index tensor over the leading dim (``x[idx]``): other keys stay on
the eager kernel. The index positions (the index tensor's elements, an index_put's rows of values)
are walked in C order through as many (size, stride) dims as their strides need (``_walk``): an
LSTM LM's embedding gradient arrives as a (16, 35, 128) view of time-major memory, whose positions
no one stride walks; on the eager kernel (a copy, then rows added in rounds) it took 340 us of a
training step, compiled 20-30 us. Over a dynamic batch the index positions may be symbolic (``(B, T)`` token ids):
their number is read from the table after the pointers (the status word follows it), the table
``x`` stays static (``symbolic_info``).

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
from ...ir.types import Dim, Sym, is_static, sym_product
from ..core import Unsupported
from .body import element_pointer, operand_pointers
from .emitter import memory_type
from .kernel_info import INDEX_OPS, moved_bytes
from .loops import CHUNK, I64, for_range, i64, minimum, static_shape
from .symbolic import symbol_size
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


#: A walk of index positions in C order: ``(size, stride)`` per dim, outermost first (``_walk``); one
#: dim of size None where the positions are symbolic (a single stride).
Walk = tuple[tuple[int | None, int], ...]


def _walk(shape: Sequence[int], strides: Sequence[int]) -> Walk:
    """The dims that walk ``shape`` in C order at ``strides`` (``_collapse``'s); ``((1, 0),)`` for a
    single element."""
    return tuple(_collapse(shape, strides)) or ((1, 0),)


def _walk_offset(builder: ir.IRBuilder, position: ir.Value, walk: Walk) -> ir.Value:
    """The element offset of the ``position``-th position (C order) of ``walk``: one multiply for one dim,
    else a division by a constant (a multiply and shifts) and a remainder per dim."""
    offset, rest = None, position
    for size, stride in reversed(walk[1:]):  # innermost first (static: only the outermost may be None)
        assert size is not None
        index = builder.urem(rest, i64(size))
        rest = builder.udiv(rest, i64(size))
        term = builder.mul(index, i64(stride), flags=("nsw",))
        offset = term if offset is None else builder.add(offset, term, flags=("nsw",))
    outer = builder.mul(rest, i64(walk[0][1]), flags=("nsw",))
    return outer if offset is None else builder.add(offset, outer, flags=("nsw",))


#: The most dims a walk of positions may take (more: the eager kernel; a (B, T) index over a permuted
#: layout takes two).
_MAX_WALK = 3


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
    if not is_static(x.type.shape) or not is_static(indices[0].type.shape) and not _symbolic_positions(node):
        return f"{node.op} over a symbolic dimension runs on its eager kernel"
    if layouts is not None and _geometry(node, layouts) is None:
        return f"{node.op} of inputs with these strides runs on its eager kernel"
    return None


def _symbolic_positions(node: Node) -> bool:
    """Whether only the index positions are symbolic (an embedding over a batch of dynamic lengths),
    the values of an index_put having the indexed shape (no broadcast)."""
    idx = node.inputs[1 if node.op == "take" else 2]
    if node.op == "index_put" and node.inputs[1].type.shape != idx.type.shape + node.inputs[0].type.shape[1:]:
        return False
    return bool(idx.type.symbols)


def _walk_positions(shape: Sequence[Dim], strides: Sequence[int]) -> Walk | None:
    """The walk (``_walk``) of index positions of ``shape``, which may be symbolic (then one stride,
    else None). A value whose C-order strides follow a symbolic size is C order (``SymbolicProgram``
    loads the code only at sizes where it is): its stride is 1; a symbolic leading size alone leaves
    the strides static, which merge as they are given."""
    if is_static(shape):
        walk = _walk(static_shape_of(shape), strides)
        return walk if len(walk) <= _MAX_WALK else None
    dims = [d for d in shape if d != 1]
    if any(isinstance(d, Sym) for d in dims[1:]):
        return ((None, 1),)
    stride = _flat([2 if isinstance(d, Sym) else d for d in shape], strides)  # the leading size merges nothing
    return None if stride is None else ((None, stride),)


class _Geometry:
    """A node's parts: ``positions`` index positions (the index tensor's elements, and the rows of
    values, each walked by a ``Walk``) of ``columns`` elements (a row of ``x``, walked with one stride)."""

    def __init__(self, x_shape, positions, columns, idx_walk: Walk, x_row, x_column, v_walk: Walk = ((None, 0),),
                 v_column=0):  # fmt: skip
        self.rows = x_shape[0]  # the indexed dim
        self.positions, self.columns = positions, columns
        self.idx_walk = idx_walk
        self.x_row, self.x_column = x_row, x_column  # x's strides: leading dim, a row's elements
        self.v_walk, self.v_column = v_walk, v_column  # values' positions, and their stride per column


def _geometry(node: Node, layouts: Sequence[tuple[int, ...]]) -> _Geometry | None:
    """The parts of ``node``; ``positions`` is None when they are symbolic (read at run time)."""
    x_shape = static_shape(node.inputs[0])
    x_strides = layouts[0]
    idx_pos = 1 if node.op == "take" else 2
    idx_shape = node.inputs[idx_pos].type.shape
    positions = math.prod(idx_shape) if is_static(idx_shape) else None  # type: ignore[arg-type]  # static
    columns = math.prod(x_shape[1:])
    idx_walk = _walk_positions(idx_shape, layouts[idx_pos])
    x_column = _flat(x_shape[1:], x_strides[1:])
    if idx_walk is None or x_column is None:
        return None
    if node.op == "take":
        return _Geometry(x_shape, positions, columns, idx_walk, x_strides[0], x_column)
    indexed = idx_shape + x_shape[1:]
    if positions is None:  # the values have the indexed shape (``_symbolic_positions``)
        v_walk, v_column = _symbolic_values(node.inputs[1].type.shape, layouts[1], len(idx_shape), columns)
        if v_walk is None or v_column is None:
            return None
        return _Geometry(x_shape, None, columns, idx_walk, x_strides[0], x_column, v_walk, v_column)
    v_strides = _broadcast_strides(static_shape(node.inputs[1]), layouts[1], static_shape_of(indexed))
    v_walk = _walk_positions(idx_shape, v_strides[: len(idx_shape)])
    v_column = _flat(x_shape[1:], v_strides[len(idx_shape) :])
    if v_walk is None or v_column is None:
        return None
    return _Geometry(x_shape, positions, columns, idx_walk, x_strides[0], x_column, v_walk, v_column)


def _symbolic_values(shape: Sequence[Dim], strides: Sequence[int], n_idx: int, columns: int):
    """``(v_walk, v_column)`` of an index_put's values of symbolic ``shape`` (positions, then a row of
    ``columns``), None where one stride does not walk them."""
    dims = [d for d in shape if d != 1]
    if any(isinstance(d, Sym) for d in dims[1:]):  # C order (see ``_walk_positions``)
        return ((None, columns),), 1
    return _walk_positions(shape[:n_idx], strides[:n_idx]), _flat(static_shape_of(shape[n_idx:]), strides[n_idx:])


def static_shape_of(shape: Sequence[Dim]) -> list[int]:
    """``shape``, whose sizes must all be static."""
    assert is_static(shape), f"a symbolic size in {list(map(str, shape))}"
    return [int(d) for d in shape]  # type: ignore[arg-type]  # static


def work_bytes(node: Node) -> int:
    """Bytes moved: take reads only the rows it takes (the output's size) and writes the output;
    index_put reads and writes every operand."""
    if node.op == "take":
        return sum(v.type.numel * v.type.dtype.itemsize for v in (*node.inputs[1:], node.output, node.output))
    return moved_bytes(node)


def emit(builder: ir.IRBuilder, params: Sequence[ir.Value], node: Node, layouts: Sequence[tuple[int, ...]]
         ) -> int | tuple[int, int]:  # fmt: skip
    """Emit ``node``'s function body at ``builder``, the entry block of ``(args, begin, end)`` =
    ``params``; return its extent (over symbolic positions, a take's ``(1, positions per unit)``)."""
    why = compilable(node, layouts)
    if why is not None:
        raise Unsupported(why)
    geometry = _geometry(node, layouts)
    assert geometry is not None  # compilable checked it
    args, begin, end = params
    operands = len(node.inputs) + 1  # the inputs, the output; then the size, if symbolic; the status word
    symbolic = geometry.positions is None
    if symbolic:
        geometry.positions = symbol_size(builder, args, operands)
    pointers = [*operand_pointers(builder, args, operands), *operand_pointers(builder, args, 1, operands + symbolic)]
    write = _take if node.op == "take" else _index_put
    extent = write(builder, pointers, begin, end, node, geometry)
    builder.ret_void()
    return extent


def symbolic_info(node: Node, extent: int | tuple[int, int]) -> tuple:
    """``(symbols, fixed_extent, rows_per_size, rows_per_unit, fixed_bytes, bytes_per_size)`` of an index
    node over symbolic positions (``KernelInfo``): a take's units are blocks of positions, an
    index_put's are its columns (static)."""
    x, idx = node.inputs[0], node.inputs[1 if node.op == "take" else 2]
    itemsize, columns = x.type.dtype.itemsize, math.prod(static_shape(x)[1:])
    per_position = idx.type.dtype.itemsize + columns * itemsize
    symbols = (sym_product(1, idx.type.shape),)
    if isinstance(extent, tuple):  # take: reads a row and writes it per position
        return symbols, 0, extent[0], extent[1], 0, per_position + columns * itemsize
    return symbols, extent, 0, 1, 2 * x.type.numel * itemsize, per_position


def _row(builder: ir.IRBuilder, idx: ir.Value, idx_dtype: dt.DType, position: ir.Value, g: _Geometry,
         status: ir.Value) -> tuple[ir.Value, ir.Value]:  # fmt: skip
    """The row index at ``position`` (wrapped when negative) and whether it is in range; an index out
    of range sets the status word."""
    at = _walk_offset(builder, position, g.idx_walk)
    value = builder.load(element_pointer(builder, idx, at, idx_dtype), typ=memory_type(idx_dtype))
    if idx_dtype is not dt.int64:
        value = builder.sext(value, I64)
    wrapped = builder.select(builder.icmp_signed("<", value, i64(0)), builder.add(value, i64(g.rows)), value)
    ok = builder.icmp_unsigned("<", wrapped, i64(g.rows))
    with builder.if_then(builder.not_(ok), likely=False):
        builder.store(i64(1), status)  # every unit that finds one stores the same 1
    return wrapped, ok


def _take(builder, pointers, begin, end, node: Node, g: _Geometry) -> int | tuple[int, int]:
    x, idx, out, status = pointers
    dtype, idx_dtype = node.output.type.dtype, node.inputs[1].type.dtype
    per_unit = max(1, CHUNK // max(1, g.columns))
    positions = g.positions if isinstance(g.positions, ir.Value) else i64(g.positions)
    if isinstance(g.positions, ir.Value):  # symbolic: (rows per position, positions per unit)
        extent: int | tuple[int, int] = (1, per_unit)
    else:
        extent = -(-g.positions // per_unit) if g.positions and g.columns else 0
    first = builder.mul(begin, i64(per_unit), flags=("nsw",))
    last = minimum(builder, builder.mul(end, i64(per_unit), flags=("nsw",)), positions)
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
    positions = g.positions if isinstance(g.positions, int) else g.rows  # symbolic: a guess at their number
    width = min(g.columns, max(1, CHUNK // max(1, g.rows + positions)))
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
            src = _walk_offset(builder, position, g.v_walk)
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
