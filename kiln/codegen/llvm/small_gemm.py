"""A small matrix product emitted inline: ``C (+)= A @ B`` for the native recurrences' per-step products.

``emit_product`` writes ``C[m, n] = A[m, k] @ B[k, n]`` (``accumulate``: ``C += ...``) into the
function being built: ``m`` (the batch) is a run-time value, ``n`` and ``k`` (from the hidden size)
are compile-time; ``B`` is row-major (contiguous, or rows ``ldb`` elements apart), rows of ``A`` and ``C``
have run-time strides.

Why not the BLAS: an LSTM LM's step product (16 x 128 @ 128 x 512) is too small for OpenBLAS to
amortize its per-call work, and numpy's OpenBLAS runs its AVX2 kernels where it is told to
(``OPENBLAS_CORETYPE=Haswell`` on this project's machines) while LLVM targets the host's AVX-512.
Measured on the project's 2-core AMD EPYC (AVX-512), float32, hidden 128, batch 16, one thread,
the LSTM recurrence of 35 steps: see ``recurrence.py``.

The product runs in register tiles of ``tile_rows()`` rows of ``A`` by ``VECTORS`` vectors of columns
(8 x 2 x 16 float32 = 16 AVX-512 accumulators): per ``k``, ``VECTORS`` loads of ``B``'s row, one
broadcast of each row's ``A[r, k]`` and ``host.ROWS x VECTORS`` fused multiply-adds, the accumulators
kept in SSA values across the ``k`` loop. Rows past the last whole tile run one at a time, each
reading all of ``B`` -- where ``half_tile`` is asked for, half a tile's rows of them first as one
tile: a recurrence's batch (the ``m`` of each step's product) of 4, 12 or 20 rows, whose rows
left over ran its steps' products at a quarter of a tile's speed (an LSTM layer, hidden 128, 35
steps, 1 thread, CPU time: batch 4 727-1215 -> 279-355 us, 12 1800-1820 -> 699-983, 20 1698-2208 ->
1141-1355). Products of many rows (``product_ir``) do without it: a few rows left over are a
sliver of their work, and the tile's code is LLVM's time at every cold compile. Columns past the
last whole tile run as one narrower tile whose last vector is masked (``vectors.Rows``).
Each element sums its ``k`` products in order, so the result does not depend on ``m``.
"""

from __future__ import annotations

from llvmlite import ir

from ...ir.dtypes import DType
from .body import element_pointer
from .host import tile_rows
from .loops import I64, for_range, i64
from .vectors import VECTOR_BYTES, Rows

#: Vectors of columns a register tile takes.
VECTORS = 2


def emit_product(builder: ir.IRBuilder, dtype: DType, m: ir.Value, n: int, k: int | ir.Value, a: ir.Value,
                 lda: ir.Value, b: ir.Value, c: ir.Value, ldc: ir.Value, accumulate: bool, *, rows: int | None = None,
                 a_step: ir.Value | None = None, first: ir.Value | None = None,
                 ldb: ir.Value | None = None, half_tile: bool = False) -> None:  # fmt: skip
    """Emit ``C = A @ B`` (``accumulate``: ``C += A @ B``) at the builder's position (see the module docs)
    for rows ``first`` (default 0) to ``m``: ``a``, ``b``, ``c`` pointers to the first elements,
    ``lda``/``ldc`` i64 row strides in elements, ``a_step`` the stride of ``A``'s k (default 1: an
    ``A`` stored transposed has row stride 1 and ``a_step`` its leading dimension), ``ldb`` B's row
    stride (default ``n``: contiguous), ``k`` a constant or an i64 value (0: C unchanged, or zeros);
    ``rows``: the register tile's rows (``tile_rows()``); ``half_tile``: half a tile's rows or more left
    after the whole tiles run as one tile of half its rows (see the module docs)."""
    rows = tile_rows() if rows is None else rows
    lanes = VECTOR_BYTES // dtype.itemsize
    width = VECTORS * lanes
    full_tiles, tail = divmod(n, width)
    whole = Rows(dtype, width)
    narrow = Rows(dtype, tail) if tail else None
    first = i64(0) if first is None else first
    step = i64(1) if a_step is None else a_step
    count_k = i64(k) if isinstance(k, int) else k
    may_be_empty = not isinstance(k, int) or k < 1

    def block(first_row: ir.Value, count: int) -> None:
        a_rows = [_row(builder, dtype, a, first_row, r, lda) for r in range(count)]
        c_rows = [_row(builder, dtype, c, first_row, r, ldc) for r in range(count)]
        operands = _Operands(a_rows, step, b, i64(n) if ldb is None else ldb, c_rows, n, count_k, may_be_empty)
        if full_tiles:
            with for_range(builder, 0, full_tiles, name="col_tile", vectorize=False) as tile:
                _tile(builder, whole, operands, builder.mul(tile, i64(width), flags=("nsw",)), accumulate)
        if narrow is not None:
            _tile(builder, narrow, operands, i64(full_tiles * width), accumulate)

    blocks = builder.sdiv(builder.sub(m, first), i64(rows))
    with for_range(builder, 0, blocks, name="row_tile", vectorize=False) as row_tile:
        block(builder.add(first, builder.mul(row_tile, i64(rows), flags=("nsw",)), flags=("nsw",)), rows)
    rest = builder.add(first, builder.mul(blocks, i64(rows), flags=("nsw",)), flags=("nsw",))
    if half_tile and rows >= 4 and rows % 2 == 0:  # half a tile's rows left or more: one tile of those
        half = rows // 2
        has_half = builder.icmp_signed(">=", builder.sub(m, rest), i64(half))
        with builder.if_then(has_half):
            block(rest, half)
        rest = builder.add(rest, builder.select(has_half, i64(half), i64(0)), flags=("nsw",))
    with for_range(builder, rest, m, name="row", vectorize=False) as row:
        block(row, 1)


