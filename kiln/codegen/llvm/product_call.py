"""Kiln's own matrix product (``small_gemm.py``) as a kernel the eager RNN layers call on numpy arrays.

An eager LSTM layer's large products -- the input projection of all steps, and in the backward the
input's gradient and the two weight gradients -- ran on numpy's OpenBLAS, on the AVX2 kernels the
environment picks here (``OPENBLAS_CORETYPE=Haswell``), split over 2 threads by a static split
that waits for a busy core. ``Product.build(dtype, n, accumulate)`` compiles
``C (+)= A @ B`` for ``n`` columns (the rows and ``k`` are arguments) with the compiled kernels'
ABI, ``void f(ptr args, i64 begin, i64 end)`` over units of ``host.tile_rows()`` rows, so
``threads.parallel_for`` spreads the row tiles over kiln's threads (the native pool), claimed as they come. The
object code goes to the disk cache of compiled kernels like the recurrences', keyed on the kernel's name
(``product_ir.py`` makes its IR on a miss only), and loads through kiln's ELF loader: a warm process's
first product then imports no IR builder and loads no LLVM (DCGAN's first eager product took 83 ms
of wall time, 46 ms of CPU, beside the traced call it slowed).

Measured: ``frontend/eager_recurrence.py``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from ...ir.dtypes import DType, from_numpy_dtype
from ...ir.primitives.linalg import row_stride
from ...runtime import threads
from ...runtime.cache import cache_key, source_digest
from ...runtime.frames import data_pointer
from ..core import Unsupported
from . import host, kernel_cache
from .backend import load_objects

#: Bump when the kernels' signature or slots change.
FORMAT = 2
_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def symbol(dtype: DType, n: int, accumulate: bool) -> str:
    return f"kiln_product_{dtype.name}_n{n}{'_acc' if accumulate else ''}"


def batched_symbol(dtype: DType, n: int) -> str:
    return f"kiln_batched_product_{dtype.name}_n{n}"


def _objects(name: str, make: Callable[[], str]) -> list[bytes]:
    """The object code of the product kernel ``name`` (its symbol): from the disk cache of compiled
    kernels, keyed on the name, the host and kiln's source (which decide its IR, so a hit makes none
    and loads no LLVM), else compiled from ``make()``'s IR and stored."""
    cache = kernel_cache.kernel_cache()
    key = None
    if cache.enabled:
        key = cache_key("kiln product", str(FORMAT), source_digest("ir", "codegen", "runtime"), host.signature(), name)
    code = cache.get(key) if key is not None else None
    if code is None:
        from . import engine  # noqa: PLC0415 - loads LLVM: a miss only

        (code,) = engine.compile_many([make()])
        if key is not None:
            cache.put(key, code)
    return [code]


def _product_ir(dtype: DType, n: int, accumulate: bool) -> str:
    from . import engine, product_ir  # noqa: PLC0415 - the IR builders and LLVM: a miss only

    # light (no unrolling: its loops are vector code already): LLVM 34-38 -> 28-32 ms a kernel, as fast
    return engine.LIGHT + product_ir.product_ir(dtype, n, accumulate, symbol(dtype, n, accumulate))


def _batched_product_ir(dtype: DType, n: int) -> str:
    from . import engine, product_ir  # noqa: PLC0415 - (as _product_ir)

    return engine.LIGHT + product_ir.batched_product_ir(dtype, n, batched_symbol(dtype, n))


