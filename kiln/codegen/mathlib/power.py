"""pow(x, y) for float32 and float64 as exp(y log|x|), with C99's (and numpy's) special cases.

float32 computes y log|x| and its exp in float64, where the product's error is far below a
float32 ulp. float64 needs log|x| to about 2^-64 relative (an error d in y log|x| is a
relative error d in the result, and |y log|x|| reaches 745), so its log is carried as a
double-double: s = f / (2 + f) exactly as sh + sl, the first two terms of 2 atanh(s) = 2s +
(2/3) s^3 + ... as error-free products, and only the small rest from the LOG_P polynomial.
"""

from __future__ import annotations

from ...ir import dtypes as dt
from ..core import Scalar
from .constants import F64, LN2, split
from .core import Float
from .exp_log import decompose, exp_body, exp_dd_body, log_body

_LN2_DD = split(LN2, F64, 40)  # e * hi exact for |e| < 2^11
_TWO_THIRDS = (0.6666666666666666, 3.700743415417188e-17)  # 2/3 as a double-double
# 2 atanh(s) = 2s + (2/3) s^3 + s^3 z P1(z), z = s^2, |s| <= 3 - 2 sqrt(2) (fit LOG_P1)
LOG_P1_F64 = (
    0.40000000000002256, 0.2857142857010005, 0.22222222519827442, 0.1818178437633325, 0.15386756871795665,
    0.13256829178616444, 0.13196216454279602,
)  # fmt: skip


def _log_dd(m: Float, a: Scalar) -> tuple[Scalar, Scalar]:
    """log(a) as hi + lo for a >= 0 (log 0 = -inf, log inf = inf, nan stays nan in hi)."""
    e, f = decompose(m, a)
    d, dl = m.fast_two_sum(m.c(2.0), f)  # 2 + f == d + dl exactly
    sh = m.div(f, d)
    remainder = m.sub(m.fma(m.neg(sh), d, f), m.mul(sh, dl))  # f - sh (d + dl); the fma is exact
    sl = m.div(remainder, d)
    q, qe = m.two_prod(sh, sh)
    cube, cube_e = m.two_prod(sh, q)
    cube_e = m.fma(sh, qe, cube_e)
    third_h, third_e = m.two_prod(cube, m.c(_TWO_THIRDS[0]))  # (2/3) s^3, the first tail term
    small = m.fma(cube, m.c(_TWO_THIRDS[1]), m.fma(cube_e, m.c(_TWO_THIRDS[0]), third_e))
    small = m.fma(m.mul(m.c(2.0), q), sl, small)  # 3 sh^2 sl of s^3, times 2/3
    small = m.fma(m.mul(cube, q), m.poly(q, LOG_P1_F64), small)  # the rest of the series
    small = m.fma(e, m.c(_LN2_DD[1]), m.fma(m.c(2.0), sl, small))
    h1, l1 = m.two_sum(m.mul(e, m.c(_LN2_DD[0])), m.mul(m.c(2.0), sh))
    h2, l2 = m.two_sum(h1, third_h)
    hi, lo = m.fast_two_sum(h2, m.add(m.add(l1, l2), small))
    inf = float("inf")
    hi = m.select(m.eq(a, m.c(0.0)), m.c(-inf), hi)
    hi = m.select(m.eq(a, m.c(inf)), a, hi)
    return m.select(m.isnan(a), a, hi), lo


def _magnitude64(m: Float, a: Scalar, y: Scalar) -> Scalar:
    hi, lo = _log_dd(m, a)
    zh, ze = m.two_prod(y, hi)
    return exp_dd_body(m, zh, m.fma(y, lo, ze))


def _magnitude32(m: Float, a: Scalar, y: Scalar) -> Scalar:
    wide = Float(m.core, dt.float64)
    big_a, big_y = m.core.cast(a, dt.float64), m.core.cast(y, dt.float64)
    return m.core.cast(exp_body(wide, wide.mul(big_y, log_body(wide, big_a))), m.dtype)


def pow_body(m: Float, x: Scalar, y: Scalar) -> Scalar:
    """x ** y. float32 <= 1 ulp, float64 <= 2 ulp (measured). Special cases as C99 Annex F:
    pow(x, +-0) = 1 and pow(1, y) = 1 even for nan; pow(-1, +-inf) = 1; a negative finite x with a
    finite non-integer y gives nan; a negative x with an odd integer y gives the negated result
    (so -0 and -inf keep their sign); zeros, infs and inf exponents follow from exp(y log|x|)
    with log 0 = -inf and log inf = inf."""
    a = m.abs(x)
    magnitude = (_magnitude64 if m.is64 else _magnitude32)(m, a, y)
    inf = m.c(float("inf"))
    y_integer = m.eq(m.floor(y), y)  # true for +-inf, false for nan
    half = m.mul(y, m.c(0.5))
    y_odd = m.both(y_integer, m.ne(m.floor(half), half))
    negative = m.core.compare("<", m.to_bits(x), m.i(0))  # the sign bit: -0 counts
    result = m.select(m.both(negative, y_odd), m.neg(magnitude), magnitude)
    finite_negative = m.both(m.lt(x, m.c(0.0)), m.gt(x, m.neg(inf)))
    not_integer = m.both(m.core.not_(y_integer), m.lt(m.abs(y), inf))
    result = m.select(m.both(finite_negative, not_integer), m.c(float("nan")), result)
    one = m.either(m.eq(x, m.c(1.0)), m.eq(y, m.c(0.0)))
    one = m.either(one, m.both(m.eq(a, m.c(1.0)), m.eq(m.abs(y), inf)))
    return m.select(one, m.c(1.0), result)
