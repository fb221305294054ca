"""The building blocks of mathlib's routines: an IRBuilder specialized to one float type.

``Float(builder, ir.FloatType())`` emits float32 code, ``Float(builder, ir.DoubleType())``
float64 code, with the same method names, so each routine is written once for both widths and
reads like the formula it implements. Everything here is straight-line code that LLVM's loop
vectorizer widens: fused multiply-adds, ``select`` instead of branches, the bit tricks that
build a power of two, and only intrinsics with vector forms (fma, fabs, copysign, roundeven,
floor, sqrt).

No fast-math flags are set on the instructions: the routines' error analyses (exact Cody-Waite
steps, TwoSum, compensated divisions) rely on every operation rounding exactly once, and the
polynomials already use explicit ``fma``. Fewer liberties than ``flags.MATHLIB`` allows is always safe.
"""

from __future__ import annotations

from llvmlite import ir

_LAYOUT = {32: (23, 127, ir.IntType(32)), 64: (52, 1023, ir.IntType(64))}  # mantissa bits, exponent bias


class Float:
    """Emit float32 or float64 arithmetic at ``builder``'s position."""

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type) -> None:
        self.b = builder
        self.ty = ty
        self.bits = 64 if isinstance(ty, ir.DoubleType) else 32
        self.mantissa, self.bias, self.ity = _LAYOUT[self.bits]
        self.is64 = self.bits == 64

    # ---------------------------------------------------------------- constants and intrinsics

    def c(self, value: float) -> ir.Constant:
        return ir.Constant(self.ty, float(value))

    def i(self, value: int) -> ir.Constant:
        return ir.Constant(self.ity, value)

    def pick(self, f32: float, f64: float) -> ir.Constant:
        """The float32 or the float64 constant, whichever this width is."""
        return self.c(f64 if self.is64 else f32)

    def _intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        fnty = ir.FunctionType(self.ty, [self.ty] * len(args))
        fn = self.b.module.declare_intrinsic(name, [self.ty], fnty)
        return self.b.call(fn, args)

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return self._intrinsic("llvm.fma", a, b, c)

    def abs(self, x: ir.Value) -> ir.Value:
        return self._intrinsic("llvm.fabs", x)

    def copysign(self, magnitude: ir.Value, sign: ir.Value) -> ir.Value:
        return self._intrinsic("llvm.copysign", magnitude, sign)

    def roundeven(self, x: ir.Value) -> ir.Value:
        return self._intrinsic("llvm.roundeven", x)

    def floor(self, x: ir.Value) -> ir.Value:
        return self._intrinsic("llvm.floor", x)

    # ---------------------------------------------------------------- arithmetic and comparisons

    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fadd(a, b)

    def sub(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fsub(a, b)

    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fmul(a, b)

    def div(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fdiv(a, b)

    def neg(self, a: ir.Value) -> ir.Value:
        return self.b.fneg(a)

    def lt(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fcmp_ordered("<", a, b)  # ordered: false when either is nan

    def le(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fcmp_ordered("<=", a, b)

    def gt(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fcmp_ordered(">", a, b)

    def ge(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fcmp_ordered(">=", a, b)

    def eq(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fcmp_ordered("==", a, b)

    def ne(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("!=", a, b)

    def isnan(self, x: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", x, x)

    def select(self, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.select(cond, a, b)

    def both(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.and_(a, b)

    def either(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.or_(a, b)

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """x limited to [lo, hi]; nan becomes ``lo`` (callers restore nan at the end), so the
        integer code that follows never sees nan (fptosi of nan would be poison)."""
        x = self.select(self.gt(x, self.c(lo)), x, self.c(lo))
        return self.select(self.lt(x, self.c(hi)), x, self.c(hi))

    def poly(self, x: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
        """c0 + c1 x + c2 x^2 + ... by Horner's rule with fused multiply-adds."""
        acc = self.c(coeffs[-1])
        for coeff in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.c(coeff))
        return acc

    # ---------------------------------------------------------------- error-free transformations

    def two_sum(self, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(s, e) with s = fl(a + b) and s + e == a + b exactly (Knuth's TwoSum)."""
        s = self.add(a, b)
        bb = self.sub(s, a)
        e = self.add(self.sub(a, self.sub(s, bb)), self.sub(b, bb))
        return s, e

    def fast_two_sum(self, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(s, e) as two_sum, valid when |a| >= |b| (Dekker)."""
        s = self.add(a, b)
        return s, self.sub(b, self.sub(s, a))

    def two_prod(self, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(p, e) with p = fl(a * b) and p + e == a * b exactly."""
        p = self.mul(a, b)
        return p, self.fma(a, b, self.neg(p))

    # ---------------------------------------------------------------- bits and exponents

    def to_bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.ity)

    def from_bits(self, n: ir.Value) -> ir.Value:
        return self.b.bitcast(n, self.ty)

    def to_int(self, x: ir.Value) -> ir.Value:
        """An integral float known to be in range (clamped, never nan) as an integer."""
        return self.b.fptosi(x, self.ity)

    def to_float(self, n: ir.Value) -> ir.Value:
        return self.b.sitofp(n, self.ty)

    def pow2(self, k: ir.Value) -> ir.Value:
        """2**k for an integer k in the normal exponent range, built from its bits."""
        return self.from_bits(self.b.shl(self.b.add(k, self.i(self.bias)), self.i(self.mantissa)))

    def ldexp(self, x: ir.Value, k: ir.Value) -> ir.Value:
        """x * 2**k for |k| up to about twice the exponent range: two exact power-of-two factors,
        so a result that overflows is inf and one that underflows is rounded once, into a subnormal."""
        half = self.b.ashr(k, self.i(1))
        return self.mul(self.mul(x, self.pow2(half)), self.pow2(self.b.sub(k, half)))
