"""kiln's scalar semantics, written once against the scalar core (kiln/codegen/core.py).

``Semantics(core)`` implements the whole emitter protocol of ``kiln.ir.emitter`` (every method of
``UNARY_METHODS`` and ``BINARY_METHODS``, ``select`` and ``cast``) for every dtype a code generator
compiles; a backend supplies only the core. Each method's result dtype is what the primitive's
eager (numpy) kernel returns: comparisons give bool, integer true division float64, bool floor
division int8.

Semantics equal numpy's exactly wherever they are discrete, with no undefined behaviour left to
the core: integer division by zero gives 0 (numpy's result; eager raises first), ``INT_MIN // -1``
wraps, float -> int casts saturate with nan -> 0 (``kiln.ir.dtypes.float_to_int``), max/min
propagate nan, integer ``**`` wraps modulo ``2**bits``. Operations eager rejects for a dtype
(``-bool``, ``sign`` of bool) raise ``Unsupported``, so the node falls back to the interpreter.

Overriding: a backend subclasses ``Semantics`` and redefines any method with a native form,
keeping its contract -- a GPU backend might map ``exp`` onto its own correctly rounded ``exp``;
the LLVM backend overrides ``combine`` so that float max/min reductions use ``llvm.maximum``,
which the vectorizer turns into vector reductions. The transcendental routines come from
``kiln.codegen.mathlib`` through ``core.routine``: defined once per module, called per use.

>>> import numpy as np
>>> from kiln.codegen.numpy_core import NumpyCore
>>> from kiln.ir import dtypes as dt
>>> em = Semantics(NumpyCore())
>>> x = Scalar(np.array([-7, 7], np.int32), dt.int32)
>>> em.floordiv(x, em.constant(2, dt.int32)).value.tolist()
[-4, 3]
"""

from __future__ import annotations

from typing import NoReturn

from ..ir import dtypes as dt
from ..ir.dtypes import DType
from . import mathlib
from .core import Core, FloatMode, Scalar, Unsupported

_INT_LIMIT = 9.2e18  # float_to_int's clamp: the float64 below 2**63 that int64 holds exactly
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _kind(dtype: DType) -> str:
    """'f' float, 's' signed int, 'u' unsigned int, 'b' bool."""
    if dtype.category == dt.FLOATING:
        return "f"
    if dtype.category == dt.BOOL:
        return "b"
    return "s" if dtype.is_signed else "u"


