"""tanh, sigmoid and erf for float32 and float64, as straight-line code over the scalar core.

Each is two formulas joined by a ``select`` -- a polynomial where the function is small (so
tiny arguments keep full relative accuracy: no 1 - 2/(e^2x + 1) cancellation) and an
exp-based form elsewhere -- both computed, one kept, which is what a vector lane does anyway.
Coefficients come from ``fit.py`` (the table names are the fits' names there).
"""

from __future__ import annotations

# The float64 erf tables are the eager kernel's (ir's numpy erf computes the same formulas): one copy.
from ...ir.primitives.numpy_erf import ERF_SMALL_F64, ERFC_LOG_F64
from ..core import Scalar
from .core import Float
from .exp_log import EXP_RANGE, exp_body, expm1_reduced, pow2_shifted, reduce_ln2

# float64 tanh(x) = x + x^3 P(x^2) for |x| < 0.625 (fit TANH_P)
TANH_LIMIT = 0.625
TANH_P_F64 = (
    -0.33333333333333315, 0.13333333333329742, -0.053968253966058956, 0.02186948846871644, -0.008863234312589967,
    0.0035921139999533936, -0.0014557259484148312, 0.000589451800007331, -0.00023701173230345558,
    9.155841449536016e-05, -3.0187222402270463e-05, 6.04246885438209e-06,
)  # fmt: skip

# erf(x) = x P(x^2) for |x| < 1 (fit ERF_SMALL)
ERF_SMALL_F32 = (
    1.1283791065216064, -0.3761262595653534, 0.1128358542919159, -0.026853812858462334, 0.005188327748328447,
    -0.0008010193705558777, 7.853861461626366e-05,
)  # fmt: skip
# erfc(x) = exp(-x^2 + S(u)), u = (x - mid) / half in [-1, 1], for x in [1, 4] (float32) / [1, 6]
# (float64); beyond, erf(x) rounds to 1 (fit ERFC_LOG, weighted by erfc/erf: the error it causes in erf)
ERFC_RANGE = {32: (1.0, 4.0), 64: (1.0, 6.0)}
ERFC_LOG_F32 = (
    -1.556815266609192, -0.5290209054946899, 0.12624339759349823, -0.03663057088851929, 0.010967697948217392,
    -0.0032729576341807842, 0.0007035353919491172, -0.00037072403938509524,
)  # fmt: skip


def _odd_poly(m: Float, x: Scalar, coeffs: tuple[float, ...]) -> Scalar:
    """x + x^3 P(x^2): the leading x is exact, so tiny x come out unchanged (and -0 by the select:
    -0 + (+0) would be +0)."""
    t = m.mul(x, x)
    return m.select(m.eq(x, m.c(0.0)), x, m.fma(m.mul(x, t), m.poly(t, coeffs), x))


