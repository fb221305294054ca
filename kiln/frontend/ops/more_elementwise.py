"""More of PyTorch's elementwise names, composed from kiln's primitives: the inverse and hyperbolic
trigonometric functions, ``hypot``, ``logaddexp``, ``fmod``, ``copysign``, ``nan_to_num``, and aliases.

Every function here is plain Python over primitives, so its gradient comes from the primitives'
VJPs and ``kiln.compile`` traces it. kiln has no ``atan`` primitive: ``atan`` is computed by
halving the angle three times (``atan t = 2 atan(t / (1 + sqrt(1 + t^2)))``, which takes
``[0, 1]`` to ``[0, tan(pi/32)]``) and summing eight terms of the Taylor series there, where they
reach float64's precision (``tan(pi/32)^16 / 17 < 1e-17``); ``atan2``, ``asin`` and ``acos`` reduce
to it. Each branch taken by a ``where`` is fed a harmless value where it is not selected, so the
gradient of the branch not taken is 0 and never ``0 * inf = nan``.

The longer composites (the inverse and hyperbolic functions, ``hypot``, ``logaddexp``) are
``compiled_composite`` ops: with eager compiled kernels on, their eager calls run one fused kernel
forward and one backward (measured, float32, 1e6 elements, against the same calls on routed
primitives: 3-20x forward, 3-14x with the backward).
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import dtypes as dt
from ..eager_composites import compiled_composite
from ..tensor import Tensor, method
from ._util import cast, promote, scalar_tensor
from .creation import ones_like
from .elementwise import (
    _inplace,
    abs,
    add,
    clamp,
    cos,
    div,
    eq,
    exp,
    expm1,
    ge,
    gt,
    isinf,
    isnan,
    le,
    log,
    log1p,
    logical_and,
    logical_or,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pow,
    remainder,
    sign,
    sin,
    sqrt,
    sub,
    trunc,
    where,
)

__all__ = [
    "tan", "sinh", "cosh", "asinh", "acosh", "atanh", "atan", "atan2", "asin", "acos", "arctan", "arctan2",
    "arcsin", "arccos", "arcsinh", "arccosh", "arctanh", "hypot", "logaddexp", "logaddexp2", "exp2", "deg2rad",
    "rad2deg", "frac", "fmod", "float_power", "clamp_min", "clamp_max", "sgn", "signbit", "heaviside",
    "copysign", "nan_to_num", "isneginf", "isposinf", "isreal", "fmax", "fmin", "ldexp", "absolute",
    "greater", "greater_equal", "less", "less_equal", "not_equal", "positive",
]  # fmt: skip

_LN2 = math.log(2.0)


def _float(x: Tensor) -> Tensor:
    """Integers and bools compute in the default float dtype, as PyTorch's float-valued functions do."""
    return x if x._dtype.is_floating_point else cast(x, dt.get_default_dtype())


def _float_pair(a, b, name: str) -> tuple[Tensor, Tensor]:
    x, y = promote(a, b, op=name, floating=True)
    return x, y


def _magnitude(x: Tensor) -> Tensor:
    """|x| for the odd functions, which compute on |x| and give back x's sign with ``signbit``:
    its gradient is +1 at +0 and -1 at -0 (abs's is 0 at both, which would zero f'(0))."""
    return where(signbit(x), neg(x), x)


def _with_sign_of(x: Tensor, r: Tensor) -> Tensor:
    return where(signbit(x), neg(r), r)


# ----------------------------------------------------------------------------- trigonometric
@method("tan")
def tan(input: Tensor) -> Tensor:
    """sin / cos: both are accurate to an ulp or two, so their quotient is too (also near pi/2)."""
    x = _float(input)
    return div(sin(x), cos(x))


