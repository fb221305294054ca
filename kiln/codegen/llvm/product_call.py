"""Kiln's own matrix product (``small_gemm.py``) as a kernel the eager RNN layers call on numpy arrays.

An eager LSTM layer's large products -- the input projection of all steps, and in the backward the
input's gradient and the two weight gradients -- ran on numpy's OpenBLAS, on the AVX2 kernels the
environment picks here (``OPENBLAS_CORETYPE=Haswell``), split over 2 threads by a static split
that waits for a busy core. ``Product.build(dtype, n, accumulate)`` compiles
``C (+)= A @ B`` for ``n`` columns (the rows and ``k`` are arguments) with the compiled kernels'
ABI, ``void f(ptr args, i64 begin, i64 end)`` over units of ``small_gemm.tile_rows()`` rows, so
``threads.parallel_for`` spreads the row tiles over kiln's threads (the native pool), claimed as they come. The
object code goes to the disk cache of compiled kernels like the recurrences'.

Measured: ``frontend/eager_recurrence.py``.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir

from ...ir.dtypes import DType, from_numpy_dtype
from ...runtime import threads
from ...runtime.frames import data_pointer
from ..core import Unsupported
from . import engine
from .loops import I64, i64
from .recurrence_call import cached_objects
from .small_gemm import emit_product, tile_rows

#: The i64 slots of ``args``: sizes, addresses, strides in elements.
SLOTS = ("m", "k", "a", "lda", "a_step", "b", "c", "ldc")
_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def symbol(dtype: DType, n: int, accumulate: bool) -> str:
    return f"kiln_product_{dtype.name}_n{n}{'_acc' if accumulate else ''}"


def product_ir(dtype: DType, n: int, accumulate: bool) -> str:
    """LLVM IR of ``C (+)= A @ B`` over the row tiles ``[begin, end)`` (``SLOTS``' args)."""
    if dtype.name not in ("float32", "float64") or n < 1:
        raise ValueError(f"a native product takes float32/float64 and n >= 1, got {dtype.name}, n {n}")
    module = ir.Module(name="kiln_product")
    pointer = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [pointer, I64, I64]), symbol(dtype, n, accumulate))
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    params, begin, end = fn.args
    value = {name: builder.load(builder.gep(params, [i64(k)], inbounds=True, source_etype=I64), typ=I64, name=name)
             for k, name in enumerate(SLOTS)}  # fmt: skip
    rows = tile_rows()
    first = builder.mul(begin, i64(rows), flags=("nsw",))
    stop = builder.mul(end, i64(rows), flags=("nsw",))
    stop = builder.select(builder.icmp_signed("<", stop, value["m"]), stop, value["m"])
    address = {name: builder.inttoptr(value[name], pointer) for name in ("a", "b", "c")}
    emit_product(builder, dtype, stop, n, value["k"], address["a"], value["lda"], address["b"], address["c"],
                 value["ldc"], accumulate, rows=rows, a_step=value["a_step"], first=first)  # fmt: skip
    builder.ret_void()
    return str(module)


class Product:
    """``C (+)= A @ B`` for one dtype, ``n`` and ``accumulate``, compiled (or loaded from the disk cache)."""

    def __init__(self, dtype: np.dtype, n: int, accumulate: bool) -> None:
        self.dtype, self.n, self.accumulate = np.dtype(dtype), n, accumulate
        kiln_dtype = from_numpy_dtype(self.dtype)
        self._library = engine.Library(
            cached_objects([product_ir(kiln_dtype, n, accumulate)])
        )  # the kernel lives while it does
        self._kernel = _KERNEL(self._library.address(symbol(kiln_dtype, n, accumulate)))
        self._rows = tile_rows()

    @classmethod
    def build(cls, dtype, n: int, accumulate: bool) -> Product:
        """``Unsupported`` for a dtype other than float32/float64."""
        if np.dtype(dtype).char not in "fd":
            raise Unsupported(f"no native product for {np.dtype(dtype)} (numpy's runs)")
        return cls(dtype, n, accumulate)

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """``out (+)= a @ b`` (True), or nothing (False) for arrays it does not take: another dtype or
        ``n``, ``b`` not C-contiguous, ``a`` or ``out`` without unit strides along a row (``a``: along
        a row or down a column, as a transpose's view has), overlapping ``out`` and an operand."""
        m, k = a.shape
        item = self.dtype.itemsize
        if not (a.dtype == b.dtype == out.dtype == self.dtype and b.shape == (k, self.n) and out.shape == (m, self.n)):
            return False
        if m == 0:
            return True
        if not b.flags.c_contiguous or (m > 1 and out.strides[0] % item) or (self.n > 1 and out.strides[1] != item):
            return False
        if k > 1 and a.strides[1] == item and (m == 1 or a.strides[0] % item == 0):
            lda, a_step = (a.strides[0] // item if m > 1 else k), 1
        elif m > 1 and a.strides[0] == item and (k == 1 or a.strides[1] % item == 0):
            lda, a_step = 1, (a.strides[1] // item if k > 1 else m)
        elif k <= 1 and m <= 1:
            lda, a_step = 1, 1
        else:
            return False
        if np.may_share_memory(out, a) or np.may_share_memory(out, b):
            return False
        ldc = out.strides[0] // item if m > 1 else self.n
        args = np.array([m, k, data_pointer(a) or 0, lda, a_step, data_pointer(b) or 0, data_pointer(out) or 0, ldc],
                        dtype=np.int64)  # fmt: skip
        units = -(-m // self._rows)
        # on the native pool (``spin``): it has nothing but this kernel to run, and its workers, spinning
        # after the kernels and products before it, take row tiles within microseconds where the Python
        # pool's hand-offs took tens (``threads.product_work``: 512x128 @ 128x128 161 us serial, 136
        # on the Python pool, 78 native). The caller parks them before a BLAS call (``extern_call``).
        threads.parallel_for(self._kernel, args.ctypes.data, units, threads.product_work(m * k * self.n), spin=True)
        return True
