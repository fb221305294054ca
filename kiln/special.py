"""``kiln.special``: PyTorch's ``torch.special`` functions, written over kiln's ops.

Every function here is a composite of kiln's primitives, so it runs eagerly, is differentiable
(its gradient is that of the formula), and fuses when compiled. Integer inputs compute in the
default float dtype, as PyTorch does. Where a formula has several branches, each branch sees
only inputs in its own range (the others get a harmless value), so no branch puts an inf or a
nan into the gradient of the one that was picked.

Accuracy, float64 against PyTorch: ``erfc``, ``erfcx``, ``log_ndtr`` and ``ndtr`` keep their
relative accuracy in the tails (1 - erf below 1.5, a continued fraction from there);
``gammaln`` (Lanczos, g = 7), ``digamma`` (asymptotic series past 10 with the recurrence below),
``i0``/``i1`` (power series to 50, asymptotic series beyond) and ``erfinv`` (Giles' estimate and
Newton steps; in the tails Newton on log erfc) agree to about 1e-13, and ``ndtri`` keeps its
relative accuracy in both tails.

>>> import kiln
>>> kiln.special.erfc(kiln.tensor([0.0, 10.0], dtype=kiln.float64))
tensor([1.0000e+00, 2.0885e-45], dtype=kiln.float64)
"""

from __future__ import annotations

import math

from . import frontend
from .frontend import ops
from .frontend.tensor import Tensor
from .ir import dtypes as dt

__all__ = [
    "erf", "erfc", "erfcx", "erfinv", "expit", "logit", "xlogy", "xlog1py", "log1p", "expm1", "exp2", "gammaln",
    "digamma", "psi", "multigammaln", "logsumexp", "softmax", "log_softmax", "i0", "i0e", "i1", "i1e", "sinc",
    "entr", "ndtr", "ndtri", "log_ndtr", "round", "polygamma",
]  # fmt: skip

_SQRT_PI = math.sqrt(math.pi)
_SQRT2 = math.sqrt(2.0)
_ = frontend  # the package is imported for its side effect of binding Tensor methods


def _float(x) -> Tensor:
    """``x`` as a floating tensor: integers and bools compute in the default float dtype."""
    if not isinstance(x, Tensor):
        x = ops.tensor(x)
    if not x.is_floating_point():
        x = ops.cast(x, dt.get_default_dtype())
    return x


def _floats(input, other) -> tuple[Tensor, Tensor]:
    """Two operands as floating tensors; a Python number beside a floating tensor takes its dtype, as
    PyTorch's wrapped numbers do (``xlogy(x64, 2.0)`` took the log of a float32 2.0: 3e-9 off)."""
    if isinstance(input, Tensor) and not isinstance(other, Tensor) and input.is_floating_point():
        return input, ops.tensor(other, dtype=input.dtype, device=input.device)
    if isinstance(other, Tensor) and not isinstance(input, Tensor) and other.is_floating_point():
        return ops.tensor(input, dtype=other.dtype, device=other.device), other
    return _float(input), _float(other)


