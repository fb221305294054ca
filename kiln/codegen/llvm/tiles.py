"""The tile transforms compiled (``tile_transform``, ``untile_transform``: the Winograd convolution's
steps, ``kiln/ir/primitives/tiles.py``), with the window kernels' calling convention
(``window``): ``void @sym(ptr args, i64 begin, i64 end)`` over blocks of planes.

The matrix L is a compile-time constant: its zeros drop their terms and its ones their
multiplies, so Winograd's B^T and A^T become the adds and subtracts of the paper's formulas.

- ``tile_transform``: for each tile row, one loop along the row's tiles (the vectorized one)
  loads the ``t x t`` tile, combines its columns (``sum_c L[j][c] x[a][c]``) and then its rows
  into the ``alpha**2`` outputs, each stored into its own (element-major) output plane. A row of
  five tiles or more with contiguous columns runs in explicit vectors of tiles, each line of them
  loaded whole and split by shuffles (``_tile_row_by_vectors``). A plane of four tiles or fewer
  is too short a row to vectorize: the loop over planes is vectorized instead.
- ``untile_transform``: tile row by tile row, each tile's ``t x t`` result ``L^T v L`` is written
  into a stack buffer, a ring holding the last ``reach + 1`` tile rows (those that overlap an
  output row) with zero columns on both sides and one slot that stays zero; then each output row
  the tile row completes is one loop along it, every element the sum of the tile results
  covering it. The loads stay affine in the column (a tile outside the row reads the zero
  columns, a tile row outside the plane the zero slot), so the loop vectorizes without branches,
  and overlapping tiles (the input transform's adjoint) need no atomics. One tile a plane (the
  filter transform's adjoint) is vectorized across planes.
Threads own disjoint planes, and each element's sum runs in one fixed order, so results do not
depend on the number of threads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llvmlite import ir

from ...ir.graph import Node
from ..core import Unsupported
from .body import element_pointer
from .emitter import memory_type
from .loops import CHUNK, dot, for_range, i64, minimum, row_major_indices, static_shape

# A unit: blocks of planes of about ``CHUNK`` output elements (at least one plane).
#: The most stack an untile kernel's tile results take: rows of up to ~150 F(4x4, 3x3) tiles (600
#: pixels); a wider plane runs on the eager kernel.
STACK_BYTES = 64 * 1024


def _lanes(count: int, dtype) -> int | None:
    """Vector lanes for a loop of ``count`` iterations: the most that one 512-bit vector holds, and
    no more than the loop runs (a power of two); None below 4 (LLVM unrolls such a loop)."""
    lanes = 1 << (max(1, min(count, 64 // dtype.itemsize)).bit_length() - 1)
    return lanes if lanes >= 4 else None


def _splat(ftype: ir.Type, value: float) -> ir.Constant:
    """The constant ``value`` of a float type, or in every lane of a vector type."""
    if isinstance(ftype, ir.VectorType):
        return ir.Constant(ftype, [float(value)] * ftype.count)
    return ir.Constant(ftype, float(value))


def _lincomb(builder: ir.IRBuilder, terms: Sequence[tuple[float, ir.Value]], ftype: ir.Type) -> ir.Value:
    """sum(coefficient * value) with the zero terms dropped and no multiply by +-1 (``ftype``: a
    float type or a vector of one)."""
    total = None
    for coefficient, value in terms:
        if coefficient == 0:
            continue
        if coefficient in (1, -1):
            if total is None:
                total = value if coefficient == 1 else builder.fneg(value)
            else:
                total = builder.fadd(total, value) if coefficient == 1 else builder.fsub(total, value)
            continue
        term = builder.fmul(value, _splat(ftype, coefficient))
        total = term if total is None else builder.fadd(total, term)
    return _splat(ftype, 0.0) if total is None else total


def _offset(builder: ir.IRBuilder, *terms: tuple[ir.Value, int] | ir.Value) -> ir.Value:
    """The i64 sum of values and (value, coefficient) products."""
    total: ir.Value | None = None
    for term in terms:
        if isinstance(term, tuple):
            value, coefficient = term
            if coefficient == 0:
                continue
            term = value if coefficient == 1 else builder.mul(value, i64(coefficient), flags=("nsw",))
        total = term if total is None else builder.add(total, term, flags=("nsw",))
    return i64(0) if total is None else total


def _plane_base(builder: ir.IRBuilder, plane: ir.Value, sizes: Sequence[int], strides: Sequence[int]) -> ir.Value:
    """The element offset of flat plane ``plane`` over the batch dims ``sizes`` with ``strides``."""
    return dot(builder, list(zip(row_major_indices(builder, plane, sizes), strides, strict=True)))


def _transform(node: Node):
    """(matrix, stride, alpha, t, dtype, LLVM element type) of a tile or untile transform node."""
    matrix = node.attrs["matrix"]
    dtype = node.output.type.dtype
    return matrix, int(node.attrs["stride"]), len(matrix), len(matrix[0]), dtype, memory_type(dtype)


def tile(builder: ir.IRBuilder, pointers, begin, end, node: Node, strides: tuple[int, ...]) -> int:
    matrix, s, alpha, t, dtype, ftype = _transform(node)
    x_shape, out_shape = static_shape(node.inputs[0]), static_shape(node.output)
    batch, (th, tw) = x_shape[:-2], out_shape[-2:]
    planes = math.prod(batch)
    element = planes * th * tw  # the output's stride between transform elements
    s_batch, s_row, s_col = strides[:-2], strides[-2], strides[-1]
    per_unit = max(1, CHUNK // max(1, alpha * alpha * th * tw))
    first = builder.mul(begin, i64(per_unit), flags=("nsw",))
    last = minimum(builder, builder.mul(end, i64(per_unit), flags=("nsw",)), i64(planes))
    lanes = _lanes(tw, dtype)
    # rows of 5 tiles and more, contiguous: explicit vectors (F(4x4, 3x3) on 34 x 34 planes, 8 tiles a
    # row: 0.77x the time of the loop vectorizer's code; 32 x 32, 7 tiles: 0.76x); rows of 4 ran
    # 1.04-1.19x slower so (one 4-lane group a row), and keep the loop vectorizer's code
    by_vectors = tw > 4 and s_col == 1 and t >= s and lanes is not None
    # four tiles a plane or fewer (one: the filter transform): too short a row to vectorize, so the
    # loop over planes is declared parallel and vectorized instead
    with for_range(builder, first, last, name="plane", parallel=th * tw <= 4) as plane:
        base = _plane_base(builder, plane, batch, s_batch)
        with for_range(builder, 0, th, name="ty", vectorize=False) as ty:
            row = _offset(builder, base, (ty, s * s_row))
            out_row = _offset(builder, (plane, th * tw), (ty, tw))
            if by_vectors:
                assert lanes is not None
                _tile_row_by_vectors(builder, pointers, node, row, out_row, s_row, tw, lanes, element)
            else:
                with for_range(builder, 0, tw, name="tx", parallel=True, width=lanes) as tx:
                    at = _offset(builder, row, (tx, s * s_col))
                    x = [[builder.load(element_pointer(builder, pointers[0],
                                                       _offset(builder, at, i64(a * s_row + c * s_col)), dtype), typ=ftype)
                          for c in range(t)] for a in range(t)]  # fmt: skip
                    _transform_tile(builder, pointers[1], matrix, x, _offset(builder, out_row, tx), element, dtype)
    return -(-planes // per_unit) if planes else 0


def _tile_row_by_vectors(builder: ir.IRBuilder, pointers, node: Node, row: ir.Value, out_row: ir.Value,
                         s_row: int, tw: int, lanes: int, element: int) -> None:  # fmt: skip
    """One row of tiles, ``lanes`` tiles at a time in explicit vectors (contiguous columns, tiles
    at stride ``s <= t``): each of a tile row's ``t`` lines is one load of ``s * lanes`` elements
    and one of the ``t - s`` after them, split by shuffles into ``t`` vectors (column ``c`` of
    every tile). The loop vectorizer made the columns past ``s`` gathers (12 for F(4x4, 3x3)'s 8
    tiles). A row whose tile count ``lanes`` does not divide ends with a group that overlaps the
    one before it, recomputing and storing the same values again."""
    matrix, s, _, t, dtype, ftype = _transform(node)
    wide = ir.VectorType(ftype, s * lanes)
    extra, align = t - s, dtype.itemsize
    i32 = ir.IntType(32)

    def mask(indices: list[int]) -> ir.Constant:
        return ir.Constant(ir.VectorType(i32, len(indices)), indices)

    with for_range(builder, 0, -(-tw // lanes), name="group", vectorize=False) as group:
        tx0 = minimum(builder, builder.mul(group, i64(lanes), flags=("nsw",)), i64(tw - lanes))
        x = []
        for a in range(t):
            at = _offset(builder, row, (tx0, s), i64(a * s_row))
            main = builder.load(element_pointer(builder, pointers[0], at, dtype), typ=wide, align=align)
            after = main
            if extra:
                tail_type = ir.VectorType(ftype, extra)
                tail_at = element_pointer(builder, pointers[0], _offset(builder, at, i64(s * lanes)), dtype)
                tail = builder.load(tail_at, typ=tail_type, align=align)
                spread = [j if j < extra else 0 for j in range(s * lanes)]  # to main's width
                after = builder.shuffle_vector(tail, ir.Constant(tail_type, None), mask(spread))
            x.append([builder.shuffle_vector(main, after, mask([s * lane + c for lane in range(lanes)]))
                      for c in range(t)])  # fmt: skip
        _transform_tile(builder, pointers[1], matrix, x, _offset(builder, out_row, tx0), element, dtype)


def _transform_tile(builder: ir.IRBuilder, out, matrix, x: list[list[ir.Value]], out_at: ir.Value, element: int,
                    dtype) -> None:  # fmt: skip
    """Tile ``x`` (its ``t x t`` values: scalars, or vectors of a group of tiles) through ``matrix`` on
    both sides, each of the ``alpha**2`` results stored at ``out_at`` in its own plane (``element``
    apart in ``out``): its columns combined first, then its rows."""
    alpha, t = len(matrix), len(matrix[0])
    ftype = x[0][0].type
    cols = [[_lincomb(builder, list(zip(matrix[j], x[a])), ftype) for j in range(alpha)] for a in range(t)]
    for i in range(alpha):
        for j in range(alpha):
            value = _lincomb(builder, [(matrix[i][a], cols[a][j]) for a in range(t)], ftype)
            index = _offset(builder, out_at, i64((i * alpha + j) * element))
            builder.store(value, element_pointer(builder, out, index, dtype), align=dtype.itemsize)


def untile(builder: ir.IRBuilder, pointers, begin, end, node: Node, strides: tuple[int, ...]) -> int:
    matrix, s, alpha, t, dtype, ftype = _transform(node)
    v_shape, out_shape = static_shape(node.inputs[0]), static_shape(node.output)
    batch, (th, tw), (h, w) = v_shape[1:-2], v_shape[-2:], out_shape[-2:]
    planes = math.prod(batch)
    s_element, s_batch, s_ty, s_tx = strides[0], strides[1:-2], strides[-2], strides[-1]
    per_unit = max(1, CHUNK // max(1, h * w))
    reach = (t - 1) // s  # the tiles ry - q, q <= reach, cover output row (column) s*ry + rho
    zero = ir.Constant(ftype, 0.0)

    def load(index):
        return builder.load(element_pointer(builder, pointers[0], index, dtype), typ=ftype)

    first = builder.mul(begin, i64(per_unit), flags=("nsw",))
    last = minimum(builder, builder.mul(end, i64(per_unit), flags=("nsw",)), i64(planes))
    if th * tw == 1:  # one tile a plane (the filter transform's adjoint): vectorized across planes
        with for_range(builder, first, last, name="plane", parallel=True) as plane:
            v_base = _plane_base(builder, plane, batch, s_batch)
            v = [load(_offset(builder, v_base, i64(e * s_element))) for e in range(alpha * alpha)]
            out_base = builder.mul(plane, i64(h * w), flags=("nsw",))
            for a in range(h):
                rows = [_lincomb(builder, [(matrix[i][a], v[i * alpha + j]) for i in range(alpha)], ftype)
                        for j in range(alpha)] if a < t else []  # fmt: skip
                for c in range(w):
                    value = _lincomb(
                        builder, [(matrix[j][c], rows[j]) for j in range(alpha)] if rows and c < t else [], ftype
                    )
                    target = _offset(builder, out_base, i64(a * w + c))
                    builder.store(value, element_pointer(builder, pointers[1], target, dtype))
        return -(-planes // per_unit) if planes else 0
    # Tile row by tile row: each tile's t x t result, L^T v L, into a stack buffer (a slot of a ring
    # holding the last reach + 1 tile rows, zero columns on both sides), then the output rows the
    # tile row completes, each element the sum of the (reach + 1)^2 tile results covering it: the
    # loads stay affine in the column (tiles outside the row read the zero columns, tile rows
    # outside the plane a slot that stays zero), so the loops vectorize without branches.
    full, rest = divmod(w, s)
    width = max(full + 1, tw) + 2 * reach  # a buffer row: tile m - q at column m - q + reach
    slot = t * t * width
    slots = reach + 2  # the ring, and one slot of zeros
    if slots * slot * dtype.itemsize > STACK_BYTES:
        raise Unsupported(f"untile_transform of rows of {tw} tiles needs more than {STACK_BYTES} bytes of stack")
    buffer = builder.alloca(ir.ArrayType(ftype, slots * slot), name="tiles")
    with for_range(builder, 0, slots * slot, name="zero", parallel=True) as k:
        builder.store(zero, builder.gep(buffer, [i64(0), k], inbounds=True))

    def at(base, offset):
        return builder.gep(buffer, [i64(0), _offset(builder, base, offset)], inbounds=True)

    def group(covering, out_row, m, rhos) -> None:
        """Output columns s*m + rho (rho in ``rhos``) of the row at ``out_row``: the sum of the tile
        results covering each, from the buffer rows ``covering`` ((slot offset, row offset a))."""
        for rho_c in rhos:
            terms = [(1, builder.load(at(base, _offset(builder, m, i64((a * t + c) * width + reach - (c - rho_c) // s))),
                                      typ=ftype))
                     for base, a in covering for c in range(rho_c, t, s)]  # fmt: skip
            target = _offset(builder, out_row, _offset(builder, (m, s), i64(rho_c)))
            builder.store(_lincomb(builder, terms, ftype), element_pointer(builder, pointers[1], target, dtype))

    with for_range(builder, first, last, name="plane") as plane:
        v_base = _plane_base(builder, plane, batch, s_batch)
        out_base = builder.mul(plane, i64(h * w), flags=("nsw",))
        with for_range(builder, 0, -(-h // s), name="ry", vectorize=False) as ry:
            with builder.if_then(builder.icmp_signed("<", ry, i64(th))):  # this tile row's results
                v_row = _offset(builder, v_base, (ry, s_ty))
                own = builder.mul(builder.urem(ry, i64(reach + 1)), i64(slot), flags=("nsw",))
                with for_range(builder, 0, tw, name="tx", parallel=True, width=_lanes(tw, dtype)) as tx:
                    v_at = _offset(builder, v_row, (tx, s_tx))
                    v = [load(_offset(builder, v_at, i64(e * s_element))) for e in range(alpha * alpha)]
                    for a in range(t):
                        rows = [_lincomb(builder, [(matrix[i][a], v[i * alpha + j]) for i in range(alpha)], ftype)
                                for j in range(alpha)]  # fmt: skip
                        for c in range(t):
                            value = _lincomb(builder, [(matrix[j][c], rows[j]) for j in range(alpha)], ftype)
                            column = _offset(builder, tx, i64((a * t + c) * width + reach))
                            builder.store(value, at(own, column))
            for rho in range(s):
                r = _offset(builder, (ry, s), i64(rho))
                exists = (
                    builder.icmp_signed("<", r, i64(h)) if h % s and rho >= h % s else ir.Constant(ir.IntType(1), 1)
                )
                with builder.if_then(exists):
                    covering = []  # (slot offset, row offset a) of the tile rows ry - q covering row r
                    for q in range(reach + 1):
                        if rho + s * q < t:
                            ty = builder.sub(ry, i64(q), flags=("nsw",))
                            inside = builder.and_(
                                builder.icmp_signed(">=", ty, i64(0)), builder.icmp_signed("<", ty, i64(th))
                            )
                            ring = builder.mul(
                                builder.urem(builder.select(inside, ty, i64(0)), i64(reach + 1)), i64(slot)
                            )
                            covering.append((builder.select(inside, ring, i64((reach + 1) * slot)), rho + s * q))
                    out_row = _offset(builder, out_base, (r, w))
                    with for_range(builder, 0, full, name="m", parallel=True, width=_lanes(full, dtype)) as m:
                        group(covering, out_row, m, range(s))
                    if rest:  # the last, partial group of columns
                        group(covering, out_row, i64(full), range(rest))
    return -(-planes // per_unit) if planes else 0
