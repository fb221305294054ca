"""Eager erf (kiln/ir/primitives/numpy_erf.py): accuracy against math.erf, special values, shapes,
and no JIT compilation at first use."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.codegen.mathlib import special
from kiln.ir.primitives import numpy_erf

INT = {np.float64: np.int64, np.float32: np.int32, np.float16: np.int16}


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Units in the last place between two arrays of one float dtype (0 for equal values, -0 == +0)."""
    it = INT[got.dtype.type]

    def ordered(a):
        i = a.view(it).astype(np.int64)
        return np.where(i < 0, np.iinfo(it).min - i, i)  # monotonic in the float's value

    return np.abs(ordered(got) - ordered(want))


def grid() -> np.ndarray:
    rng = np.random.default_rng(14)
    tiny = np.geomspace(5e-324, 1.0, 20_001)
    return np.concatenate([
        np.linspace(-7.0, 7.0, 140_001),  # both formulas, the seam at |x| = 1 and the clamp at 6
        tiny, -tiny,  # subnormals up to 1: relative accuracy where erf(x) ~ 2x / sqrt(pi)
        np.nextafter(1.0, [0.0, 2.0]), np.nextafter(-1.0, [0.0, -2.0]),
        rng.standard_normal(50_000) * 3,
        [0.0, -0.0, 1.0, -1.0, 6.0, -6.0, 30.0, 1e300, -1e300, np.finfo(np.float64).max, np.inf, -np.inf, np.nan],
    ])  # fmt: skip


def reference(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(float(v)) for v in x.ravel()], dtype=np.float64).reshape(x.shape)


def test_tables_are_the_math_librarys():
    """One copy of the float64 tables: the compiled math library reads the eager kernel's."""
    assert special.ERF_SMALL_F64 is numpy_erf.ERF_SMALL_F64
    assert special.ERFC_LOG_F64 is numpy_erf.ERFC_LOG_F64
    assert numpy_erf.ERFC_RANGE_F64 == special.ERFC_RANGE[64]


def test_float64_within_one_ulp_of_math_erf():
    x = grid()
    got, want = numpy_erf.erf(x), reference(x)
    assert got.dtype == np.float64
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    err = ulp_distance(got[finite], want[finite])
    assert err.max() <= 1, f"{err.max()} ulp at x = {x[finite][err.argmax()]!r}"
    assert (err == 0).mean() > 0.9  # mostly the same bits, not merely close


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_narrow_dtypes_are_rounded_once_from_float64(dtype):
    """float32 and float16 are computed in float64 and rounded once: the same as math.erf rounded,
    checked on every float16 and on a sample of float32 bit patterns (subnormals, inf, nan included)."""
    bits = (
        np.arange(0, 1 << 16, dtype=np.uint16) if dtype is np.float16 else np.arange(0, 1 << 32, 4099, dtype=np.uint32)
    )
    with np.errstate(over="ignore", invalid="ignore"):  # float64 grid values beyond float16's range
        x = np.concatenate([bits.view(dtype), grid()[:-1].astype(dtype), np.array([-0.0, np.nan], dtype=dtype)])
        want = reference(x.astype(np.float64)).astype(dtype)
    got = numpy_erf.erf(x)
    assert got.dtype == dtype
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    err = ulp_distance(got[finite], want[finite])
    assert err.max() == 0, f"{err.max()} ulp at x = {x[finite][err.argmax()]!r}"


def test_signs_and_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, 5e-324, -5e-324, 1e-310])
    got = numpy_erf.erf(x)
    assert got.tolist() == [math.erf(v) for v in x.tolist()]
    assert np.signbit(got).tolist() == [False, True, False, True, False, True, False]
    assert np.isnan(numpy_erf.erf(np.array([np.nan, -np.nan]))).all()


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (7,), (numpy_erf.BLOCK + 5,), (3, numpy_erf.BLOCK // 2 + 1)])
def test_shapes_and_block_edges(shape):
    """0-d, empty and multi-block arrays, non-contiguous input: same values as elementwise math.erf."""
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    got = numpy_erf.erf(x)
    assert got.shape == x.shape and got.dtype == np.float32
    assert np.array_equal(got, reference(x.astype(np.float64)).astype(np.float32))
    if x.ndim == 2:
        assert np.array_equal(numpy_erf.erf(x.T), got.T)


def test_rejects_integers():
    with pytest.raises(TypeError, match="floating-point"):
        numpy_erf.erf(np.arange(3))


def test_gelu_matches_torch_in_float64(torch):
    # float64: float32's GELU cancels in 1 + erf(x) for negative x, in both libraries alike
    x = kiln.randn(1000, dtype=kiln.float64) * 3
    got = kiln.nn.GELU()(x).numpy()
    want = torch.nn.GELU()(torch.from_numpy(x.numpy())).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)  # 1 + erf(x) cancels for x < 0


def test_first_gelu_compiles_nothing():
    """The first eager erf of a process imports neither numba nor llvmlite (their JIT took seconds)."""
    code = (
        "import sys, kiln; kiln.nn.GELU()(kiln.randn(4)); kiln.erf(kiln.randn(3, dtype=kiln.float64)); "
        "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))"
    )
    root = Path(kiln.__file__).parent.parent  # this checkout's kiln, wherever pytest was started
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