class _Operands:
    """One row block's operands: row pointers of ``A`` and ``C``, ``A``'s k stride, ``B`` and its row
    stride, the sizes."""

    def __init__(self, a_rows: list, a_step: ir.Value, b: ir.Value, ldb: ir.Value, c_rows: list, n: int,
                 k: ir.Value, may_be_empty: bool) -> None:  # fmt: skip
        self.a_rows, self.a_step, self.b, self.ldb, self.c_rows = a_rows, a_step, b, ldb, c_rows
        self.n, self.k, self.may_be_empty = n, k, may_be_empty


def _row(builder: ir.IRBuilder, dtype: DType, base: ir.Value, first: ir.Value, offset: int, stride: ir.Value):
    """A pointer to row ``first + offset`` of ``base``."""
    index = builder.add(first, i64(offset), flags=("nsw",)) if offset else first
    return element_pointer(builder, base, builder.mul(index, stride, flags=("nsw",)), dtype)


def _tile(builder: ir.IRBuilder, rows: Rows, x: _Operands, column: ir.Value, accumulate: bool) -> None:
    """One register tile: ``x``'s rows by ``rows``' vectors of columns from ``column``."""
    masks = [False] * rows.full + ([True] if rows.tail else [])
    offsets = [builder.add(column, i64(v * rows.lanes), flags=("nsw",)) for v in range(len(masks))]
    pairs = [(r, v) for r in range(len(x.a_rows)) for v in range(len(masks))]
    initial = {(r, v): rows.load(builder, x.c_rows[r], offsets[v], masks[v]) if accumulate else rows.zero()
               for r, v in pairs}  # fmt: skip
    # the k loop, its accumulators in phis; entered only where k > 0 when k may be 0
    entry = builder.block
    body = builder.function.append_basic_block("kk.body")
    done = builder.function.append_basic_block("kk.exit")
    if x.may_be_empty:
        builder.cbranch(builder.icmp_signed(">", x.k, i64(0)), body, done)
    else:
        builder.branch(body)
    builder.position_at_end(body)
    kk = builder.phi(I64, name="kk")
    kk.add_incoming(i64(0), entry)
    phis = {pair: builder.phi(rows.vector) for pair in pairs}
    for pair in pairs:
        phis[pair].add_incoming(initial[pair], entry)
    b_row = builder.mul(kk, x.ldb, flags=("nsw",))
    b_vectors = [rows.load(builder, x.b, builder.add(b_row, offsets[v], flags=("nsw",)), masks[v])
                 for v in range(len(masks))]  # fmt: skip
    a_at = builder.mul(kk, x.a_step, flags=("nsw",))
    splats = [rows.splat(builder, builder.load(element_pointer(builder, a_row, a_at, rows.dtype), typ=rows.kind))
              for a_row in x.a_rows]  # fmt: skip
    updated = {(r, v): rows.fma(builder, splats[r], b_vectors[v], phis[r, v]) for r, v in pairs}
    following = builder.add(kk, i64(1), flags=("nsw",))
    latch = builder.block
    kk.add_incoming(following, latch)
    for pair in pairs:
        phis[pair].add_incoming(updated[pair], latch)
    builder.cbranch(builder.icmp_signed("<", following, x.k), body, done)
    builder.position_at_end(done)
    final = updated
    if x.may_be_empty:  # (the phis first: LLVM wants them at the top of the block)
        final = {pair: builder.phi(rows.vector) for pair in pairs}
        for pair in pairs:
            final[pair].add_incoming(initial[pair], entry)
            final[pair].add_incoming(updated[pair], latch)
    for r, v in pairs:
        rows.store(builder, final[r, v], x.c_rows[r], offsets[v], masks[v])