def _a_strides(a: np.ndarray, item: int) -> tuple[int, int] | None:
    """(lda, a_step) in elements of a matrix ``a`` whose rows or columns are contiguous, else None."""
    m, k = a.shape[-2:]
    row, column = a.strides[-2:]
    if k > 1 and column == item and (m == 1 or row % item == 0):
        return (row // item if m > 1 else k), 1
    if m > 1 and row == item and (k == 1 or column % item == 0):
        return 1, (column // item if k > 1 else m)
    if k <= 1 and m <= 1:
        return 1, 1
    return None


class Product:
    """``C (+)= A @ B`` for one dtype, ``n`` and ``accumulate``, compiled (or loaded from the disk cache)."""

    def __init__(self, dtype: np.dtype, n: int, accumulate: bool) -> None:
        self.dtype, self.n, self.accumulate = np.dtype(dtype), n, accumulate
        kiln_dtype = from_numpy_dtype(self.dtype)
        name = symbol(kiln_dtype, n, accumulate)
        # the kernel lives while the library does; loaded by kiln's ELF loader where it can (no LLVM)
        self._library = load_objects(_objects(name, lambda: _product_ir(kiln_dtype, n, accumulate)))
        self._kernel = _KERNEL(self._library.address(name))
        self._rows = host.tile_rows()
        threads.prepare_native_pool()  # which it runs on (``spin``), built here rather than at its first split

    @classmethod
    def build(cls, dtype, n: int, accumulate: bool) -> Product:
        """``Unsupported`` for a dtype other than float32/float64."""
        if np.dtype(dtype).char not in "fd":
            raise Unsupported(f"no native product for {np.dtype(dtype)} (numpy's runs)")
        return cls(dtype, n, accumulate)

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """``out (+)= a @ b`` (True), or nothing (False) for arrays it does not take: another dtype or
        ``n``, ``b`` or ``out`` without unit strides along a row or a row stride of no whole number of
        elements (``b``'s rows may lie apart: a slice of a wider buffer, as the gates' gradient a
        recurrence's backward packs with others), ``a`` without unit strides along a row or down a
        column (as a transpose's view has), overlapping ``out`` and an operand."""
        m, k = a.shape
        item = self.dtype.itemsize
        if not (a.dtype == b.dtype == out.dtype == self.dtype and b.shape == (k, self.n) and out.shape == (m, self.n)):
            return False
        if m == 0:
            return True
        ldb = row_stride(b)
        if ldb is None or (m > 1 and out.strides[0] % item) or (self.n > 1 and out.strides[1] != item):
            return False
        found = _a_strides(a, item)
        if found is None:
            return False
        lda, a_step = found
        if np.may_share_memory(out, a) or np.may_share_memory(out, b):
            return False
        ldc = out.strides[0] // item if m > 1 else self.n
        args = np.array([m, k, data_pointer(a) or 0, lda, a_step, data_pointer(b) or 0, ldb, data_pointer(out) or 0,
                         ldc], dtype=np.int64)  # fmt: skip
        units = -(-m // self._rows)
        # on the native pool (``spin``): it has nothing but this kernel to run, and its workers, spinning
        # after the kernels and products before it, take row tiles within microseconds where the Python
        # pool's hand-offs took tens (``threads.product_work``: 512x128 @ 128x128 161 us serial, 136
        # on the Python pool, 78 native). The caller parks them before a BLAS call (``extern_call``).
        threads.parallel_for(self._kernel, args.ctypes.data, units, threads.product_work(m * k * self.n), spin=True)
        return True


class BatchedProduct:
    """``C = A @ B`` over stacks of matrices (one or two batch dims, the same in A, B and C) for one dtype
    and ``n``, compiled (or loaded from the disk cache)."""

    def __init__(self, dtype: np.dtype, n: int) -> None:
        self.dtype, self.n = np.dtype(dtype), n
        kiln_dtype = from_numpy_dtype(self.dtype)
        name = batched_symbol(kiln_dtype, n)
        self._library = load_objects(_objects(name, lambda: _batched_product_ir(kiln_dtype, n)))  # (as Product's)
        self._kernel = _KERNEL(self._library.address(name))
        self._rows = host.tile_rows()
        threads.prepare_native_pool()

    @classmethod
    def build(cls, dtype, n: int) -> BatchedProduct:
        """``Unsupported`` for a dtype other than float32/float64."""
        if np.dtype(dtype).char not in "fd":
            raise Unsupported(f"no native product for {np.dtype(dtype)} (numpy's runs)")
        return cls(dtype, n)

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """``out = a @ b`` (True), or nothing (False) for arrays it does not take: another dtype or ``n``,
        batch dims that differ or more than two of them, a batch stride or ``b``'s row stride that is
        no whole number of elements, ``b`` or ``out`` without unit strides along a row, ``a`` without
        them along a row or down a column, overlapping ``out`` and an operand."""
        item, n = self.dtype.itemsize, self.n
        if not (a.dtype == b.dtype == out.dtype == self.dtype and 3 <= a.ndim <= 4 and a.ndim == b.ndim == out.ndim):
            return False
        batch, (m, k) = a.shape[:-2], a.shape[-2:]
        if b.shape != (*batch, k, n) or out.shape != (*batch, m, n):
            return False
        if out.size == 0:
            return True
        found = _a_strides(a, item)
        if found is None or (n > 1 and (b.strides[-1] != item or out.strides[-1] != item)):
            return False
        strides = [array.strides[d] if array.shape[d] > 1 else 0 for array in (a, b, out) for d in range(a.ndim - 2)]
        if any(s % item for s in (*strides, b.strides[-2] if k > 1 else 0, out.strides[-2] if m > 1 else 0)):
            return False
        if np.may_share_memory(out, a) or np.may_share_memory(out, b):
            return False
        if a.ndim == 3:  # one batch dim: the outer one, an inner of size 1
            strides = [s for pair in zip(strides, (0, 0, 0), strict=True) for s in pair]
        inner = 1 if a.ndim == 3 else batch[1]
        a_outer, a_inner, b_outer, b_inner, c_outer, c_inner = (s // item for s in strides)
        tiles = -(-m // self._rows)
        ldb = b.strides[-2] // item if k > 1 else n
        ldc = out.strides[-2] // item if m > 1 else n
        args = np.array([m, k, data_pointer(a) or 0, *found, data_pointer(b) or 0, ldb, data_pointer(out) or 0, ldc,
                         tiles, inner, a_outer, a_inner, b_outer, b_inner, c_outer, c_inner], dtype=np.int64)  # fmt: skip
        macs = int(np.prod(batch)) * m * k * n
        units = int(np.prod(batch)) * tiles
        threads.parallel_for(self._kernel, args.ctypes.data, units, threads.product_work(macs), spin=True)
        return True
