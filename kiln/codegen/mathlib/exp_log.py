"""exp, expm1, log, log1p and pow for float32 and float64, as straight-line code over the scalar core.

Each ``*_body(m, ...)`` builds the routine through ``m`` (a
:class:`~.core.Float`) and returns the result; ``__init__`` wraps them into functions.
Polynomial coefficients come from ``fit.py`` (weighted Remez fits; the name of each table is
the name of its fit there).
"""

from __future__ import annotations

from ..core import Scalar
from .constants import F32, F64, LN2, nearest, split
from .core import Float

# ln2 = LN2_HI + LN2_LO where k * LN2_HI is exact for every exponent k a routine meets
_LN2_32 = split(LN2, F32, 24)  # exp's k * LN2_HI inside an fma: exact product, no trailing zeros needed
_LN2_64 = split(LN2, F64, 53)
_LN2_LOG_32 = split(LN2, F32, 14)  # log's e * LN2_HI in a plain multiply: |e| < 2^9
_LN2_LOG_64 = split(LN2, F64, 40)  # |e| < 2^11
_LOG2E = (nearest(1 / LN2, F32), nearest(1 / LN2, F64))

# expm1(r) = r + r^2 Q(r), |r| <= ln2/2 (fit EXPM1_Q)
EXPM1_Q_F32 = (0.4999999701976776, 0.1666654348373413, 0.04166720062494278, 0.00836651399731636, 0.001388252479955554)
EXPM1_Q_F64 = (
    0.5, 0.16666666666666677, 0.04166666666666651, 0.0083333333333217, 0.001388888888896231, 0.00019841269885939323,
    2.4801587172622995e-05, 2.7557244403934018e-06, 2.755740260295697e-07, 2.5108967568393673e-08,
    2.0875332317568525e-09,
)  # fmt: skip
# float32 log1p(f) = f + f^2 Q(f), f in [sqrt(1/2) - 1, sqrt(2) - 1] (fit LOG1P_Q)
LOG1P_Q_F32 = (
    -0.49999988079071045, 0.33333325386047363, -0.25001582503318787, 0.2000197321176529, -0.16609083116054535,
    0.14181825518608093, -0.13242989778518677, 0.129044309258461, -0.07621771842241287,
)  # fmt: skip
# float64 log1p(f) = 2 atanh(s) = 2s + s z P(z), s = f / (2 + f), z = s^2 (fit LOG_P)
LOG_P_F64 = (
    0.6666666666666666, 0.4000000000000624, 0.2857142856908734, 0.22222222646573014, 0.1818177568368237,
    0.15387089952802294, 0.13250136483215563, 0.1325116054290551,
)  # fmt: skip

# exp's argument is clamped so the integer exponent k stays where ldexp's two factors are normal;
# beyond the clamps the result is already inf (or 0) in that precision.
EXP_RANGE = {32: (-110.0, 100.0), 64: (-760.0, 720.0)}
_EXPM1_RANGE = {32: (-30.0, 89.0), 64: (-50.0, 710.0)}  # expm1 rounds to -1 below; 89 and 710 overflow


def reduce_ln2(m: Float, x: Scalar, tail: bool = True) -> tuple[Scalar, Scalar, Scalar]:
    """(k, r, shifted) with x = k ln2 + r, |r| <= ln2/2 (x clamped: finite, or nan where the caller
    restores it). k is rounded by the fma that scales x: ``shifted`` = x / ln2 + 1.5 * 2^p (p the
    mantissa width) keeps only whole numbers, so k = shifted - 1.5 * 2^p exactly and k sits in
    shifted's low mantissa bits, where :func:`pow2_shifted` moves it into an exponent without a
    float -> int conversion. Cody-Waite: the first fma for r is exact (x and k * LN2_HI share a
    grid fine enough for the small difference), the second rounds once. ``tail=False`` leaves the
    second out, for callers whose result hardly feels r's error of k (ln2 - LN2_HI): k (6e-8 / 2^24)
    in float32."""
    hi, lo = _LN2_64 if m.is64 else _LN2_32
    shifter = m.c(1.5 * 2.0**m.mantissa)
    shifted = m.fma(x, m.pick(*_LOG2E), shifter)
    k = m.sub(shifted, shifter)
    r = m.fma(k, m.c(-hi), x)
    return k, (m.fma(k, m.c(-lo), r) if tail else r), shifted


def pow2_shifted(m: Float, shifted: Scalar, offset: int = 0) -> Scalar:
    """2^(k + offset) for the k that :func:`reduce_ln2` left in ``shifted``, k + offset in the normal
    exponent range: the shifter's own bits end in at least as many zeros as the exponent field's
    shift drops, so adding the bias to all the bits and shifting leaves exactly k + offset + bias.
    Integer operations only: nan in, some float out (the caller's arithmetic carries the nan)."""
    k = m.core
    return m.from_bits(k.shl(k.add(m.to_bits(shifted), m.i(m.bias + offset)), m.i(m.mantissa)))


def expm1_reduced(m: Float, r: Scalar) -> Scalar:
    q = m.poly(r, EXPM1_Q_F64 if m.is64 else EXPM1_Q_F32)
    return m.fma(m.mul(r, r), q, r)


def exp_body(m: Float, x: Scalar) -> Scalar:
    """exp(x) = 2^k exp(r). float32 <= 1 ulp, float64 <= 1 ulp measured (see the tests)."""
    k, r, _ = reduce_ln2(m, m.clamp(x, *EXP_RANGE[m.bits]))
    result = m.ldexp(m.add(m.c(1.0), expm1_reduced(m, r)), m.to_int(k))
    return m.select(m.isnan(x), x, result)


