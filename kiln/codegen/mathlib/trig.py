"""sin and cos for float32 and float64.

Both reduce x to r = x - n pi/2, |r| <= pi/4, and evaluate sin(r) or cos(r) (chosen and signed
by n mod 4) in float64 with the SIN_S / COS_C polynomials of ``fit.py``.

float32: the reduction is exact for every finite float and branch-free, so a loop over
float32 sin/cos vectorizes whatever the arguments. A float32 x is M 2^E with a 24-bit M; the
product x * (2/pi) mod 4 is summed from x times 29-bit pieces of 2/pi (each product exact in
float64, each reduced mod 4 exactly), in double-double; pieces down to 2^-232 cover x up to
FLT_MAX with about 2^-100 absolute error, far below what the closest float32 to a multiple of
pi/2 needs.

float64: the fast path is a three-piece Cody-Waite reduction (exact first step, error about
2^-53 |r| after) and is accurate for |x| < ``FAST_LIMIT_F64`` = 2^30. Beyond it, a branch calls
the platform's sin/cos on the argument (libm: correct for every double, but a call):
scalar code pays for it only on such arguments, but a loop containing the call is not vectorized
(``Core.libm_where``: the LLVM backend branches to a ``noinline`` wrapper of libm).
"""

from __future__ import annotations

from fractions import Fraction

from ...ir import dtypes as dt
from ..core import Scalar
from .constants import F64, PI, nearest, parts
from .core import Float

FAST_LIMIT_F64 = 2.0**30

_PIO2 = parts(PI / 2, F64, 3)  # Cody-Waite: pi/2 = C1 + C2 + C3 + O(2^-160)
_PIO2_DD = parts(PI / 2, F64, 2)
_TWO_OVER_PI = nearest(2 / PI, F64)


def _pieces(value: Fraction, bits: int, count: int) -> list[float]:
    """value truncated into ``count`` consecutive ``bits``-bit pieces (value < 1)."""
    out = []
    for j in range(1, count + 1):
        scale = 2 ** (bits * j)
        out.append(Fraction(int(value * scale), scale))
        value -= out[-1]
    return [float(p) for p in out]


_TWO_OVER_PI_PIECES = _pieces(2 / PI, 29, 8)  # 232 bits: x * piece exact for a 24-bit x

# sin(r) = r + r^3 S(r^2), cos(r) = 1 - r^2/2 + r^4 C(r^2) for |r| <= pi/4 (fits SIN_S, COS_C);
# the float32 routines evaluate the shorter pair in float64
SIN_S = {
    32: (-0.1666666716337204, 0.008333329111337662, -0.00019839311426039785, 2.7181140467291698e-06),
    64: (
        -0.16666666666666666, 0.008333333333333323, -0.00019841269841254784, 2.7557319214056947e-06,
        -2.5052104879761117e-08, 1.6058362894442328e-10, -7.578526680938261e-13,
    ),
}  # fmt: skip
COS_C = {
    32: (0.0416666679084301, -0.0013888883404433727, 2.4799519451335073e-05, -2.7210168696001347e-07),
    64: (
        0.041666666666666664, -0.0013888888888888874, 2.4801587301571523e-05, -2.7557319215387604e-07,
        2.0876754368795032e-09, -1.1470293563783732e-11, 4.738122389611332e-14,
    ),
}  # fmt: skip


def _reduce_fast(w: Float, x: Scalar) -> tuple[Scalar, Scalar]:
    """(n, r): x = n pi/2 + r for float64 |x| < FAST_LIMIT_F64 (x finite; n as a float)."""
    n = w.roundeven(w.mul(x, w.c(_TWO_OVER_PI)))
    r = w.fma(w.neg(n), w.c(_PIO2[0]), x)  # exact: both on the 2^-52 grid, |r| < 1
    r = w.fma(w.neg(n), w.c(_PIO2[1]), r)
    return n, w.fma(w.neg(n), w.c(_PIO2[2]), r)


