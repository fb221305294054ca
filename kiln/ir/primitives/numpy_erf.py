"""erf over numpy arrays with array operations only: eager erf with nothing compiled at first use.

numpy has no erf. A numba ufunc over ``math.erf`` costs seconds of JIT compilation in every new
process (numba's import alone is a third of a second), so the eager op computes erf here
instead, in float64 whatever the input's dtype, with the float64 formulas of kiln's compiled
math library (``kiln/codegen/mathlib/special.py``, ``erf_body``):

- ``|x| < 1``: ``x + x (P(x^2) - 1)`` -- the exact term x carries the value, so tiny and
  subnormal x keep full relative accuracy;
- ``|x| >= 1``: ``sign(x) (1 - exp(-x^2 + S(u)))`` with ``u`` the clamped ``|x|`` mapped onto
  [-1, 1]; past |x| = 6, erfc(x) < 2^-54 and erf rounds to +-1.

The two float64 tables live here (``ir`` imports no other layer) and the math library reads them
(``mathlib/fit.py`` refits them); ``tests/frontend/test_erf_eager.py`` measures the error against ``math.erf`` (at most 1 ulp in float64, 1.1 ulp from the true erf where
``math.erf`` is within 0.8; float32 and float16 results are float64 values rounded once, so they
are correctly rounded but for rare double roundings). The work is done in blocks that stay in
cache: on 4M float32 elements this is as fast as the numba ufunc was, float64 about 1.25x slower.

>>> import math
>>> float(erf(np.array([0.5]))[0]) == math.erf(0.5)
True
"""

from __future__ import annotations

import numpy as np

__all__ = ["erf"]

# erf(x) = x P(x^2) for |x| < 1 (fit ERF_SMALL, float64)
ERF_SMALL_F64 = (
    1.1283791670955126, -0.3761263890318375, 0.11283791670954857, -0.026866170645072893, 0.005223977624780859,
    -0.0008548326978741784, 0.00012055331036884135, -1.4925593506514973e-05, 1.6460972810982946e-06,
    -1.6350025158784255e-07, 1.4657879416718964e-08, -1.1365664342383398e-09, 5.945259064873783e-11,
)  # fmt: skip
# erfc(x) = exp(-x^2 + S(u)), u = (x - 3.5) / 2.5, for x in [1, 6] (fit ERFC_LOG, float64)
ERFC_RANGE_F64 = (1.0, 6.0)
ERFC_LOG_F64 = (
    -1.862437402148188, -0.6652489709129887, 0.20779340786837616, -0.08165090963027472, 0.03412841124278855,
    -0.01438455127908247, 0.005953683295212697, -0.0023740378813163587, 0.0008937107627967254,
    -0.00030693332718882325, 9.261258445283766e-05, -1.891366668324476e-05, -1.0184410205428203e-05,
    -1.3282757729853435e-05, -1.6242763849854833e-05, 1.497073870083479e-05, 4.093176457298458e-05,
    4.893185458816851e-05, 3.181245367752313e-05, 1.1996386415390266e-05, 2.0489415577013554e-06,
)  # fmt: skip

_SMALL = (ERF_SMALL_F64[0] - 1.0, *ERF_SMALL_F64[1:])  # P - 1 (at most 0.13) rounds 8x finer than P


def _horner(t: np.ndarray, coeffs: tuple[float, ...]) -> np.ndarray:
    acc = np.full_like(t, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc *= t
        acc += c
    return acc


def _small(x: np.ndarray) -> np.ndarray:
    p = _horner(x * x, _SMALL)
    p *= x
    p += x
    return p


def _two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p, e) with p = fl(a b) and p + e == a b exactly (Dekker's product; numpy has no fma)."""
    p = a * b
    ah, bh = _split(a), _split(b)
    al, bl = a - ah, b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _split(a: np.ndarray) -> np.ndarray:
    # the high 26 bits of a (Veltkamp); |a| <= 6 here, so nothing overflows
    c = a * 134217729.0  # 2^27 + 1
    return c - (c - a)


def _large(x: np.ndarray, compensated: bool) -> np.ndarray:
    lo, hi = ERFC_RANGE_F64
    a = np.clip(np.abs(x), lo, hi)
    u = (a - (hi + lo) / 2) / ((hi - lo) / 2)
    q = _horner(u, ERFC_LOG_F64[1:])  # S = c0 + u q
    if not compensated:  # a float32/float16 result: float64's rounding errors vanish in its rounding
        q *= u
        q += ERFC_LOG_F64[0]
        q -= a * a
        return np.copysign(1.0 - np.exp(q, out=q), x)
    # exp's argument -x^2 + S(u) is carried as a double-double: its rounding errors, magnified by
    # exp into erfc's relative error, would cost up to 1 ulp of erf near |x| = 1 (the compiled
    # version rounds them away with fused multiply-adds)
    p, p_err = _two_prod(u, q)
    s = ERFC_LOG_F64[0] + p
    s_err = (ERFC_LOG_F64[0] - s) + p + p_err  # (c0 - s) + p is exact: |c0| >= |p| (Fast2Sum)
    sq, sq_err = _two_prod(a, a)
    t = s - sq
    bb = t - s
    t_err = ((s - (t - bb)) + (-sq - bb)) + (s_err - sq_err)  # TwoSum
    erfc = np.exp(t)
    erfc += erfc * t_err
    return np.copysign(1.0 - erfc, x)


# Elements per block: the few dozen array passes over one block (512 KiB per float64 temporary)
# stay in the 2 MiB L2 cache instead of streaming the whole array through memory each time; much
# smaller blocks pay numpy's per-call overhead instead. On 4M float32 elements of GELU's input,
# median ms for blocks of 8K / 32K / 64K / 128K / 256K / all 4M: 52 / 38 / 37 / 39 / 32 / 96 (noisy:
# two shared cores; 32K-256K are alike).
BLOCK = 1 << 16


def erf(x: np.ndarray) -> np.ndarray:
    """erf of a floating-point array, elementwise, in the array's dtype (-0 stays -0, nan stays nan)."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"erf expects a floating-point array, got {x.dtype}")
    flat = x.reshape(-1)  # flat: 0-d inputs index like any other
    out = np.empty(flat.shape, x.dtype)
    for start in range(0, flat.size, BLOCK):
        wide = flat[start : start + BLOCK].astype(np.float64)
        result = _small(wide)
        large = np.flatnonzero(~(np.abs(wide) < 1.0))  # nan included: _large keeps it nan
        if large.size:
            result[large] = _large(wide[large], compensated=x.dtype.itemsize >= 8)
        out[start : start + BLOCK] = result
    return out.reshape(x.shape)