def _atan_unit(t: Tensor) -> Tensor:
    """atan on [0, 1] (see the module docstring): three angle halvings, then the Taylor series."""
    for _ in range(3):
        t = div(t, add(sqrt(add(mul(t, t), 1.0)), 1.0))
    t2 = mul(t, t)
    series = scalar_tensor(1.0 / 15.0, t._dtype, t._device)
    for k in range(6, -1, -1):  # 1 - t2/3 + t2^2/5 - ... by Horner, the last term first
        series = add(mul(series, neg(t2)), 1.0 / (2 * k + 1))
    return mul(mul(series, t), 8.0)


@method("atan", "arctan")
@compiled_composite("atan")
def atan(input: Tensor) -> Tensor:
    """Arctangent: |x| > 1 reduces to pi/2 - atan(1/|x|); the sign is the input's (atan(-0) is -0)."""
    x = _float(input)
    a = _magnitude(x)
    big = gt(a, 1.0)
    r = _atan_unit(where(big, div(1.0, where(big, a, 1.0)), a))
    return _with_sign_of(x, where(big, sub(math.pi / 2, r), r))


@method("atan2", "arctan2")
@compiled_composite("atan2")
def atan2(input, other) -> Tensor:
    """The angle of the point (other, input), in [-pi, pi], with the C library's rules for signed
    zeros and infinities (atan2(0, -0) = pi, atan2(inf, inf) = pi/4)."""
    y, x = _float_pair(input, other, "atan2")
    ay, ax = _magnitude(y), _magnitude(x)
    lo, hi = minimum(ax, ay), maximum(ax, ay)
    both_inf = logical_and(isinf(ax), isinf(ay))
    ratio = div(where(both_inf, 1.0, lo), where(logical_or(eq(hi, 0.0), both_inf), 1.0, hi))
    r = _atan_unit(ratio)
    r = where(gt(ay, ax), sub(math.pi / 2, r), r)
    r = where(signbit(x), sub(math.pi, r), r)
    return _with_sign_of(y, r)


def _cos_of_asin(x: Tensor) -> Tensor:
    """sqrt(1 - x^2) as sqrt((1 - x)(1 + x)): no cancellation near |x| = 1; nan beyond it."""
    return sqrt(mul(sub(1.0, x), add(x, 1.0)))


@method("asin", "arcsin")
@compiled_composite("asin")
def asin(input: Tensor) -> Tensor:
    x = _float(input)
    return atan2(x, _cos_of_asin(x))


@method("acos", "arccos")
@compiled_composite("acos")
def acos(input: Tensor) -> Tensor:
    x = _float(input)
    return atan2(_cos_of_asin(x), x)


# ----------------------------------------------------------------------------- hyperbolic
def _exp_halves(a: Tensor) -> tuple[Tensor, Tensor]:
    """(e^a / 2, e^-a / 2) for a >= 0 as (h/2) h and (1/2) / (h h) with h = e^(a/2): e^a / 2 stays
    finite up to float's largest value, where exp(a) alone would overflow an octave early."""
    h = exp(mul(a, 0.5))
    return mul(mul(h, 0.5), h), div(0.5, mul(h, h))


@method("sinh")
@compiled_composite("sinh")
def sinh(input: Tensor) -> Tensor:
    """(e^x - e^-x) / 2; below |x| = 1 from expm1 (E + E / (E + 1)) / 2, which keeps sinh(x) ~ x exact."""
    x = _float(input)
    a = _magnitude(x)
    small = lt(a, 1.0)
    e = expm1(where(small, a, 0.0))
    near = mul(add(e, div(e, add(e, 1.0))), 0.5)
    up, down = _exp_halves(where(small, 1.0, a))
    return _with_sign_of(x, where(small, near, sub(up, down)))


@method("cosh")
@compiled_composite("cosh")
def cosh(input: Tensor) -> Tensor:
    up, down = _exp_halves(abs(_float(input)))
    return add(up, down)


