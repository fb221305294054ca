"""Sums over leading or middle axes compiled by the LLVM backend (``kiln.codegen.llvm.leading_sums``): ``reduce_sum``
keeping the last axis against its eager kernel (a BLAS matrix-vector product or numpy's sum) over
several calls, float32 and float64; rows shorter and longer than a block of vectors (masked
tails), reduced axes around kept ones, runs of rows with a remainder, inputs of any strides; the
same bits on one thread as on two; declined to the eager kernel, with the reason, where the code
generator does not go."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

# (shape, reduced axes, keepdim): whole blocks of 8 vectors (256 columns), a tail of one masked
# lane (129), a row shorter than a vector (6), whole blocks and a tail (1000), one column, runs of
# 64 rows with a remainder (100), reduced axes on both sides of a kept one, no rows, no columns
CASES = [
    ((8, 128, 256), (0, 1), False),
    ((1024, 256), (0,), True),
    ((5, 6), (0,), False),
    ((3, 7, 129), (1,), False),
    ((4, 5, 6, 37), (0, 2), True),
    ((2, 3, 1000), (0, 1), False),
    ((130, 1), (0,), False),
    ((100, 17), (0,), False),
    ((0, 5), (0,), False),
    ((3, 0), (0,), True),
]
TOLERANCE = {np.float32: 2e-5, np.float64: 1e-12}


def _check_compiled(fn, x, dtype):
    compiled = kiln.compile(fn)
    expected = fn(x).numpy()
    exact = fn(kiln.from_numpy(x.numpy().astype(np.float64))).numpy()
    tol = TOLERANCE[dtype] * max(1.0, np.abs(exact).max(initial=0.0))
    for _ in range(3):  # the first call traces; the others run the compiled program
        out = compiled(x).numpy()
        assert out.dtype == expected.dtype and out.shape == expected.shape
        np.testing.assert_allclose(out, expected, rtol=TOLERANCE[dtype], atol=tol)
        np.testing.assert_allclose(out, exact, rtol=TOLERANCE[dtype], atol=tol)  # as close to the exact sum
    report = "\n".join(compiled.state.specializations[0].report.describe())
    externs = [line for line in report.splitlines() if "extern nodes" in line]
    assert not any("reduce_sum" in line for line in externs), report  # the compiled function ran it
    return compiled


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axes, keepdim", CASES)
def test_compiled_sums_of_rows_equal_the_eager_kernel(shape, axes, keepdim, dtype):
    x = kiln.from_numpy(np.random.default_rng(0).standard_normal(shape).astype(dtype))
    _check_compiled(lambda a: a.sum(dim=axes, keepdim=keepdim), x, dtype)


def test_inputs_of_any_strides():
    """Rows further apart than their length (a slice), every other row, and a transposed stack
    whose last axis stays contiguous: the kernel reads them in place."""
    base = kiln.from_numpy(np.random.default_rng(1).standard_normal((6, 40, 50)))
    _check_compiled(lambda a: a[:, 3:33, 5:45].sum(dim=(0, 1)), base, np.float64)
    _check_compiled(lambda a: a[::2].sum(dim=0), base, np.float64)
    _check_compiled(lambda a: a.transpose(0, 1).sum(dim=(0,)), base, np.float64)


def test_results_do_not_depend_on_the_thread_count():
    """8 MB of input: the thread pool splits the column blocks."""
    x = kiln.from_numpy(np.random.default_rng(2).standard_normal((2048, 1024)).astype(np.float32))
    compiled = kiln.compile(lambda a: a.sum(dim=0))
    compiled(x)  # traces (the result of this call is eager's)
    before = kiln.get_num_threads()
    try:
        results = []
        for n in (1, 2, 1, 2):
            kiln.set_num_threads(n)
            results.append(compiled(x).numpy())
    finally:
        kiln.set_num_threads(before)
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)


@pytest.mark.parametrize(
    "fn, dtype, why",
    [
        (lambda x: x.sum(dim=0), np.int64, "reduce_sum of int64 runs on its eager kernel"),
        (lambda x: x.transpose(0, 1).sum(dim=0), np.float64, "last axis is not contiguous"),
    ],
)
def test_what_the_kernel_does_not_take_runs_eagerly_and_says_why(fn, dtype, why):
    x = kiln.from_numpy((np.random.default_rng(3).standard_normal((9, 12)) * 10).astype(dtype))
    compiled = kiln.compile(fn)
    for _ in range(3):
        np.testing.assert_allclose(compiled(x).numpy(), fn(x).numpy(), rtol=1e-12, atol=1e-12)
    report = "\n".join(compiled.state.specializations[0].report.describe())
    assert why in report, report
