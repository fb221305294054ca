"""Matrix products on kiln's own product kernel (``codegen/llvm/product_call.py``) rather than numpy's BLAS.

Importing this installs ``product`` as the matmul primitive's faster product
(``ir/primitives/linalg.install_product``): eager matmuls and compiled programs' matmul calls of
2-D float operands (or a C-contiguous stack of rows times a matrix, a linear layer's) of the
sizes it is measured faster at (``_kernel``) run on it, as do the eager RNN layers' large products
(``matmul``). The kernel compiles once per dtype, column count and accumulation, in
``eager_kernels``' background thread and cache (``KILN_EAGER_KERNELS=0`` keeps numpy; ``=sync``
compiles in the caller's thread), and into the disk cache of compiled kernels; numpy runs until it
is ready, and for what it declines (``Product.__call__``).

Why: numpy's OpenBLAS runs its AVX2 kernels here (``OPENBLAS_CORETYPE=Haswell``), LLVM targets the
host's AVX-512; and OpenBLAS splits a product statically over its threads, so a product waits for a
core another process holds, where kiln's pool hands out row tiles as threads come. float32, one
thread, medians: 560x128 @ 128x512 289 us against OpenBLAS's 570 us; 512x560 @ 560x128 (A
transposed) 285-291 us against 560-572 us. On 2 threads OpenBLAS took 275-300 us with both cores
free and 16 ms medians in runs where another process held one.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import cast

import numpy as np

from ..ir.primitives import linalg
from . import eager_kernels

#: The eager-kernel cache's name of the kernels (its warnings say it).
NAME = "matrix product"
#: Smaller products stay on numpy: the kernel's lookup and call cost a few microseconds (an MLP's
#: 64x64 @ 64x128 products, 0.5M multiply-adds, gained nothing: its step 0.95 -> 1.00x PyTorch's).
MIN_MACS = 1 << 22
#: Fewer columns stay on numpy: the kernel's column tile is 32 float32s wide, so a narrow product
#: wastes most of its lanes (64x128 @ 128x10: 4.8 us against numpy's 3.0).
MIN_COLUMNS = 32
#: Fewer rows of A stay on numpy: less than one register tile of rows.
MIN_ROWS = 8
#: A larger B (bytes) stays on numpy: every row tile reads all of B, which then no longer stays in the
#: core's cache (128x784 @ 784x512, B 1.6 MB, still took 0.67x numpy's time; a convolution's weight
#: gradient, B of megabytes, is numpy's blocked product's case).
MAX_B_BYTES = 2 << 20
#: A product whose B must be copied (a transposed weight: a Linear's forward; B whose rows are contiguous,
#: however far apart, is read as it lies: ``linalg.b_operand``) runs on the
#: kernel from this many rows of A on: numpy's transposing copy takes about 0.6 ns an element of B
#: here, the kernel about 0.008 ns per row and element, so the copy costs 72/rows of the product (an
#: MLP's 64-row batch: its step went 0.95 -> 1.02x PyTorch's with the copy at 16 rows).
MIN_ROWS_WITH_COPY = 256


#: A kernel as ``_kernel`` hands it out (a module constant: ``Callable[..., bool]`` spelled at each call
#: cost 0.7 us of it).
_Kernel = Callable[..., bool]


def _compile(dtype: np.dtype, n: int, accumulate: bool, batched: bool = False) -> eager_kernels.Entry:
    from ..codegen.core import Unsupported  # noqa: PLC0415 - the code generator loads only when first needed
    from ..codegen.llvm.product_call import BatchedProduct, Product  # noqa: PLC0415

    start = time.perf_counter()
    try:
        kernel = BatchedProduct.build(dtype, n) if batched else Product.build(dtype, n, accumulate)
    except Unsupported as error:
        return eager_kernels.Entry(reason=str(error))
    except Exception as error:  # noqa: BLE001 - any failure leaves the products on numpy, said once
        return eager_kernels.Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
    return eager_kernels.Entry(program=cast(Callable[[list], list], kernel), seconds=time.perf_counter() - start)


def _kernel(a: np.ndarray, b: np.ndarray, accumulate: bool) -> Callable[..., bool] | None:
    """The compiled kernel for ``a @ b`` when ready; None (numpy runs) otherwise."""
    # the size first: most products an eager step makes are declined by it (an MLP's), at every call
    if a.ndim != 2 or b.ndim != 2:
        return None
    (m, k), n = a.shape, b.shape[1]
    if m * k * n < MIN_MACS or n < MIN_COLUMNS or m < MIN_ROWS or b.nbytes > MAX_B_BYTES:
        return None
    if a.dtype.char not in "fd" or a.dtype != b.dtype or not eager_kernels.enabled():
        return None
    if m < MIN_ROWS_WITH_COPY and linalg.row_stride(b) is None:
        return None
    # shared: compiled programs' matmuls run these kernels too, so a trace compiles them as well (the
    # program's first call compiled them otherwise, one after another: 0.24 s of an LSTM LM's first run)
    entry = eager_kernels.ready(NAME, (NAME, a.dtype.char, n, accumulate),
                                functools.partial(_compile, a.dtype, n, accumulate), shared=True)  # fmt: skip
    return None if entry is None else cast(_Kernel, entry.program)


#: A stack of products (``_batched``) of fewer multiply-adds in all stays on numpy.
MIN_BATCHED_MACS = 1 << 20
#: A stack of products of fewer columns stays on numpy (the kernel's narrowest column tile is one vector).
MIN_BATCHED_COLUMNS = 16


def _batched(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """``a @ b`` for stacks of matrices of the same batch dims (one or two: a transformer's attention
    products, (batch, heads, T, d) @ (batch, heads, d, T)) on the batched kernel, or None. numpy runs
    such a stack as one small BLAS call a matrix: GPT's (8, 4, 64, 32) @ (8, 4, 32, 64) took 135 us
    (B transposed) and (8, 4, 64, 64) @ (8, 4, 64, 32) 81 us on 2 threads, about 2 GFLOP/s a core.
    A ``b`` whose rows are not contiguous (a transposed key, ``k.transpose(-1, -2)``) is copied first
    (22 us for that one)."""
    if not (3 <= a.ndim <= 4 and a.ndim == b.ndim and a.shape[:-2] == b.shape[:-2]):
        return None
    (m, k), n = a.shape[-2:], b.shape[-1]
    if m * k * n * math.prod(a.shape[:-2]) < MIN_BATCHED_MACS or n < MIN_BATCHED_COLUMNS or m < MIN_ROWS:
        return None
    if a.dtype.char not in "fd" or a.dtype != b.dtype or not eager_kernels.enabled():
        return None
    entry = eager_kernels.ready(NAME, (NAME, a.dtype.char, n, "batched"),
                                functools.partial(_compile, a.dtype, n, False, True), shared=True)  # fmt: skip
    if entry is None:
        return None
    if b.strides[-1] != b.itemsize:
        b = np.ascontiguousarray(b)
    result = np.empty((*a.shape[:-1], n), dtype=a.dtype) if out is None else out
    return result if cast(_Kernel, entry.program)(a, b, result) else None


def product(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
    """``a @ b`` (2-d, or stacks of matrices of the same batch dims) into ``out`` (or a new array) on the
    kernel, or None: numpy's to run (``out`` untouched)."""
    if b.ndim > 2:
        return _batched(a, b, out)
    kernel = _kernel(a, b, False)
    if kernel is None:
        return None
    result = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype) if out is None else out
    return result if kernel(a, linalg.b_operand(b), result) else None


def matmul(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` (plus ``bias``, broadcast over its rows) as a new array, 2-d operands: on the kernel
    where it is ready and takes them, else numpy's."""
    kernel = _kernel(a, b, bias is not None)
    if kernel is not None:
        out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        if bias is not None:
            out[...] = bias
        if kernel(a, linalg.b_operand(b), out):
            return out
    out = a @ b
    if bias is not None:
        out += bias
    return out


linalg.install_product(product)