class Semantics:
    """The emitter protocol over ``core`` (see the module docstring)."""

    def __init__(self, core: Core) -> None:
        self.core = core

    # ------------------------------------------------------------------ helpers

    def constant(self, value: object, dtype: DType) -> Scalar:
        """A constant of ``dtype``; integers wrap modulo 2**bits like numpy's astype."""
        return self.core.constant(value, dtype)

    def _const(self, like: Scalar, value: object) -> Scalar:
        return self.core.constant(value, like.dtype)

    def _same(self, name: str, a: Scalar, b: Scalar) -> DType:
        if a.dtype is not b.dtype:
            raise TypeError(f"{name}: expected operands of one dtype, got {a.dtype.name} and {b.dtype.name}")
        return a.dtype

    def _reject(self, name: str, x: Scalar, why: str = "as eager does") -> NoReturn:
        raise Unsupported(f"{name} of {x.dtype.name} is not compiled ({why})")

    def _float_only(self, name: str, x: Scalar) -> None:
        if x.dtype.category != dt.FLOATING:
            self._reject(name, x, "a floating point op; the frontend promotes integers first")

    def truth(self, x: Scalar) -> Scalar:
        """x != 0 as a bool (nan is true, as in numpy)."""
        kind = _kind(x.dtype)
        if kind == "b":
            return x
        if kind == "f":
            return self.core.compare("!=", x, self._const(x, 0.0), unordered=True)
        return self.core.compare("!=", x, self._const(x, 0))

    # ------------------------------------------------------------------ unary

    def neg(self, x: Scalar) -> Scalar:
        if _kind(x.dtype) == "b":
            self._reject("neg", x, "numpy rejects negating bool")
        return self.core.neg(x)  # integers wrap: -INT_MIN == INT_MIN

    def abs(self, x: Scalar) -> Scalar:
        kind, c = _kind(x.dtype), self.core
        if kind == "f":
            return c.fabs(x)
        if kind in "ub":
            return x
        return c.select(c.compare("<", x, self._const(x, 0)), c.neg(x), x)  # abs(INT_MIN) wraps to INT_MIN

    def sign(self, x: Scalar) -> Scalar:
        kind, c = _kind(x.dtype), self.core
        if kind == "b":
            self._reject("sign", x, "numpy has no sign of bool")
        if kind == "u":
            return c.cast(self.truth(x), x.dtype)
        zero, one, minus = self._const(x, 0), self._const(x, 1), self._const(x, -1)
        # nan: neither comparison holds -> +0, as eager's where(x != x, 0, ...)
        pos, neg = c.compare(">", x, zero), c.compare("<", x, zero)
        return c.select(pos, one, c.select(neg, minus, zero))

    def _rounding(self, name: str, x: Scalar) -> Scalar:
        kind = _kind(x.dtype)
        if kind == "f":
            return getattr(self.core, "roundeven" if name == "round_half_even" else name)(x)
        if kind == "b" and name == "round_half_even":
            self._reject(name, x, "numpy rounds bool to float16")
        return x  # integers (and bool for floor/ceil) are their own rounding in numpy

    def floor(self, x: Scalar) -> Scalar:
        return self._rounding("floor", x)

    def ceil(self, x: Scalar) -> Scalar:
        return self._rounding("ceil", x)

    def round_half_even(self, x: Scalar) -> Scalar:
        return self._rounding("round_half_even", x)

    def logical_not(self, x: Scalar) -> Scalar:
        return self.core.not_(self.truth(x))

    def sqrt(self, x: Scalar) -> Scalar:
        self._float_only("sqrt", x)
        return self.core.sqrt(x)

    def rsqrt(self, x: Scalar) -> Scalar:
        # a true division, never an approximate reciprocal square root: eager is 1 / sqrt(x)
        self._float_only("rsqrt", x)
        return self.core.div(self._const(x, 1.0), self.core.sqrt(x))

    def _math(self, name: str, *args: Scalar) -> Scalar:
        self._float_only(name, args[0])
        return mathlib.call(self.core, name, *args)

    def exp(self, x: Scalar) -> Scalar:
        return self._math("exp", x)

    def expm1(self, x: Scalar) -> Scalar:
        return self._math("expm1", x)

    def log(self, x: Scalar) -> Scalar:
        return self._math("log", x)

    def log1p(self, x: Scalar) -> Scalar:
        return self._math("log1p", x)

    def sin(self, x: Scalar) -> Scalar:
        return self._math("sin", x)

    def cos(self, x: Scalar) -> Scalar:
        return self._math("cos", x)

    def tanh(self, x: Scalar) -> Scalar:
        return self._math("tanh", x)

    def sigmoid(self, x: Scalar) -> Scalar:
        return self._math("sigmoid", x)

    def erf(self, x: Scalar) -> Scalar:
        return self._math("erf", x)

    # ------------------------------------------------------------------ binary arithmetic

    def _arith(self, name: str, a: Scalar, b: Scalar, bool_op: str | None) -> Scalar:
        dtype = self._same(name, a, b)
        if dtype is dt.bool_:
            if bool_op is None:
                self._reject(name, a, "numpy rejects it for bool")
            return getattr(self.core, bool_op)(a, b)
        return getattr(self.core, name)(a, b)  # integers wrap modulo 2**bits

    def add(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("add", a, b, "or_")

    def sub(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("sub", a, b, None)

    def mul(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("mul", a, b, "and_")

    def div(self, a: Scalar, b: Scalar) -> Scalar:
        dtype = self._same("div", a, b)
        if dtype.category != dt.FLOATING:  # numpy's true division of integers and bools is float64
            a, b = self.cast(a, dt.float64), self.cast(b, dt.float64)
        return self.core.div(a, b)

    def floordiv(self, a: Scalar, b: Scalar) -> Scalar:
        return self._divmod("floordiv", a, b)[0]

    def mod(self, a: Scalar, b: Scalar) -> Scalar:
        return self._divmod("mod", a, b)[1]

    def _divmod(self, name: str, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        dtype = self._same(name, a, b)
        if dtype is dt.bool_:  # numpy computes bool // bool in int8
            a, b = self.cast(a, dt.int8), self.cast(b, dt.int8)
        if dtype.category == dt.FLOATING:
            with self.core.float_mode(FloatMode.EXACT):  # every rounding matters
                return self._float_divmod(a, b)
        return self._int_divmod(a, b)

    def _int_divmod(self, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        """Floor division and remainder with the divisor's sign; x // 0 == x % 0 == 0 (numpy)
        and INT_MIN // -1 == INT_MIN (wraps) -- the divisor is made safe first, so no UB."""
        c, zero, one = self.core, self._const(a, 0), self._const(a, 1)
        by_zero = c.compare("==", b, zero)
        if _kind(a.dtype) == "u":
            safe = c.select(by_zero, one, b)
            q, r = c.udiv(a, safe), c.urem(a, safe)
        else:
            bits = 8 * a.dtype.itemsize
            overflow = c.and_(c.compare("==", a, self._const(a, -(1 << (bits - 1)))),
                              c.compare("==", b, self._const(a, -1)))  # fmt: skip
            safe = c.select(c.or_(by_zero, overflow), one, b)
            q, r = c.sdiv(a, safe), c.srem(a, safe)
            # truncation rounded toward zero; step down when the remainder's sign differs from the divisor's
            adjust = c.and_(c.compare("!=", r, zero), c.compare("<", c.xor(r, safe), zero))
            q = c.sub(q, c.cast(adjust, a.dtype))
            r = c.add(r, c.select(adjust, safe, zero))
        return c.select(by_zero, zero, q), c.select(by_zero, zero, r)

    def _float_divmod(self, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        """numpy's npy_divmod, step for step (in EXACT mode: every rounding matters)."""
        c, x, y = self.core, a, b
        zero, one = self._const(a, 0.0), self._const(a, 1.0)
        fmod = mod = c.frem(x, y)  # C's fmod: exact
        quotient = c.div(x, y)
        div = c.div(c.sub(x, mod), y)
        mod_nonzero = c.compare("!=", mod, zero, unordered=True)  # C's `if (mod)`: nan is true
        signs_differ = c.xor(c.compare("<", y, zero), c.compare("<", mod, zero))
        adjust = c.and_(mod_nonzero, signs_differ)
        mod = c.select(adjust, c.add(mod, y), mod)
        div = c.select(adjust, c.sub(div, one), div)
        mod = c.select(mod_nonzero, mod, c.copysign(zero, y))
        # snap the quotient to the nearest integer, keeping the sign of a zero quotient
        floor = c.floor(div)
        snapped = c.select(c.compare(">", c.sub(div, floor), self._const(a, 0.5)), c.add(floor, one), floor)
        signed_zero = c.copysign(zero, quotient)
        floordiv = c.select(c.compare("!=", div, zero, unordered=True), snapped, signed_zero)
        by_zero = c.compare("==", y, zero)
        floordiv = c.select(by_zero, quotient, floordiv)  # x // 0 is x / 0; x % 0 is fmod's nan
        return floordiv, c.select(by_zero, fmod, mod)

    def pow(self, a: Scalar, b: Scalar) -> Scalar:
        dtype = self._same("pow", a, b)
        if dtype.category == dt.FLOATING:
            return self._math("pow", a, b)
        if dtype is dt.bool_:  # numpy computes bool ** bool in int8
            a, b = self.cast(a, dt.int8), self.cast(b, dt.int8)
        return self._int_pow(a, b)

    def _int_pow(self, a: Scalar, b: Scalar) -> Scalar:
        """a ** b modulo 2**bits by square-and-multiply, unrolled over the exponent's bits: branch
        free, so a loop over it vectorizes. A negative exponent, which numpy rejects, gives
        PyTorch's integer result: 1 for a == 1, +-1 for a == -1, else 0."""
        c = self.core
        signed = _kind(a.dtype) == "s"
        zero, one = self._const(a, 0), self._const(a, 1)
        negative = c.compare("<", b, zero) if signed else None
        exponent = c.select(negative, zero, b) if negative is not None else b
        result, base = one, a
        bits = 8 * a.dtype.itemsize - signed  # a non-negative signed exponent's top bit is 0
        for k in range(bits):
            odd = c.compare("!=", c.and_(exponent, self._const(a, 1 << k)), zero)
            result = c.mul(result, c.select(odd, base, one))  # LLVM's own canonical form
            if k + 1 < bits:
                base = self._pow_square(base)
        if negative is None:
            return result
        odd = c.compare("!=", c.and_(b, one), zero)
        minus_one = self._const(a, -1)
        inverse = c.select(c.compare("==", a, one), one,
                           c.select(c.compare("==", a, minus_one), c.select(odd, minus_one, one), zero))  # fmt: skip
        return c.select(negative, inverse, result)

    def _pow_square(self, base: Scalar) -> Scalar:
        """``base * base``, one step of integer pow's squaring chain (a backend hook: see the LLVM
        emitter's)."""
        return self.core.mul(base, base)

    def _extremum(self, name: str, a: Scalar, b: Scalar, op: str) -> Scalar:
        dtype = self._same(name, a, b)
        c = self.core
        take_a = c.compare(op, a, b)
        if _kind(dtype) == "f":  # numpy: (a op b or isnan(a)) ? a : b -- nan wins, a tie (-0.0 vs 0.0) gives b
            take_a = c.or_(take_a, c.compare("uno", a, a, unordered=True))
        return c.select(take_a, a, b)

    def max(self, a: Scalar, b: Scalar) -> Scalar:
        return self._extremum("max", a, b, ">")

    def min(self, a: Scalar, b: Scalar) -> Scalar:
        return self._extremum("min", a, b, "<")

    def combine(self, op: str, acc: Scalar, x: Scalar) -> Scalar:
        """One step of a reduction: ``op`` (a registry ``combine``: "add", "max"...) of the running
        value and an element, with reassociation allowed (the vectorizer's partial accumulators)."""
        with self.core.float_mode(FloatMode.REDUCTION):
            return getattr(self, op)(acc, x)

    # ------------------------------------------------------------------ comparisons and logic

    def _compare(self, name: str, a: Scalar, b: Scalar) -> Scalar:
        self._same(name, a, b)
        # floats: ordered (false with nan) except ne, which is true with nan
        return self.core.compare(_COMPARE[name], a, b, unordered=name == "ne")

    def eq(self, a: Scalar, b: Scalar) -> Scalar:
        return self._compare("eq", a, b)

    def ne(self, a: Scalar, b: Scalar) -> Scalar:
        return self._compare("ne", a, b)

    def lt(self, a: Scalar, b: Scalar) -> Scalar:
        return self._compare("lt", a, b)

    def le(self, a: Scalar, b: Scalar) -> Scalar:
        return self._compare("le", a, b)

    def gt(self, a: Scalar, b: Scalar) -> Scalar:
        return self._compare("gt", a, b)

    def ge(self, a: Scalar, b: Scalar) -> Scalar:
        return self._compare("ge", a, b)

    def logical_and(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.and_(self.truth(a), self.truth(b))

    def logical_or(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.or_(self.truth(a), self.truth(b))

    def logical_xor(self, a: Scalar, b: Scalar) -> Scalar:
        return self.core.xor(self.truth(a), self.truth(b))

    # ------------------------------------------------------------------ bits

    def _bits(self, name: str, a: Scalar, b: Scalar) -> DType:
        dtype = self._same(name, a, b)
        if dtype.category == dt.FLOATING:
            self._reject(name, a, "a bit operation; PyTorch refuses floating point")
        return dtype

    def bitwise_and(self, a: Scalar, b: Scalar) -> Scalar:
        self._bits("bitwise_and", a, b)
        return self.core.and_(a, b)

    def bitwise_or(self, a: Scalar, b: Scalar) -> Scalar:
        self._bits("bitwise_or", a, b)
        return self.core.or_(a, b)

    def bitwise_xor(self, a: Scalar, b: Scalar) -> Scalar:
        self._bits("bitwise_xor", a, b)
        return self.core.xor(a, b)

    def bitwise_not(self, x: Scalar) -> Scalar:
        if x.dtype.category == dt.FLOATING:
            self._reject("bitwise_not", x, "a bit operation; PyTorch refuses floating point")
        return self.core.not_(x)  # on bool, logical not

    def _shift_count(self, name: str, a: Scalar, b: Scalar) -> tuple[Scalar, int]:
        """Whether the count ``b`` is in [0, width), and the width: PyTorch defines the rest."""
        if self._bits(name, a, b) is dt.bool_:
            self._reject(name, a, "PyTorch has no shift of bool")
        width, c = 8 * a.dtype.itemsize, self.core
        in_range = c.compare("<", b, self._const(b, width))
        if _kind(b.dtype) == "s":
            in_range = c.and_(in_range, c.compare(">=", b, self._const(b, 0)))
        return in_range, width

    def shift_left(self, a: Scalar, b: Scalar) -> Scalar:
        """a << b, wrapping; 0 for a count < 0 or >= the width (the core sees only counts in range)."""
        c = self.core
        in_range, _ = self._shift_count("shift_left", a, b)
        zero = self._const(a, 0)
        return c.select(in_range, c.shl(a, c.select(in_range, b, zero)), zero)

    def shift_right(self, a: Scalar, b: Scalar) -> Scalar:
        """a >> b, arithmetic on signed ints; out-of-range counts give the sign fill: a shift by
        width - 1 for signed ints (one select, no second), 0 for unsigned."""
        c = self.core
        in_range, width = self._shift_count("shift_right", a, b)
        if _kind(a.dtype) == "s":
            return c.ashr(a, c.select(in_range, b, self._const(b, width - 1)))
        zero = self._const(a, 0)
        return c.select(in_range, c.lshr(a, c.select(in_range, b, zero)), zero)

    # ------------------------------------------------------------------ select and cast

    def select(self, cond: Scalar, a: Scalar, b: Scalar) -> Scalar:
        self._same("select", a, b)
        return self.core.select(self.truth(cond), a, b)

    def cast(self, x: Scalar, dtype: DType) -> Scalar:
        """numpy's astype, except float -> int: truncate, nan -> 0, saturate at +-9.2e18, then wrap
        into narrower types (``kiln.ir.dtypes.float_to_int``); anything -> bool is ``x != 0``."""
        if x.dtype is dtype:
            return x
        if dtype is dt.bool_:
            return self.truth(x)
        if dtype.category != dt.FLOATING and _kind(x.dtype) == "f":
            return self._float_to_int(x, dtype)
        return self.core.cast(x, dtype)

    def _float_to_int(self, x: Scalar, dtype: DType) -> Scalar:
        c = self.core
        value = x if x.dtype is dt.float64 else c.cast(x, dt.float64)
        limit = c.constant(_INT_LIMIT, dt.float64)
        neg_limit = c.constant(-_INT_LIMIT, dt.float64)
        value = c.select(c.compare("uno", value, value, unordered=True), c.constant(0.0, dt.float64), value)
        value = c.select(c.compare(">", value, limit), limit, value)
        value = c.select(c.compare("<", value, neg_limit), neg_limit, value)
        wide = c.cast(value, dt.int64)  # in range now: defined
        return wide if dtype is dt.int64 else c.cast(wide, dtype)
