"""small_gemm's register-tiled product (the native recurrences' per-step product) against numpy in
float64: whole and partial row tiles, whole and masked column tiles, strided rows of A and C, C
overwritten or added to, float32 and float64."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llvmlite import ir

from kiln.codegen.llvm import engine
from kiln.codegen.llvm.loops import I64
from kiln.codegen.llvm.small_gemm import emit_product
from kiln.ir import dtypes as dt

_BUILT: dict = {}


def _product(dtype, n: int, k: int | None, accumulate: bool, rows: int):
    """``f(first, m, k, a, lda, a_step, b, c, ldc)``: the product compiled for (n, k) with ``rows``-row
    tiles (``k`` None: the run-time argument)."""
    key = (dtype, n, k, accumulate, rows)
    if key not in _BUILT:
        module = ir.Module(name="small_gemm_test")
        pointer = ir.PointerType()
        params = [I64, I64, I64, pointer, I64, I64, pointer, pointer, I64]
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), "product")
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        first, m, k_value, a, lda, a_step, b, c, ldc = fn.args
        emit_product(builder, dtype, m, n, k_value if k is None else k, a, lda, b, c, ldc, accumulate, rows=rows,
                     a_step=a_step, first=first)  # fmt: skip
        builder.ret_void()
        library = engine.Library(engine.compile_many([str(module)]))
        kind = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p if p == pointer else ctypes.c_int64 for p in params])
        _BUILT[key] = (library, kind(library.address("product")))
    return _BUILT[key][1]


@pytest.mark.parametrize("dtype", [dt.float32, dt.float64])
@pytest.mark.parametrize(("m", "n", "k"), [(16, 512, 128), (16, 128, 512), (11, 204, 51), (3, 51, 204), (1, 5, 1),
                                           (0, 32, 4), (9, 33, 7), (5, 16, 0)])  # fmt: skip
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("rows", [8, 2])
@pytest.mark.parametrize("layout", ["rows", "transposed A, run-time k"])
def test_product_equals_numpy(dtype, m, n, k, accumulate, rows, layout):
    np_dtype = np.dtype(dtype.name)
    rng = np.random.default_rng(m * 1000 + n + k)
    # A and C are row blocks of wider arrays (their leading dimensions), B contiguous; or A stored
    # transposed (its k stride the leading dimension), k given at run time
    b = rng.standard_normal((k, n)).astype(np_dtype)
    c_full = rng.standard_normal((m, n + 5)).astype(np_dtype)
    start = c_full.copy()
    if layout == "rows":
        a_full = rng.standard_normal((m, k + 3)).astype(np_dtype)
        a, lda, a_step = a_full[:, :k], k + 3, 1
    else:
        a_stored = rng.standard_normal((k, m + 2)).astype(np_dtype)
        a, lda, a_step = a_stored[:, :m].T, 1, m + 2
    product = _product(dtype, n, k if layout == "rows" else None, accumulate, rows)
    product(0, m, k, a.ctypes.data, lda, a_step, b.ctypes.data, c_full.ctypes.data, n + 5)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    if accumulate:
        expected += start[:, :n]
        scale += np.abs(start[:, :n])
    # the classic bound of a sum of k + 1 rounded terms: a missing, doubled or misplaced term is far outside it
    bound = (k + 1) * np.finfo(np_dtype).eps * scale
    assert np.all(np.abs(c_full[:, :n] - expected) <= bound)
    np.testing.assert_array_equal(c_full[:, n:], start[:, n:])  # nothing written past a row's n columns


def test_rows_do_not_depend_on_the_batch():
    """Each element sums its products in one order: a row's result is the same bit for bit whether it
    runs in a whole tile or alone (a batch of one, the recurrence's last rows)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((9, 128)).astype(np.float32)
    b = rng.standard_normal((128, 512)).astype(np.float32)
    product = _product(dt.float32, 512, 128, False, 8)
    together, apart = np.empty((9, 512), np.float32), np.zeros((9, 512), np.float32)
    product(0, 9, 128, a.ctypes.data, 128, 1, b.ctypes.data, together.ctypes.data, 512)
    product(8, 9, 128, a.ctypes.data, 128, 1, b.ctypes.data, apart.ctypes.data, 512)  # row 8 alone
    np.testing.assert_array_equal(together[8], apart[8])
    assert not apart[:8].any()  # rows before ``first`` untouched