def exp_dd_body(m: Float, hi: Scalar, lo: Scalar) -> Scalar:
    """exp(hi + lo) for a double-double argument (pow's y log x); lo is ignored unless hi is finite."""
    k, r, _ = reduce_ln2(m, m.clamp(hi, *EXP_RANGE[m.bits]))
    r = m.add(r, m.select(m.lt(m.abs(hi), m.c(800.0)), lo, m.c(0.0)))
    result = m.ldexp(m.add(m.c(1.0), expm1_reduced(m, r)), m.to_int(k))
    return m.select(m.isnan(hi), hi, result)


def expm1_body(m: Float, x: Scalar) -> Scalar:
    """expm1(x) = 2^k (expm1(r) + 1) - 1 = fma(2^k, expm1(r), 2^k - 1): exact 2^k - 1 for the k
    where it matters, and for k at the top of the range 2^(k-1) times 2 so 2^k never overflows."""
    k, r, _ = reduce_ln2(m, m.clamp(x, *_EXPM1_RANGE[m.bits]))
    em = expm1_reduced(m, r)
    top = m.gt(k, m.c(m.bias))  # k == 128 (float32) / 1024 (float64)
    u = m.pow2(m.to_int(m.sub(k, m.select(top, m.c(1.0), m.c(0.0)))))
    result = m.mul(m.fma(u, em, m.sub(u, m.c(1.0))), m.select(top, m.c(2.0), m.c(1.0)))
    result = m.select(m.eq(x, m.c(0.0)), x, result)  # expm1(-0) = -0
    return m.select(m.isnan(x), x, result)


def _log1p_reduced(m: Float, f: Scalar) -> Scalar:
    """log1p(f) for f in [sqrt(1/2) - 1, sqrt(2) - 1]."""
    if not m.is64:
        return m.fma(m.mul(f, f), m.poly(f, LOG1P_Q_F32), f)
    # float64: log1p(f) = f - hfsq + s (hfsq + z P(z)) with hfsq = f^2/2: the identity 2s = f - s f
    # makes this 2s + s z P(z); the big term f is exact, so the rounding errors land on small terms
    s = m.div(f, m.add(m.c(2.0), f))
    z = m.mul(s, s)
    hfsq = m.mul(m.c(0.5), m.mul(f, f))
    return m.add(f, m.fma(s, m.fma(z, m.poly(z, LOG_P_F64), hfsq), m.neg(hfsq)))


def decompose(m: Float, x: Scalar) -> tuple[Scalar, Scalar]:
    """(e, f) with x = 2^e (1 + f), 1 + f in [sqrt(1/2), sqrt(2)), for positive finite x (subnormals
    scaled up first); garbage for other x, which the callers replace."""
    tiny = m.lt(x, m.pick(2.0**-126, 2.0**-1022))
    scale_bits = 54 if m.is64 else 24
    x = m.select(tiny, m.mul(x, m.c(2.0**scale_bits)), x)
    sqrt_half = m.i(0x3FE6A09E667F3BCD if m.is64 else 0x3F3504F3)
    k = m.core
    offset = k.sub(m.to_bits(x), sqrt_half)
    e = k.ashr(offset, m.i(m.mantissa))
    e = k.sub(e, k.select(tiny, m.i(scale_bits), m.i(0)))
    mant = k.add(k.and_(offset, m.i((1 << m.mantissa) - 1)), sqrt_half)
    return m.to_float(e), m.sub(m.from_bits(mant), m.c(1.0))  # m - 1: exact (Sterbenz)


def _log_specials(m: Float, x: Scalar, zero_at: float, result: Scalar) -> Scalar:
    """log-like results at the edges: inf -> inf, below ``zero_at`` -> nan, at it -> -inf, nan -> nan."""
    inf = float("inf")
    result = m.select(m.eq(x, m.c(inf)), x, result)
    result = m.select(m.lt(x, m.c(zero_at)), m.c(float("nan")), result)
    result = m.select(m.eq(x, m.c(zero_at)), m.c(-inf), result)
    return m.select(m.isnan(x), x, result)


def log_body(m: Float, x: Scalar) -> Scalar:
    """log(x) = e ln2 + log1p(f): e * LN2_HI exact, the small terms summed first."""
    e, f = decompose(m, x)
    hi, lo = _LN2_LOG_64 if m.is64 else _LN2_LOG_32
    result = m.fma(e, m.c(hi), m.fma(e, m.c(lo), _log1p_reduced(m, f)))
    return _log_specials(m, x, 0.0, result)


def log1p_body(m: Float, x: Scalar) -> Scalar:
    """log1p(x): the polynomial on x itself where x is in its range; elsewhere log(u) + c/u with
    u = fl(1 + x) and c = (1 + x) - u exactly (TwoSum), so no digit of x is lost in forming 1 + x."""
    u, c = m.two_sum(m.c(1.0), x)
    e, f = decompose(m, u)
    direct = m.both(
        m.ge(x, m.pick(0.70710677 - 1, 0.7071067811865476 - 1)), m.lt(x, m.pick(0.41421354, 0.41421356237309503))
    )
    f = m.select(direct, x, f)
    e = m.select(direct, m.c(0.0), e)
    correction = m.select(direct, m.c(0.0), m.div(c, u))
    hi, lo = _LN2_LOG_64 if m.is64 else _LN2_LOG_32
    result = m.fma(e, m.c(hi), m.add(m.fma(e, m.c(lo), correction), _log1p_reduced(m, f)))
    result = m.select(m.eq(x, m.c(0.0)), x, result)  # log1p(-0) = -0
    return _log_specials(m, x, -1.0, result)