def tanh_body(m: Float, x: Scalar) -> Scalar:
    """tanh(x). float64: x + x^3 P(x^2) for |x| < 0.625, else sign(x) (1 - 2 / (exp(2|x|) + 1)),
    which saturates to +-1 without overflow trouble (exp(2|x|) = inf gives exactly 1).

    float32: sign(x) E / (E + 2) with E = expm1(2|x|), one formula over the whole range: a tanh
    kernel runs 1.4x and tanh-GELU 1.25x faster than with the two formulas and their select.
    expm1 keeps its relative accuracy near 0 (E ~ 2|x|: no cancellation), but rounding E + 2 costs
    about an ulp more than the two formulas (2.57 ulp over every float32, at 0.062, against 1.5); correcting the quotient
    for it costs as much as the select saves. Nothing on the float32 path converts to an integer,
    so nan runs through it (the clamp passes nan) and needs no select at the end."""
    a = m.abs(x)
    # past 2|x| = 20 (float32) / 40 (float64) the result rounds to 1: clamping there keeps 2^k normal,
    # so exp needs no overflow handling (one power-of-two factor instead of ldexp's two)
    # float32: k <= 29, and the reduction's one-step error k (ln2 - LN2_HI) < 6e-8 reaches the result
    # scaled by tanh's sensitivity to exp's relative error, (1 - tanh^2) / 2: small where k is not
    # (under 0.05 ulp); the step it saves is 5% of a GELU kernel's time, which is bound by fmas
    _, r, shifted = reduce_ln2(m, m.at_most(m.add(a, a), 40.0 if m.is64 else 20.0), tail=m.is64)
    u = pow2_shifted(m, shifted)
    if not m.is64:
        e = m.fma(u, expm1_reduced(m, r), m.sub(u, m.c(1.0)))  # 2^k (expm1(r) + 1) - 1, exact 2^k - 1
        return m.copysign(m.div(e, m.add(e, m.c(2.0))), x)
    small = _odd_poly(m, x, TANH_P_F64)
    e = m.mul(m.add(m.c(1.0), expm1_reduced(m, r)), u)
    large = m.copysign(m.sub(m.c(1.0), m.div(m.c(2.0), m.add(e, m.c(1.0)))), x)
    result = m.select(m.lt(a, m.c(TANH_LIMIT)), small, large)
    return m.select(m.isnan(x), x, result)


# exp(-|x|) is 2^k exp(r) with k from 0 down to the subnormals' end: 2^(k + _SIGMOID_OFFSET) is normal
# for all of them, and the product's final scaling by 2^-offset rounds once, into a subnormal if it must
_SIGMOID_OFFSET = {32: 64, 64: 600}


def sigmoid_body(m: Float, x: Scalar) -> Scalar:
    """1 / (1 + exp(-x)) as e / (1 + e) or 1 / (1 + e) with e = exp(-|x|) <= 1: never overflows,
    and sigmoid of a large negative x is exp(x) to full relative accuracy (down to subnormals).

    exp of an argument known to be <= 0 needs one clamp (below, where it rounds to 0) and one
    power-of-two factor known to stay normal, not exp_body's two-sided clamp and ldexp; nothing
    converts to an integer, so nan runs through to the result."""
    offset = _SIGMOID_OFFSET[m.bits]
    _, r, shifted = reduce_ln2(m, m.at_least(m.neg(m.abs(x)), EXP_RANGE[m.bits][0]))
    scaled = m.mul(m.add(m.c(1.0), expm1_reduced(m, r)), pow2_shifted(m, shifted, offset))
    e = m.mul(scaled, m.c(2.0**-offset))
    numerator = m.select(m.ge(x, m.c(0.0)), m.c(1.0), e)  # nan: e is nan, so is the result
    return m.div(numerator, m.add(m.c(1.0), e))


def erf_body(m: Float, x: Scalar) -> Scalar:
    """erf(x): x P(x^2) for |x| < 1, else sign(x) (1 - exp(-x^2 + S(|x|))); |x| is clamped to the
    fitted range's end, where 1 - erfc rounds to 1 already."""
    a = m.abs(x)
    coeffs = ERF_SMALL_F64 if m.is64 else ERF_SMALL_F32
    # x + x (P(x^2) - 1): the big term x is exact and P - 1 (at most 0.17 in size) rounds 8x finer than P
    small = m.fma(x, m.poly(m.mul(x, x), (coeffs[0] - 1.0, *coeffs[1:])), x)
    lo, hi = ERFC_RANGE[m.bits]
    ac = m.clamp(a, lo, hi)  # nan -> lo; the final select puts nan back
    u = m.fma(ac, m.c(2.0 / (hi - lo)), m.c(-(hi + lo) / (hi - lo)))
    s = m.poly(u, ERFC_LOG_F64 if m.is64 else ERFC_LOG_F32)
    erfc = exp_body(m, m.fma(m.neg(ac), ac, s))  # -x^2 + S rounded once
    large = m.copysign(m.sub(m.c(1.0), erfc), x)
    result = m.select(m.lt(a, m.c(1.0)), small, large)
    return m.select(m.isnan(x), x, result)