def _reduce_exact(w: Float, x: Scalar) -> tuple[Scalar, Scalar]:
    """(n, r) for any finite float32 value x held in a double (see the module docstring)."""
    total, error = w.c(0.0), w.c(0.0)
    for piece in _TWO_OVER_PI_PIECES:
        t = w.mul(x, w.c(piece))  # exact: 24 + 29 bits
        t = w.sub(t, w.mul(w.c(4.0), w.floor(w.mul(t, w.c(0.25)))))  # t mod 4, exact
        total, err = w.two_sum(total, t)
        error = w.add(error, err)
    n = w.roundeven(total)
    f = w.add(w.sub(total, n), error)  # x (2/pi) - n, |f| <= 1/2 (plus rounding)
    hi, lo = _PIO2_DD
    return n, w.fma(f, w.c(hi), w.mul(f, w.c(lo)))


def _eval(w: Float, n: Scalar, r: Scalar, bits: int, cosine: bool) -> Scalar:
    """sin(n pi/2 + r) (or cos) from the reduced pair."""
    z = w.mul(r, r)
    sin_r = w.fma(w.mul(r, z), w.poly(z, SIN_S[bits]), r)
    half = w.mul(w.c(0.5), z)
    head = w.sub(w.c(1.0), half)
    tail = w.fma(w.mul(z, z), w.poly(z, COS_C[bits]), w.sub(w.sub(w.c(1.0), head), half))  # 1 - head - half exactly
    cos_r = w.add(head, tail)
    k = w.core
    quadrant = k.cast(n, dt.int32)  # n finite and small: clamped or reduced mod 4 by the caller
    one, two, zero = (k.constant(v, dt.int32) for v in (1, 2, 0))
    if cosine:
        quadrant = k.add(quadrant, one)
    odd = k.compare("!=", k.and_(quadrant, one), zero)
    negate = k.compare("!=", k.and_(quadrant, two), zero)
    value = w.select(odd, cos_r, sin_r)
    return w.select(negate, w.neg(value), value)


def _body32(m: Float, x: Scalar, cosine: bool) -> Scalar:
    w = Float(m.core, dt.float64)
    # reduce |x| (t mod 4 below is exact only for t >= 0): sin is odd, cos even
    magnitude = w.clamp(w.abs(m.core.cast(x, dt.float64)), 0.0, 3.5e38)  # inf, nan -> finite; restored below
    n, r = _reduce_exact(w, magnitude)
    result = m.core.cast(_eval(w, n, r, 32, cosine), m.dtype)
    if not cosine:
        result = m.select(m.lt(x, m.c(0.0)), m.neg(result), result)
    return _finish(m, x, result, cosine)


def _body64(m: Float, x: Scalar, cosine: bool) -> Scalar:
    big = m.ge(m.abs(x), m.c(FAST_LIMIT_F64))  # false for nan
    n, r = _reduce_fast(m, m.clamp(x, -FAST_LIMIT_F64, FAST_LIMIT_F64))
    fast = _finish(m, x, _eval(m, n, r, 64, cosine), cosine)
    return m.core.libm_where(big, "cos" if cosine else "sin", x, fast)


def _finish(m: Float, x: Scalar, result: Scalar, cosine: bool) -> Scalar:
    if not cosine:
        result = m.select(m.eq(x, m.c(0.0)), x, result)  # sin(-0) = -0
    inf = m.c(float("inf"))
    result = m.select(m.eq(m.abs(x), inf), m.c(float("nan")), result)
    return m.select(m.isnan(x), x, result)


def sin_body(m: Float, x: Scalar) -> Scalar:
    """sin(x); float32 exact reduction everywhere, float64 fast for |x| < 2^30 (module docstring)."""
    return (_body64 if m.is64 else _body32)(m, x, False)


def cos_body(m: Float, x: Scalar) -> Scalar:
    """cos(x); as sin."""
    return (_body64 if m.is64 else _body32)(m, x, True)