def _horner(x: Tensor, coeffs) -> Tensor:
    """sum(coeffs[k] x^k)."""
    acc = ops.full_like(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * x + c
    return acc


def _safe(condition: Tensor, x: Tensor, fill: float) -> Tensor:
    """``x`` where ``condition`` holds, else ``fill``: what a branch sees outside its range."""
    return ops.where(condition, x, fill)


# ----------------------------------------------------------------------------- error functions
def erf(input) -> Tensor:
    return ops.erf(_float(input))


_CF_FROM = 1.5  # below, 1 - erf(x) loses at most a factor 30 (erfc(1.5) = 0.034) to cancellation
_CF_TERMS = 80  # the continued fraction's relative error at 1.5 is then about 1e-15


def _erfcx_nonnegative(x: Tensor) -> Tensor:
    """exp(x^2) erfc(x) for x >= 0: 1 - erf(x) below 1.5, a continued fraction from there."""
    small = x < _CF_FROM
    xs = _safe(small, x, 0.0)
    near = ops.exp(xs * xs) * (1.0 - ops.erf(xs))
    xf = _safe(~small, x, _CF_FROM)
    # erfc(x) exp(x^2) sqrt(pi) = 1 / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...)))), from the bottom
    fraction = xf
    for k in range(_CF_TERMS, 0, -1):
        fraction = xf + (k / 2) / fraction
    return ops.where(small, near, 1.0 / (fraction * _SQRT_PI))


def _exp_minus_square(a: Tensor) -> Tensor:
    """exp(-a^2) without the rounding of a^2 (1e-13 relative at a = 25): a = hi + lo with hi on a
    grid of 1/16, so hi^2 is exact and a^2 = hi^2 + lo (a + hi)."""
    hi = ops.round(a * 16.0) / 16.0
    return ops.exp(-hi * hi) * ops.exp(-(a - hi) * (a + hi))


def erfc(input) -> Tensor:
    """1 - erf(x), accurate in the tail (erfc(10) = 2.09e-45 in float64)."""
    x = _float(input)
    positive = x >= 0
    a = ops.where(positive, x, -x)
    a_safe = _safe(ops.isfinite(a), a, 0.0)
    tail = _exp_minus_square(a_safe) * _erfcx_nonnegative(a_safe)
    tail = ops.where(ops.isinf(a), 0.0, tail)
    return ops.where(ops.isnan(x), x, ops.where(positive, tail, 2.0 - tail))


def erfcx(input) -> Tensor:
    """exp(x^2) erfc(x), without the overflow of either factor for large x."""
    x = _float(input)
    positive = x >= 0
    xp_ = _safe(positive & ~ops.isinf(x), x, 0.0)
    right = _erfcx_nonnegative(xp_)
    xn = _safe(~positive, x, 0.0)
    left = 2.0 * ops.exp(xn * xn) - _erfcx_nonnegative(-xn)
    out = ops.where(positive, ops.where(ops.isinf(x), 0.0, right), left)
    return ops.where(ops.isnan(x), x, out)


def _erfcinv_tail(c: Tensor) -> Tensor:
    """y >= 0 with erfc(y) = c, for c in (0, 0.5]: Newton on log erfc(y) = log c, which is nearly
    linear in y^2, from y^2 = L - log(pi L) / 2 (L = -log c); four steps reach float64 accuracy
    from c = 0.5 down to the smallest c."""
    log_c = ops.log(c)
    big = -log_c
    y = ops.sqrt(ops.clamp(big - 0.5 * ops.log(big * math.pi), min=0.01))
    for _ in range(4):
        scaled = _erfcx_nonnegative(y)
        y = y + (ops.log(scaled) - y * y - log_c) * scaled * (_SQRT_PI / 2)
    return y


def _erfinv_centre(x: Tensor) -> Tensor:
    """erfinv on |x| < 0.5: Giles' single-precision polynomial and two Newton steps on erf."""
    w = -ops.log((1.0 - x) * (1.0 + x)) - 2.5
    y = x * _horner(w, (1.50140941, 0.246640727, -0.00417768164, -0.00125372503, 0.00021858087,
                        -4.39150654e-06, -3.5233877e-06, 3.43273939e-07, 2.81022636e-08))  # fmt: skip
    for _ in range(2):
        y = y - (ops.erf(y) - x) / ((2.0 / _SQRT_PI) * ops.exp(-y * y))
    return y


def erfinv(input) -> Tensor:
    """The inverse of erf on [-1, 1] (inf at +-1, nan outside). Towards +-1, where erf(y) - x would
    cancel, it solves erfc(|y|) = 1 - |x| instead (1 - |x| is exact there)."""
    x = _float(input)
    centre = ops.abs(x) < 0.5
    tail = (ops.abs(x) >= 0.5) & (ops.abs(x) < 1)
    y_centre = _erfinv_centre(_safe(centre, x, 0.0))
    y_tail = ops.sign(x) * _erfcinv_tail(1.0 - ops.abs(_safe(tail, x, 0.5)))
    edge = ops.where(x == 1.0, math.inf, ops.where(x == -1.0, -math.inf, math.nan))
    return ops.where(centre, y_centre, ops.where(tail, y_tail, edge))


def ndtr(input) -> Tensor:
    """The standard normal CDF."""
    return 0.5 * erfc(-_float(input) / _SQRT2)


def log_ndtr(input) -> Tensor:
    """log of the standard normal CDF, accurate far into both tails."""
    x = _float(input)
    negative = x < 0
    xn = _safe(negative, x, 0.0)
    left = math.log(0.5) - 0.5 * xn * xn + ops.log(erfcx(-xn / _SQRT2))
    xp_ = _safe(~negative, x, 0.0)
    right = ops.log1p(-0.5 * erfc(xp_ / _SQRT2))
    return ops.where(negative, left, right)


def ndtri(input) -> Tensor:
    """The inverse of the standard normal CDF, accurate in both tails (ndtri(1e-300) = -37.05)."""
    p = _float(input)
    low, high = p < 0.25, p > 0.75
    inside = (p > 0) & (p < 1)
    # 2p and 2 (1 - p) are exact in the tails, and 2p - 1 in the middle
    y_low = -_SQRT2 * _erfcinv_tail(2.0 * _safe(low & inside, p, 0.1))
    y_high = _SQRT2 * _erfcinv_tail(2.0 * (1.0 - _safe(high & inside, p, 0.9)))
    y_mid = _SQRT2 * _erfinv_centre(2.0 * _safe(~low & ~high, p, 0.5) - 1.0)
    y = ops.where(low, y_low, ops.where(high, y_high, y_mid))
    edge = ops.where(p == 0, -math.inf, ops.where(p == 1, math.inf, math.nan))
    return ops.where(inside, y, edge)


# ----------------------------------------------------------------------------- gamma family
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
            12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7)  # fmt: skip


