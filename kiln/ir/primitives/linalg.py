"""The matmul primitive: batched matrix products with numpy-style broadcasting of batch dims.

Both inputs have at least two dimensions and one dtype; the frontend's ``matmul`` handles
vectors (PyTorch's 1-D rules) by adding and removing a unit dimension around this primitive.
The eager kernel is ``xp.matmul``, which hands float32/float64 products straight to BLAS. A
stack of matrices times one matrix (a linear layer over (batch, time, features)) is one product
over the stacked rows: numpy's matmul would run one small GEMM per matrix of the stack (2.2x
slower for (32, 35, 256) @ (256, 10000) here). A product with a tiny output and a long inner
dim (a first convolution's weight gradient) is a sum of products over blocks of that dim
(``_inner_blocks``). Where a faster product is installed (``install_product``: the frontend's
``eager_products``, kiln's own product kernels), a 2-d product, a C-contiguous stack of rows
times a matrix or a stack of products of the same batch dims asks it first.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..shapes import broadcast_shapes
from ..types import TensorType
from . import Kind, Primitive, Sample, register


def _shape_text(shape) -> str:
    return "x".join(str(d) for d in shape)


def _matmul_infer(a: TensorType, b: TensorType) -> TensorType:
    if a.ndim < 2 or b.ndim < 2:
        raise RuntimeError(
            f"matmul: expected inputs with at least 2 dimensions, got shapes {list(a.shape)} and {list(b.shape)}"
        )
    if a.dtype is not b.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {a.dtype.name} != {b.dtype.name}")
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({_shape_text(a.shape)} and {_shape_text(b.shape)}): "
            f"the last dim of the first ({a.shape[-1]}) must equal the second-to-last dim of the second ({b.shape[-2]})"
        )
    try:
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError as error:
        raise RuntimeError(
            f"matmul: the batch dims of shapes {list(a.shape)} and {list(b.shape)} do not broadcast: {error}"
        ) from None
    return TensorType((*batch, a.shape[-2], b.shape[-1]), a.dtype, a.device)


def _matmul_vjp(ops, c, g):
    # d(a @ b) = g @ b^T for a and a^T @ g for b, summed over the batch dims each input was
    # broadcast along.
    a, b = c.inputs
    ta, tb = c.input_types
    ga = gb = None
    if c.needs_input_grad[0]:
        ga = ops.sum_to(ops.matmul(g, ops.transpose(b, -1, -2)), ta.shape)
    if c.needs_input_grad[1] and tb.ndim == 2 and ta.ndim > 2:
        # One matrix b for a whole batch of a's (a linear layer on (batch, time, features)): the
        # sum over the batch of a_i^T g_i is one product with the batch folded into the summed
        # dim, (a's rows)^T @ (g's rows), rather than a product per batch element and a sum.
        rows = math.prod(ta.shape[:-1])
        gb = ops.matmul(ops.transpose(ops.reshape(a, (rows, ta.shape[-1])), 0, 1), ops.reshape(g, (rows, tb.shape[-1])))
    elif c.needs_input_grad[1]:
        gb = ops.sum_to(ops.matmul(ops.transpose(a, -1, -2), g), tb.shape)
    return ga, gb


def _matmul_samples(rng):
    n = rng.normal
    return [
        Sample((n(size=(2, 3)), n(size=(3, 4)))),
        Sample((n(size=(5, 2, 3)), n(size=(5, 3, 4)))),
        Sample((n(size=(2, 1, 2, 3)), n(size=(4, 3, 2)))),  # batch dims broadcast
        Sample((n(size=(2, 3)), n(size=(2, 3, 4)))),
        Sample((n(size=(2, 5, 3)), n(size=(3, 4)))),  # one b for a batch of a's (its gradient folds the batch)
        Sample((n(size=(3, 2)).T, n(size=(3, 1))), gradcheck=False),  # a transposed input (gradcheck wants contiguous)
        Sample((n(size=(0, 3)), n(size=(3, 2)))),
        Sample((n(size=(2, 0)), n(size=(0, 2)))),  # empty inner dim: zeros
    ]


def _row_order(a, b) -> tuple[int, ...] | None:
    """An order of ``a``'s leading dims in which its rows lie stacked in memory (no copy), when
    ``a @ b`` is a stack of matrices times one matrix ``b``: then it is one product of those rows
    (numpy's matmul would run one small GEMM per matrix of the stack). The identity when ``a`` is
    C-contiguous; another order for a transposed stack (an RNN's batch_first output)."""
    if b.ndim != 2 or a.ndim <= 2 or a.size == 0:
        return None
    if a.flags.c_contiguous:
        return tuple(range(a.ndim - 1))
    lead = sorted(range(a.ndim - 1), key=lambda d: -a.strides[d])
    permuted = a.transpose(*lead, a.ndim - 1)
    return tuple(lead) if permuted.flags.c_contiguous else None


def _product_of_rows(xp, a, b, order: tuple[int, ...]):
    """``a @ b`` as one product of ``a``'s rows taken in ``order`` (see ``_row_order``), laid out in that order."""
    rows = a.transpose(*order, a.ndim - 1)
    product = xp.matmul(rows.reshape(-1, a.shape[-1]), b).reshape(*rows.shape[:-1], b.shape[-1])
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return product.transpose(*inverse, a.ndim - 1)


def _swapped(a, b) -> bool:
    """Whether the product ``a @ b`` runs faster as ``(b^T @ a^T)^T``: a long inner dim and an
    output with fewer rows than columns (a weight gradient, ``g @ cols^T``). OpenBLAS's sgemm on
    these shapes, 2 threads (us): 1106 -> 629 for (6, 50176) @ (50176, 25), 470 -> 255 for
    (16, 6400) @ (6400, 150), 18.7 -> 15.8 ms for (64, 32768) @ (32768, 576). The output is
    small, so laying it back out in C order costs little."""
    if a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a.ndim < 2:  # the same batch (a conv's groups)
        return False
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    return m < n and k >= 4 * n


#: the most multiply-adds of a product OpenBLAS (0.3.31, the numpy wheels' BLAS) runs in its
#: small-matrix kernels here: a (6, K) @ (K, 25) product ran at 77 GFLOP/s to K = 6144 and at
#: 14 GFLOP/s from K = 8192 on, where its packed kernels take over (2 threads, this machine)
SMALL_PRODUCT = 1 << 20
#: the most output elements of a product that is summed over blocks of its inner dim (from 256
#: on, the blocks were slower than one product: (16, 65536) @ (65536, 16) 1009 -> 1098 us)
BLOCKED_MAX_OUTPUT = 160


def _inner_blocks(a, b) -> int:
    """How many blocks of the inner dim ``a @ b`` is summed over: 1 but for a numpy float product
    with at most BLOCKED_MAX_OUTPUT output elements and more than SMALL_PRODUCT multiply-adds, whose
    blocks are then products small enough for BLAS's small-matrix kernels. Measured on 2 threads
    (us): LeNet-5's conv1 weight gradient (6, 50176) @ (50176, 25) 1067 -> 224 in 8 blocks (641
    swapped), (25, 50176) @ (50176, 6) 625 -> 219, (10, 100000) @ (100000, 10) 1347 -> 271."""
    if not isinstance(a, np.ndarray) or a.dtype.char not in "fd":
        return 1
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if m * n > BLOCKED_MAX_OUTPUT or m * n * k <= SMALL_PRODUCT:
        return 1
    return -(-m * n * k // SMALL_PRODUCT)


def _blocked_product(xp, a, b, blocks: int, out=None):
    """``a @ b`` as the sum of ``blocks`` products over consecutive blocks of the inner dim (into
    ``out`` when given; through a buffer of its own if ``out`` overlaps an input, which a later
    block still reads)."""
    if out is not None and (np.may_share_memory(out, a) or np.may_share_memory(out, b)):
        xp.copyto(out, _blocked_product(xp, a, b, blocks))
        return out
    k = a.shape[-1]
    edges = [k * i // blocks for i in range(blocks + 1)]
    result = xp.matmul(a[..., : edges[1]], b[..., : edges[1], :], out=out)
    for begin, end in zip(edges[1:-1], edges[2:], strict=True):
        result += xp.matmul(a[..., begin:end], b[..., begin:end, :])
    return result


def _transposed(x):
    return x.swapaxes(-1, -2)


#: A transposed matrix of at least this many elements is laid out in C order block by block
#: (``c_order``); below it numpy's one pass is as fast.
BLOCKED_TRANSPOSE_MIN = 1 << 14
#: Rows of the matrix transposed per block: 64 rows of 128 float32 (32 KiB) read, written as 64
#: columns, stay in the cache between the two.
TRANSPOSE_BLOCK = 64
#: A matrix whose rows lie a multiple of this many bytes apart is copied to rows ``ROW_PAD`` elements
#: longer before it is transposed (``c_order``).
ALIASED_ROWS = 1024
ROW_PAD = 16


def padded_row_length(n: int, itemsize: int) -> int:
    """The row stride, in elements, of a matrix of ``n`` columns that a kernel reads row after row down
    its columns (a recurrence's ``W_hh^T``, its product's B): ``n``, or ``n + ROW_PAD`` where rows ``n``
    elements apart would lie a multiple of ``ALIASED_ROWS`` bytes apart -- in the same few cache sets,
    which evict each other: an LSTM of hidden 1024 (B rows 16 KiB apart) ran its forward 2.3x slower
    than one of hidden 1000 or 1040 (batch 20, 30 steps)."""
    return n + ROW_PAD if (n * itemsize) % ALIASED_ROWS == 0 else n


def lies_padded(a: np.ndarray) -> bool:
    """Whether ``a`` (2-d) already has the rows ``padded_rows`` gives it (so that it returns ``a``)."""
    stride = padded_row_length(a.shape[1], a.itemsize)
    return a.strides[1] == a.itemsize and (a.strides[0] == stride * a.itemsize or a.shape[0] <= 1)


def padded_rows(a: np.ndarray) -> np.ndarray:
    """``a`` (2-d) with contiguous rows ``padded_row_length`` elements apart: ``a`` itself where it
    lies so, else a copy (a transposed matrix through ``c_order``'s blocks)."""
    if lies_padded(a):
        return a
    rows, columns = a.shape
    stride = padded_row_length(columns, a.itemsize)
    if stride == columns:
        return np.ascontiguousarray(c_order(a))
    out = np.empty((rows, stride), dtype=a.dtype)[:, :columns]
    out[...] = c_order(a)
    return out


def c_order(a: np.ndarray) -> np.ndarray:
    """``a`` in C order: ``a`` itself when it is, else a copy. The transpose of a C-order matrix (a
    weight's ``W.T`` as a product's B: an LSTM's ``W_ih.T`` and ``W_hh.T``, a decoder's, at every eager
    step) is copied in blocks of ``TRANSPOSE_BLOCK`` of its rows: numpy's one pass writes each output
    row across the whole input, (512, 128) float32 in 44 us where the blocks take 19 (one thread).

    >>> w = np.arange(6.0).reshape(2, 3)
    >>> c_order(w.T).tolist(), c_order(w) is w
    ([[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]], True)
    """
    if a.flags.c_contiguous:
        return a
    if a.ndim != 2 or not a.T.flags.c_contiguous or a.size < BLOCKED_TRANSPOSE_MIN:
        return np.ascontiguousarray(a)
    out = np.empty(a.shape, dtype=a.dtype)
    rows = a.T  # the C-order matrix
    if rows.strides[0] % ALIASED_ROWS == 0:
        # Rows a multiple of 1 KiB apart: a column's elements all map to the same few cache sets, which
        # then evict each other as the copy reads it. Rows moved ``ROW_PAD`` elements further apart first
        # (a copy at memory speed) fall in different sets: (64, 1024) float32 transposed in 29 us
        # against 185, (1024, 1024) in 0.56 ms against 3.05 (a Linear(1024, 64)'s weight, a
        # transformer's 4d -> d projection; 1 thread).
        padded = np.empty((rows.shape[0], rows.shape[1] + ROW_PAD), dtype=a.dtype)[:, : rows.shape[1]]
        padded[...] = rows
        rows = padded
    for start in range(0, rows.shape[0], TRANSPOSE_BLOCK):
        out[:, start : start + TRANSPOSE_BLOCK] = rows[start : start + TRANSPOSE_BLOCK].T
    return out


def row_stride(b: np.ndarray) -> int | None:
    """The row stride in elements of a matrix ``b`` whose rows are contiguous (its columns one element
    apart, its rows a whole number of elements apart, never closer than a row's length), else None:
    a product's ``B`` that kiln's product kernel reads as it lies (``b_operand``).

    >>> w = np.zeros((4, 6), np.float32)
    >>> row_stride(w), row_stride(w[:, :3]), row_stride(w.T)
    (6, 6, None)
    """
    (k, n), (row, column), item = b.shape, b.strides, b.itemsize
    if n > 1 and column != item:
        return None
    if k <= 1:
        return n
    if row % item or row < n * item:
        return None
    return row // item


def b_operand(b: np.ndarray) -> np.ndarray:
    """``b`` as kiln's product kernel reads its ``B``: as it lies where its rows are contiguous (a
    column slice of a wider buffer: an LSTM's gates' gradient, packed with the backward's other
    outputs, two weight gradients' operand a layer, 560x128 copied in 20-40 us each), else in C order."""
    return b if row_stride(b) is not None else c_order(b)


def _rows_in_order(xp, a, b):
    """``(a, order)``: ``a`` with its rows stacked in ``order`` (``_row_order``), or None. A
    transposed stack (an RNN's batch_first output) is copied into C order first when it is
    smaller than the product, which then lands in C order at once: a language model's decoder,
    (32, 35, 256) @ (256, 10000) from time-major memory, 38 -> 31 ms a step on 2 threads against
    computing the product in the stack's order and copying that."""
    order = _row_order(a, b)
    if order is None:
        return None
    in_order = tuple(range(a.ndim - 1))
    if order != in_order and a.shape[-1] <= b.shape[-1]:
        return xp.ascontiguousarray(a), in_order
    return a, order


#: ``provider(a, b, out=None)``: ``a @ b`` of 2-d arrays, or of stacks of matrices of the same batch
#: dims, into ``out`` (or a new array), or None where it declines (numpy's product runs); installed by
#: a layer above (``install_product``).
_product: list[Callable[..., np.ndarray | None]] = []


def install_product(provider: Callable[..., np.ndarray | None] | None) -> None:
    """Let the matmul kernels ask ``provider`` first (None: numpy's products only)."""
    _product[:] = [] if provider is None else [provider]


def _installed(a, b, out=None):
    """``a @ b`` by the installed product (see ``_product``), or None."""
    if not _product or a.ndim < 2 or not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return None
    if a.size == 0 or b.size == 0:  # (numpy's: nothing to gain, and -1 reshapes of empty arrays are ambiguous)
        return None
    if b.ndim != 2:  # a stack of products: the same batch dims only (no broadcast)
        return _product[0](a, b, out) if a.shape[:-2] == b.shape[:-2] else None
    if a.ndim == 2:
        return _product[0](a, b, out)
    if out is not None and not out.flags.c_contiguous:
        return None
    if not a.flags.c_contiguous:  # a transposed stack (an RNN's batch_first output): as _rows_in_order
        if a.shape[-1] > b.shape[-1]:
            return None
        a = np.ascontiguousarray(a)
    rows = a.reshape(-1, a.shape[-1])  # a stack of rows times one matrix: one product
    result = _product[0](rows, b, None if out is None else out.reshape(-1, out.shape[-1]))
    if result is None:
        return None
    return result.reshape(*a.shape[:-1], b.shape[-1]) if out is None else out


def _small_rows(a, b, out=None) -> bool:
    """Whether ``a @ b`` is one small BLAS product of ``a``'s rows as they lie, with nothing to choose:
    ``b`` a matrix, ``a`` (and ``out``) C-ordered numpy arrays, at most SMALL_PRODUCT multiply-adds
    (one block; ``_swapped``'s gains were measured on products of 7M and more, and swapping costs a
    copy: 16x204 @ 204x51 took 7.2 us swapped against 4.9). An LSTMCell loop's trip makes four
    such products a time step, each paying 1.2-2.8 us for the choices below."""
    return (
        b.ndim == 2 and a.ndim >= 2 and isinstance(a, np.ndarray) and a.flags.c_contiguous
        and (out is None or out.flags.c_contiguous) and a.size * b.shape[1] <= SMALL_PRODUCT
    )  # fmt: skip


def _rows_product(xp, a, b, out=None):
    """``a @ b`` for ``_small_rows``: one product of ``a``'s rows (a stack's reshaped, a matrix as it is)."""
    if a.ndim == 2:
        return xp.matmul(a, b) if out is None else xp.matmul(a, b, out=out)
    count = math.prod(a.shape[:-1])  # not -1: a product with no columns has size 0
    rows = a.reshape(count, a.shape[-1])
    if out is None:
        return xp.matmul(rows, b).reshape(*a.shape[:-1], b.shape[-1])
    xp.matmul(rows, b, out=out.reshape(count, b.shape[-1]))
    return out


def _matmul_eager(xp, a, b):
    if _product and (result := _installed(a, b)) is not None:
        return result
    if _small_rows(a, b):
        return _rows_product(xp, a, b)
    blocks = _inner_blocks(a, b)
    if blocks > 1:
        return _blocked_product(xp, a, b, blocks)
    if _swapped(a, b):
        return xp.ascontiguousarray(_transposed(xp.matmul(_transposed(b), _transposed(a))))
    stacked = _rows_in_order(xp, a, b)
    if stacked is None:
        return xp.matmul(a, b)
    a, order = stacked
    return xp.ascontiguousarray(_product_of_rows(xp, a, b, order))  # C order, as every matmul result


def _matmul_into(xp, a, b, *, out):
    if _product and _installed(a, b, out) is not None:
        return out
    if _small_rows(a, b, out):
        return _rows_product(xp, a, b, out)
    blocks = _inner_blocks(a, b)
    if blocks > 1:
        return _blocked_product(xp, a, b, blocks, out=out)
    if _swapped(a, b):
        xp.copyto(out, _transposed(xp.matmul(_transposed(b), _transposed(a))))
        return out
    stacked = _rows_in_order(xp, a, b)
    if stacked is None:
        return xp.matmul(a, b, out=out)
    a, order = stacked
    if out.flags.c_contiguous and order == tuple(range(a.ndim - 1)):
        rows = math.prod(a.shape[:-1])  # not -1: an output with no columns has size 0
        xp.matmul(a.reshape(rows, a.shape[-1]), b, out=out.reshape(rows, out.shape[-1]))
        return out
    xp.copyto(out, _product_of_rows(xp, a, b, order))
    return out


matmul = register(Primitive(
    "matmul", Kind.MATMUL, _matmul_infer, _matmul_eager, _matmul_vjp, save_inputs=True,
    reference=lambda torch, a, b: torch.matmul(a, b), samples=_matmul_samples,
    eager_into=_matmul_into,
    doc="a @ b over the last two dims, batch dims broadcast (numpy's rules); inputs have ndim >= 2.",
))  # fmt: skip
