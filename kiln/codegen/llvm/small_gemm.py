"""A small matrix product emitted inline: ``C (+)= A @ B`` for the native recurrences' per-step products.

``emit_product`` writes ``C[m, n] = A[m, k] @ B[k, n]`` (``accumulate``: ``C += ...``) into the
function being built: ``m`` (the batch) is a run-time value, ``n`` and ``k`` (from the hidden size)
are compile-time; ``B`` is row-major and contiguous, rows of ``A`` and ``C`` have run-time strides.

Why not the BLAS: an LSTM LM's step product (16 x 128 @ 128 x 512) is too small for OpenBLAS to
amortize its per-call work, and numpy's OpenBLAS runs its AVX2 kernels where it is told to
(``OPENBLAS_CORETYPE=Haswell`` on this project's machines) while LLVM targets the host's AVX-512.
Measured on the project's 2-core AMD EPYC (AVX-512), float32, hidden 128, batch 16, one thread,
the LSTM recurrence of 35 steps: see ``recurrence.py``.

The product runs in register tiles of ``ROWS`` rows of ``A`` by ``VECTORS`` vectors of columns
(8 x 2 x 16 float32 = 16 AVX-512 accumulators): per ``k``, ``VECTORS`` loads of ``B``'s row, one
broadcast of each row's ``A[r, k]`` and ``ROWS x VECTORS`` fused multiply-adds, the accumulators
kept in SSA values across the ``k`` loop. Rows past the last whole tile run one at a time; columns
past the last whole tile run as one narrower tile whose last vector is masked (``vectors.Rows``).
Each element sums its ``k`` products in order, so the result does not depend on ``m``.
"""

from __future__ import annotations

from llvmlite import ir

from ...ir.dtypes import DType
from .body import element_pointer
from .loops import I64, for_range, i64
from .vectors import VECTOR_BYTES, Rows

#: Rows of ``A`` a register tile takes (fewer where the host has no AVX-512: its 16 vector
#: registers hold half as many accumulators).
ROWS = 8
#: Vectors of columns a register tile takes.
VECTORS = 2


def emit_product(builder: ir.IRBuilder, dtype: DType, m: ir.Value, n: int, k: int, a: ir.Value, lda: ir.Value,
                 b: ir.Value, c: ir.Value, ldc: ir.Value, accumulate: bool, rows: int = ROWS) -> None:  # fmt: skip
    """Emit ``C = A @ B`` (``accumulate``: ``C += A @ B``) at the builder's position (see the module docs):
    ``a``, ``b``, ``c`` pointers to the first elements, ``lda``/``ldc`` i64 row strides in elements."""
    lanes = VECTOR_BYTES // dtype.itemsize
    width = VECTORS * lanes
    full_tiles, tail = divmod(n, width)
    whole = Rows(dtype, width)
    narrow = Rows(dtype, tail) if tail else None

    def block(first_row: ir.Value, count: int) -> None:
        a_rows = [_row(builder, dtype, a, first_row, r, lda) for r in range(count)]
        c_rows = [_row(builder, dtype, c, first_row, r, ldc) for r in range(count)]
        if full_tiles:
            with for_range(builder, 0, full_tiles, name="col_tile", vectorize=False) as tile:
                column = builder.mul(tile, i64(width), flags=("nsw",))
                _tile(builder, whole, a_rows, b, c_rows, column, n, k, accumulate)
        if narrow is not None:
            _tile(builder, narrow, a_rows, b, c_rows, i64(full_tiles * width), n, k, accumulate)

    blocks = builder.sdiv(m, i64(rows))
    with for_range(builder, 0, blocks, name="row_tile", vectorize=False) as row_tile:
        block(builder.mul(row_tile, i64(rows), flags=("nsw",)), rows)
    with for_range(builder, builder.mul(blocks, i64(rows), flags=("nsw",)), m, name="row", vectorize=False) as row:
        block(row, 1)


def _row(builder: ir.IRBuilder, dtype: DType, base: ir.Value, first: ir.Value, offset: int, stride: ir.Value):
    """A pointer to row ``first + offset`` of ``base``."""
    index = builder.add(first, i64(offset), flags=("nsw",)) if offset else first
    return element_pointer(builder, base, builder.mul(index, stride, flags=("nsw",)), dtype)


def _tile(builder: ir.IRBuilder, rows: Rows, a_rows: list, b: ir.Value, c_rows: list, column: ir.Value, n: int,
          k: int, accumulate: bool) -> None:  # fmt: skip
    """One register tile: the rows ``a_rows``/``c_rows`` by ``rows``' vectors of columns from ``column``."""
    masks = [False] * rows.full + ([True] if rows.tail else [])
    offsets = [builder.add(column, i64(v * rows.lanes), flags=("nsw",)) for v in range(len(masks))]

    def each(make):
        return [[make(r, v) for v in range(len(masks))] for r in range(len(a_rows))]

    initial = each(lambda r, v: rows.load(builder, c_rows[r], offsets[v], masks[v]) if accumulate else rows.zero())
    # the k loop, run at least once (k >= 1), its accumulators in phis
    entry = builder.block
    body = builder.function.append_basic_block("kk.body")
    done = builder.function.append_basic_block("kk.exit")
    builder.branch(body)
    builder.position_at_end(body)
    kk = builder.phi(I64, name="kk")
    kk.add_incoming(i64(0), entry)
    phis = each(lambda r, v: builder.phi(rows.vector))
    for r, v in ((r, v) for r in range(len(a_rows)) for v in range(len(masks))):
        phis[r][v].add_incoming(initial[r][v], entry)
    b_row = builder.mul(kk, i64(n), flags=("nsw",))
    b_vectors = [rows.load(builder, b, builder.add(b_row, offsets[v], flags=("nsw",)), masks[v])
                 for v in range(len(masks))]  # fmt: skip
    updated = []
    for r, a_row in enumerate(a_rows):
        scalar = builder.load(element_pointer(builder, a_row, kk, rows.dtype), typ=rows.kind)
        splat = rows.splat(builder, scalar)
        updated.append([rows.fma(builder, splat, b_vectors[v], phis[r][v]) for v in range(len(masks))])
    following = builder.add(kk, i64(1), flags=("nsw",))
    latch = builder.block
    kk.add_incoming(following, latch)
    for r, v in ((r, v) for r in range(len(a_rows)) for v in range(len(masks))):
        phis[r][v].add_incoming(updated[r][v], latch)
    builder.cbranch(builder.icmp_signed("<", following, i64(k)), body, done)
    builder.position_at_end(done)
    for r, v in ((r, v) for r in range(len(a_rows)) for v in range(len(masks))):
        rows.store(builder, updated[r][v], c_rows[r], offsets[v], masks[v])