def _lgamma_right(x: Tensor) -> Tensor:
    """log Gamma(x) for x >= 0.5 (Lanczos); the large terms are grouped so that no inf - inf arises."""
    z = x - 1.0
    series = ops.full_like(z, _LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1):
        series = series + c / (z + float(i))
    t = z + (_LANCZOS_G + 0.5)
    return 0.5 * math.log(2 * math.pi) + (z + 0.5) * (ops.log(t) - 1.0) - _LANCZOS_G + ops.log(series)


def gammaln(input) -> Tensor:
    """log |Gamma(x)| (inf at 0 and the negative integers)."""
    x = _float(input)
    right = x >= 0.5
    r = _lgamma_right(_safe(right & ~ops.isinf(x), x, 1.0))
    xl = _safe(~right, x, 0.25)
    # reflection: log|Gamma(x)| = log(pi / |sin(pi x)|) - log Gamma(1 - x); sin of the distance to
    # the nearest integer keeps its precision for large |x|
    s = ops.abs(ops.sin(math.pi * (xl - ops.round(xl))))
    pole = s == 0
    left = math.log(math.pi) - ops.log(_safe(~pole, s, 1.0)) - _lgamma_right(1.0 - xl)
    left = ops.where(pole, math.inf, left)
    out = ops.where(ops.isinf(x), math.inf, ops.where(right, r, left))
    # Gamma(1) = Gamma(2) = 1 exactly: the value there is 0, the slope still digamma's
    return ops.where((x == 1.0) | (x == 2.0), out - out.detach(), out)


def _digamma_positive(x: Tensor) -> Tensor:
    """psi(x) for x > 0: the recurrence up to x + 10, then the asymptotic series."""
    small = x < 10.0
    shifted = ops.where(small, x + 10.0, x)
    correction = ops.zeros_like(x)
    xs = _safe(small, x, 1.0)
    for k in range(10):
        correction = correction + ops.where(small, 1.0 / (xs + float(k)), 0.0)
    inv2 = 1.0 / (shifted * shifted)
    tail = _horner(inv2, (0.0, 1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12))
    return ops.log(shifted) - 0.5 / shifted - tail - correction