@method("asinh", "arcsinh")
@compiled_composite("asinh")
def asinh(input: Tensor) -> Tensor:
    """log(a + sqrt(a^2 + 1)) written as log1p(a + a^2 / (1 + sqrt(1 + a^2))) (exact near 0), and
    log(a) + log 2 beyond 2^28 where a^2 + 1 is a^2 (and a^2 may overflow)."""
    x = _float(input)
    a = _magnitude(x)
    large = gt(a, 2.0**28)
    m = where(large, 1.0, a)
    aa = mul(m, m)
    r = where(large, add(log(where(large, a, 1.0)), _LN2), log1p(add(m, div(aa, add(sqrt(add(aa, 1.0)), 1.0)))))
    return _with_sign_of(x, r)


@method("acosh", "arccosh")
@compiled_composite("acosh")
def acosh(input: Tensor) -> Tensor:
    """log1p(t + sqrt(2t + t^2)) with t = x - 1 (exact near 1); log(x) + log 2 beyond 2^28; nan below 1."""
    x = _float(input)
    large = gt(x, 2.0**28)
    t = sub(where(large, 2.0, x), 1.0)
    r = log1p(add(t, sqrt(mul(t, add(t, 2.0)))))
    return where(large, add(log(where(large, x, 1.0)), _LN2), r)


@method("atanh", "arctanh")
@compiled_composite("atanh")
def atanh(input: Tensor) -> Tensor:
    """log((1 + a) / (1 - a)) / 2 as log1p(2a / (1 - a)) / 2 for a = |x| (log1p of a number near -1
    would lose digits), with x's sign: exact near 0, inf at 1, nan beyond."""
    x = _float(input)
    a = _magnitude(x)
    return _with_sign_of(x, mul(log1p(div(mul(a, 2.0), sub(1.0, a))), 0.5))


arctan, arctan2, arcsin, arccos = atan, atan2, asin, acos
arcsinh, arccosh, arctanh = asinh, acosh, atanh


# ----------------------------------------------------------------------------- exponentials
@method("hypot")
@compiled_composite("hypot")
def hypot(input, other) -> Tensor:
    """sqrt(a^2 + b^2) scaled by the larger magnitude (no overflow or underflow); inf wins over nan."""
    a, b = promote(input, other, op="hypot")
    if not a._dtype.is_floating_point:
        raise RuntimeError(f"\"hypot_cpu\" not implemented for '{a._dtype.name.capitalize()}'")
    aa, ab = abs(a), abs(b)
    hi, lo = maximum(aa, ab), minimum(aa, ab)
    scale = where(logical_or(eq(hi, 0.0), isinf(hi)), 1.0, hi)
    q = div(lo, scale)
    r = mul(scale, sqrt(add(mul(q, q), 1.0)))
    r = where(eq(hi, 0.0), 0.0, r)
    return where(logical_or(isinf(aa), isinf(ab)), math.inf, r)


def _no_integers(a, b, name: str) -> None:
    """PyTorch's logaddexp refuses integer and bool tensors (it does not promote them to float)."""
    tensors = [x for x in (a, b) if isinstance(x, Tensor)]
    if tensors and not any(x._dtype.is_floating_point for x in tensors):
        raise NotImplementedError(f"\"{name}_cpu\" not implemented for '{tensors[0]._dtype.name.capitalize()}'")


@method("logaddexp")
@compiled_composite("logaddexp")
def logaddexp(input, other) -> Tensor:
    """log(e^a + e^b) = max + log1p(e^-|a - b|); two equal infinities give that infinity, not nan."""
    return _log_add(input, other, "logaddexp", lambda d: log1p(exp(neg(abs(d)))))


@method("logaddexp2")
@compiled_composite("logaddexp2")
def logaddexp2(input, other) -> Tensor:
    """log2(2^a + 2^b) = max + log2(1 + 2^-|a - b|)."""
    return _log_add(input, other, "logaddexp2", lambda d: mul(log1p(exp2(neg(abs(d)))), 1.0 / _LN2))


def _log_add(input, other, name: str, correction) -> Tensor:
    """max(a, b) + correction(a - b); two equal infinities give that infinity, not nan."""
    _no_integers(input, other, name)
    a, b = _float_pair(input, other, name)
    same_inf = logical_and(eq(a, b), isinf(a))
    d = where(same_inf, 0.0, sub(a, b))
    return where(same_inf, a, add(maximum(a, b), correction(d)))


