"""The building blocks of mathlib's routines: the scalar core specialized to one float dtype.

``Float(core, dt.float32)`` emits float32 code, ``Float(core, dt.float64)`` float64 code, with
the same method names, so each routine is written once for both widths and reads like the
formula it implements. Everything here is straight-line code that a vectorizer widens: fused
multiply-adds, ``select`` instead of branches, the bit tricks that build a power of two, and only
the core's float operations with vector forms (fma, fabs, copysign, roundeven, floor, sqrt).

Routine bodies run in the core's ``EXACT`` float mode: their error analyses (exact Cody-Waite
steps, TwoSum, compensated divisions) rely on every operation rounding exactly once, and the
polynomials already use explicit ``fma``.
"""

from __future__ import annotations

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ..core import Core, Scalar

_LAYOUT = {32: (23, 127, dt.int32), 64: (52, 1023, dt.int64)}  # mantissa bits, exponent bias, bits' dtype


class Float:
    """Emit float32 or float64 arithmetic through ``core``."""

    def __init__(self, core: Core, dtype: DType) -> None:
        self.core = core
        self.dtype = dtype
        self.bits = 8 * dtype.itemsize
        self.mantissa, self.bias, self.itype = _LAYOUT[self.bits]
        self.is64 = self.bits == 64

    # ---------------------------------------------------------------- constants and float ops

    def c(self, value: float) -> Scalar:
        return self.core.constant(float(value), self.dtype)

    def i(self, value: int) -> Scalar:
        """An integer constant of the float's width (the dtype of its bits)."""
        return self.core.constant(value, self.itype)

    def pick(self, f32: float, f64: float) -> Scalar:
        """The float32 or the float64 constant, whichever this width is."""
        return self.c(f64 if self.is64 else f32)

    def fma(self, a: Scalar, b: Scalar, c: Scalar) -> Scalar:
        return self.core.fma(a, b, c)

    def abs(self, x: Scalar) -> Scalar:
        return self.core.fabs(x)

    def copysign(self, magnitude: Scalar, sign: Scalar) -> Scalar:
        return self.core.copysign(magnitude, sign)

    def roundeven(self, x: Scalar) -> Scalar:
        return self.core.roundeven(x)

    def floor(self, x: Scalar) -> Scalar:
        return self.core.floor(x)

    # ---------------------------------------------------------------- arithmetic and comparisons

    def add(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.add(a, b)

    def sub(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.sub(a, b)

    def mul(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.mul(a, b)

    def div(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.div(a, b)

    def neg(self, a: Scalar) -> Scalar:
        return self.core.neg(a)

    def lt(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.compare("<", a, b)  # ordered: false when either is nan

    def le(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.compare("<=", a, b)

    def gt(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.compare(">", a, b)

    def ge(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.compare(">=", a, b)

    def eq(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.compare("==", a, b)

    def ne(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.compare("!=", a, b, unordered=True)

    def isnan(self, x: Scalar) -> Scalar:
        return self.core.compare("uno", x, x, unordered=True)

    def select(self, cond: Scalar, a: Scalar, b: Scalar) -> Scalar:
        return self.core.select(cond, a, b)

    def both(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.and_(a, b)

    def either(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.or_(a, b)

    def clamp(self, x: Scalar, lo: float, hi: float) -> Scalar:
        """x limited to [lo, hi]; nan becomes ``lo`` (callers restore nan at the end), so the
        integer code that follows never sees nan (a float -> int conversion of nan is undefined)."""
        x = self.select(self.gt(x, self.c(lo)), x, self.c(lo))
        return self.select(self.lt(x, self.c(hi)), x, self.c(hi))

    def at_most(self, x: Scalar, hi: float) -> Scalar:
        """min(x, hi) with nan passed through (one compare and select: a vector min), for code that
        carries nan to its result without integer conversions on the way."""
        return self.select(self.gt(x, self.c(hi)), self.c(hi), x)

    def at_least(self, x: Scalar, lo: float) -> Scalar:
        """max(x, lo) with nan passed through, as :meth:`at_most`."""
        return self.select(self.lt(x, self.c(lo)), self.c(lo), x)

    def poly(self, x: Scalar, coeffs: tuple[float, ...]) -> Scalar:
        """c0 + c1 x + c2 x^2 + ... by Horner's rule with fused multiply-adds."""
        acc = self.c(coeffs[-1])
        for coeff in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.c(coeff))
        return acc

    # ---------------------------------------------------------------- error-free transformations

    def two_sum(self, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        """(s, e) with s = fl(a + b) and s + e == a + b exactly (Knuth's TwoSum)."""
        s = self.add(a, b)
        bb = self.sub(s, a)
        e = self.add(self.sub(a, self.sub(s, bb)), self.sub(b, bb))
        return s, e

    def fast_two_sum(self, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        """(s, e) as two_sum, valid when |a| >= |b| (Dekker)."""
        s = self.add(a, b)
        return s, self.sub(b, self.sub(s, a))

    def two_prod(self, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        """(p, e) with p = fl(a * b) and p + e == a * b exactly."""
        p = self.mul(a, b)
        return p, self.fma(a, b, self.neg(p))

    # ---------------------------------------------------------------- bits and exponents

    def to_bits(self, x: Scalar) -> Scalar:
        return self.core.bitcast(x, self.itype)

    def from_bits(self, n: Scalar) -> Scalar:
        return self.core.bitcast(n, self.dtype)

    def to_int(self, x: Scalar) -> Scalar:
        """An integral float known to be in range (clamped, never nan) as an integer."""
        return self.core.cast(x, self.itype)

    def to_float(self, n: Scalar) -> Scalar:
        return self.core.cast(n, self.dtype)

    def pow2(self, k: Scalar) -> Scalar:
        """2**k for an integer k in the normal exponent range, built from its bits."""
        return self.from_bits(self.core.shl(self.core.add(k, self.i(self.bias)), self.i(self.mantissa)))

    def ldexp(self, x: Scalar, k: Scalar) -> Scalar:
        """x * 2**k for |k| up to about twice the exponent range: two exact power-of-two factors,
        so a result that overflows is inf and one that underflows is rounded once, into a subnormal."""
        half = self.core.ashr(k, self.i(1))
        return self.mul(self.mul(x, self.pow2(half)), self.pow2(self.core.sub(k, half)))