def digamma(input) -> Tensor:
    """The logarithmic derivative of Gamma (-inf at 0, nan at the negative integers, as PyTorch)."""
    x = _float(input)
    positive = x > 0
    r = _digamma_positive(_safe(positive & ~ops.isinf(x), x, 1.0))
    xl = _safe(~positive, x, -0.5)
    frac = xl - ops.round(xl)
    pole = frac == 0
    angle = math.pi * _safe(~pole, frac, 0.25)
    tangent = ops.sin(angle) / ops.cos(angle)
    left = _digamma_positive(1.0 - xl) - math.pi / tangent
    # at 0, psi(x) ~ -1/x: -inf at +0 and +inf at -0
    left = ops.where(pole, ops.where(x == 0, ops.where(1.0 / x < 0, math.inf, -math.inf), math.nan), left)
    out = ops.where(positive, r, left)
    return ops.where(x == math.inf, math.inf, ops.where(x == -math.inf, math.nan, out))


psi = digamma


def multigammaln(input, p: int) -> Tensor:
    """log of the multivariate gamma function of dimension p, defined where every element exceeds
    (p - 1) / 2; like PyTorch 2.13 it computes the sum of log-gammas elsewhere too, without reading
    the values (a check would stop a trace)."""
    a = _float(input)
    if p < 1:
        raise ValueError(f"p has to be greater than or equal to 1, got {p}")
    total = gammaln(a)
    for j in range(1, p):
        total = total + gammaln(a - j / 2)
    return total + p * (p - 1) / 4 * math.log(math.pi)


# ----------------------------------------------------------------------------- modified Bessel functions
def _bessel_scaled(x: Tensor, order: int) -> Tensor:
    """exp(-|x|) I_order(|x|) for order 0 or 1: power series up to 50, asymptotic series beyond."""
    a = ops.abs(x)
    near = a <= 50.0
    an = _safe(near, a, 1.0)
    q = an * an / 4.0
    series = ops.ones_like(an)
    for k in range(120, 0, -1):  # sum_k q^k / (k! (k + order)!), nested from the inside
        series = 1.0 + series * q / float(k * (k + order))
    if order == 1:
        series = series * an / 2.0
    near_value = series * ops.exp(-an)
    af = _safe(~near, a, 100.0)
    term, total = ops.ones_like(af), ops.ones_like(af)
    for k in range(1, 30):  # (-1)^k prod_j (4 order^2 - (2j - 1)^2) / (k! (8x)^k)
        term = term * (-(4.0 * order * order - (2 * k - 1) ** 2) / (k * 8.0)) / af
        total = total + term
    far_value = total / ops.sqrt(2 * math.pi * af)
    return ops.where(near, near_value, far_value)


def i0e(input) -> Tensor:
    return _bessel_scaled(_float(input), 0)


def i0(input) -> Tensor:
    x = _float(input)
    return _bessel_scaled(x, 0) * ops.exp(ops.abs(x))


def i1e(input) -> Tensor:
    x = _float(input)
    return ops.sign(x) * _bessel_scaled(x, 1)


def i1(input) -> Tensor:
    x = _float(input)
    return ops.sign(x) * _bessel_scaled(x, 1) * ops.exp(ops.abs(x))


# ----------------------------------------------------------------------------- elementwise
def expit(input) -> Tensor:
    return ops.sigmoid(_float(input))


def logit(input, eps: float | None = None) -> Tensor:
    """log(p / (1 - p)), with p clamped to [eps, 1 - eps] when eps is given."""
    p = _float(input)
    if eps is not None:
        p = ops.clamp(p, eps, 1.0 - eps)
    return ops.log(p / (1.0 - p))


def xlogy(input, other) -> Tensor:
    """x * log(y), 0 where x == 0 (unless y is nan)."""
    x, y = _floats(input, other)
    zero = (x == 0) & ~ops.isnan(y)
    return ops.where(zero, 0.0 * x, x * ops.log(ops.where(zero, 1.0, y)))


def xlog1py(input, other) -> Tensor:
    x, y = _floats(input, other)
    zero = (x == 0) & ~ops.isnan(y)
    return ops.where(zero, 0.0 * x, x * ops.log1p(ops.where(zero, 0.0, y)))


def log1p(input) -> Tensor:
    return ops.log1p(_float(input))


def expm1(input) -> Tensor:
    return ops.expm1(_float(input))


def exp2(input) -> Tensor:
    return ops.exp(_float(input) * math.log(2.0))


def sinc(input) -> Tensor:
    """sin(pi x) / (pi x), 1 at 0 (with slope 0 there)."""
    x = _float(input)
    zero = x == 0
    px = math.pi * ops.where(zero, 1.0, x)
    return ops.where(zero, 1.0, ops.sin(px) / px)