@method("exp2")
def exp2(input: Tensor) -> Tensor:
    """2^x by pow, exact for integers (exp(x log 2) is off by about x ulps)."""
    x = _float(input)
    return pow(scalar_tensor(2.0, x._dtype, x._device), x)


@method("ldexp")
def ldexp(input, other) -> Tensor:
    """input * 2^other, in a float dtype."""
    a, b = _float_pair(input, other, "ldexp")
    return mul(a, exp2(b))


@method("deg2rad")
def deg2rad(input: Tensor) -> Tensor:
    return mul(_float(input), math.pi / 180.0)


@method("rad2deg")
def rad2deg(input: Tensor) -> Tensor:
    return mul(_float(input), 180.0 / math.pi)


@method("float_power")
def float_power(input, exponent) -> Tensor:
    """pow computed in float64, whatever the operands' dtypes (PyTorch's float_power)."""
    a = cast(input, dt.float64) if isinstance(input, Tensor) else input
    b = cast(exponent, dt.float64) if isinstance(exponent, Tensor) else exponent
    if not isinstance(a, Tensor):
        a = scalar_tensor(a, dt.float64, b._device)
    return pow(a, b)


# ----------------------------------------------------------------------------- rounding, remainders
@method("frac")
def frac(input: Tensor) -> Tensor:
    """x - trunc(x), keeping the sign of x; floating dtypes only, as in PyTorch."""
    if not input._dtype.is_floating_point:
        raise RuntimeError(f"\"frac_cpu\" not implemented for '{input._dtype.name.capitalize()}'")
    return sub(input, trunc(input))


@method("fmod")
def fmod(input, other) -> Tensor:
    """The remainder with the sign of the dividend (C's fmod), where ``remainder`` takes the divisor's:
    the remainder of the magnitudes, which numpy (and kiln's kernels) compute exactly, given the
    dividend's sign (fmod(-4, 2) is -0.0, fmod(x, inf) is x)."""
    a, b = promote(input, other, op="fmod")
    r = remainder(_magnitude(a), abs(b))
    return where(signbit(a), neg(r), r)


# ----------------------------------------------------------------------------- signs and limits
@method("clamp_min")
def clamp_min(input: Tensor, min) -> Tensor:
    return clamp(input, min=min)


@method("clamp_max")
def clamp_max(input: Tensor, max) -> Tensor:
    return clamp(input, max=max)


@method("sgn")
def sgn(input: Tensor) -> Tensor:
    """sign, for kiln's real dtypes (PyTorch's sgn differs only for complex numbers); a bool is its own sign."""
    return input.clone() if input._dtype is dt.bool_ else sign(input)


@method("signbit")
def signbit(input: Tensor) -> Tensor:
    """True where the sign bit is set: negative numbers and -0.0 (seen as 1 / -0.0 = -inf)."""
    if not input._dtype.is_floating_point:
        return lt(input, 0) if input._dtype is not dt.bool_ else ne(input, input)
    zero = eq(input, 0.0)
    return logical_or(lt(input, 0.0), logical_and(zero, lt(div(1.0, where(zero, input, 1.0)), 0.0)))


@method("copysign")
def copysign(input, other) -> Tensor:
    """|input| with the sign of other (its sign bit: -0.0 counts as negative); a float result."""
    a, b = _float_pair(input, other, "copysign")
    magnitude = abs(a)
    return where(signbit(b), neg(magnitude), magnitude)


@method("heaviside")
def heaviside(input: Tensor, values: Tensor) -> Tensor:
    """0 below zero, 1 above, ``values`` at zero (nan gives 0, as PyTorch's CPU kernel does)."""
    if input._dtype is not values._dtype:
        raise RuntimeError(
            "heaviside is not yet implemented for tensors with different dtypes "
            f"(got {input._dtype.name} and {values._dtype.name})"
        )
    return where(eq(input, 0), values, cast(gt(input, 0), input._dtype))