def entr(input) -> Tensor:
    """-x log x: 0 at 0, -inf below 0."""
    x = _float(input)
    positive = x > 0
    value = -x * ops.log(ops.where(positive, x, 1.0))
    return ops.where(positive, value, ops.where(x == 0, 0.0 * x, ops.where(ops.isnan(x), x, -math.inf)))


def round(input, *, decimals: int = 0) -> Tensor:  # noqa: A001 - torch.special.round
    return ops.round(input, decimals=decimals)


def logsumexp(input, dim, keepdim: bool = False) -> Tensor:
    return ops.logsumexp(_float(input), dim, keepdim)


def softmax(input, dim: int, *, dtype=None) -> Tensor:
    return ops.softmax(input, dim, dtype=dtype)


def log_softmax(input, dim: int, *, dtype=None) -> Tensor:
    return ops.log_softmax(input, dim, dtype=dtype)


# ----------------------------------------------------------------------------- polygamma
# B_2k, the Bernoulli numbers of the asymptotic series of psi^(n).
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510)


def _polygamma_positive(n: int, x: Tensor) -> Tensor:
    """(-1)^(n+1) psi^(n)(x) for x > 0 and n >= 1: the recurrence up to x + 16, then the
    asymptotic series (n-1)!/z^n + n!/(2 z^(n+1)) + sum B_2k (2k+n-1)!/(2k)! / z^(2k+n)."""
    small = x < 16.0
    xs = _safe(small, x, 1.0)
    correction = ops.zeros_like(x)
    for k in range(16):
        correction = correction + ops.where(small, ops.pow(xs + float(k), -float(n + 1)), 0.0)
    z = ops.where(small, x + 16.0, x)
    coeffs = [b * math.factorial(2 * k + n - 1) / math.factorial(2 * k) for k, b in enumerate(_BERNOULLI, start=1)]
    w = 1.0 / (z * z)
    series = _horner(w, (0.0, *coeffs))
    head = math.factorial(n - 1) + math.factorial(n) / 2.0 / z
    return ops.pow(z, -float(n)) * (head + series) + math.factorial(n) * correction


def _cot_derivative(n: int, c: Tensor) -> Tensor:
    """d^n/dx^n cot(pi x) as a polynomial in c = cot(pi x): P_0 = c, P_k+1 = -pi (1 + c^2) P_k'."""
    poly = [0.0, 1.0]  # coefficients, lowest degree first
    for _ in range(n):
        deriv = [i * a for i, a in enumerate(poly)][1:] or [0.0]
        nxt = [0.0] * (len(deriv) + 2)
        for i, a in enumerate(deriv):  # -pi (1 + c^2) * deriv
            nxt[i] -= math.pi * a
            nxt[i + 2] -= math.pi * a
        poly = nxt
    return _horner(c, tuple(poly))


def polygamma(n: int, input) -> Tensor:
    """The n-th derivative of digamma. Non-positive x by the reflection formula
    psi^(n)(x) = (-1)^n psi^(n)(1 - x) - pi d^n/dx^n cot(pi x); at 0 and the negative integers
    the sign of the pole at +0. At +inf the value is the limit 0 (PyTorch gives nan there)."""
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    if n == 0:
        return digamma(input)
    x = _float(input)
    sign = -1.0 if n % 2 == 0 else 1.0  # (-1)^(n+1)
    positive = x > 0
    r = sign * _polygamma_positive(n, _safe(positive & ~ops.isinf(x), x, 1.0))
    xl = _safe(~positive, x, -0.5)
    frac = xl - ops.round(xl)
    pole = frac == 0
    angle = math.pi * _safe(~pole, frac, 0.25)
    cot = ops.cos(angle) / ops.sin(angle)
    reflected = (-1.0) ** n * sign * _polygamma_positive(n, 1.0 - xl)
    left = ops.where(pole, sign * math.inf, reflected - math.pi * _cot_derivative(n, cot))
    out = ops.where(positive, r, left)
    return ops.where(x == math.inf, 0.0, ops.where(x == -math.inf, math.nan, out))