@method("nan_to_num")
def nan_to_num(input: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """nan, inf and -inf replaced by numbers: by default 0 and the dtype's largest and smallest finite values."""
    if not input._dtype.is_floating_point:
        return input.clone()
    big = float(np.finfo(input._dtype.np).max)
    out = where(isnan(input), nan, input)
    out = where(eq(out, math.inf), big if posinf is None else posinf, out)
    return where(eq(out, -math.inf), -big if neginf is None else neginf, out)


@method("isposinf")
def isposinf(input: Tensor) -> Tensor:
    return eq(input, math.inf) if input._dtype.is_floating_point else ne(input, input)


@method("isneginf")
def isneginf(input: Tensor) -> Tensor:
    return eq(input, -math.inf) if input._dtype.is_floating_point else ne(input, input)


@method("isreal")
def isreal(input: Tensor) -> Tensor:
    """All True: kiln's dtypes are real."""
    return cast(ones_like(input), dt.bool_)


def _nan_ignoring(pick):
    def op(input, other) -> Tensor:
        a, b = promote(input, other, op=pick.__name__)
        if not a._dtype.is_floating_point:
            return pick(a, b)
        return where(isnan(b), a, where(isnan(a), b, pick(a, b)))

    return op


fmax = method("fmax")(_nan_ignoring(maximum))
fmin = method("fmin")(_nan_ignoring(minimum))
fmax.__name__, fmin.__name__ = "fmax", "fmin"
fmax.__doc__ = "maximum that ignores nan (nan only where both are nan), as C's fmax."
fmin.__doc__ = "minimum that ignores nan (nan only where both are nan), as C's fmin."


# ----------------------------------------------------------------------------- aliases
absolute = method("absolute")(abs)
greater, greater_equal, less, less_equal, not_equal = gt, ge, lt, le, ne
for _name, _fn in {"greater": gt, "greater_equal": ge, "less": lt, "less_equal": le, "not_equal": ne}.items():
    method(_name)(_fn)


@method("positive")
def positive(input: Tensor) -> Tensor:
    """The input itself (PyTorch refuses it for bool tensors, and so does kiln)."""
    if input._dtype is dt.bool_:
        raise TypeError("The `+` operator, on a bool tensor is not supported.")
    return input


_INPLACE = {
    "tan": tan, "sinh": sinh, "cosh": cosh, "asinh": asinh, "acosh": acosh, "atanh": atanh, "atan": atan,
    "asin": asin, "acos": acos, "arctan": atan, "arcsin": asin, "arccos": acos, "arcsinh": asinh,
    "arccosh": acosh, "arctanh": atanh, "atan2": atan2, "arctan2": atan2, "hypot": hypot, "exp2": exp2,
    "ldexp": ldexp, "deg2rad": deg2rad, "rad2deg": rad2deg, "frac": frac,
    "fmod": fmod, "clamp_min": clamp_min, "clamp_max": clamp_max, "sgn": sgn, "copysign": copysign,
    "heaviside": heaviside, "nan_to_num": nan_to_num, "absolute": abs, "greater": gt, "greater_equal": ge,
    "less": lt, "less_equal": le, "not_equal": ne, "subtract": sub, "multiply": mul, "divide": div,
    "true_divide": div,
}  # fmt: skip
for _name, _fn in _INPLACE.items():
    method(_name + "_")(_inplace(_fn, _name + "_"))
for _name, _fn in {"subtract": sub, "multiply": mul, "divide": div, "true_divide": div}.items():
    method(_name)(_fn)


@method("float_power_")
def float_power_(input: Tensor, exponent) -> Tensor:
    """In-place float_power: PyTorch requires ``input`` to be float64 already (the result's dtype)."""
    if input._dtype is not dt.float64:
        raise RuntimeError(
            f"the base given to float_power_ has dtype {input._dtype.name} but the operation's result requires dtype float64"
        )
    return _float_power_inplace(input, exponent)


_float_power_inplace = _inplace(float_power, "float_power_")
