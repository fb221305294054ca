"""The scalar core over numpy arrays: a second implementation of kiln/codegen/core.py.

``Semantics(NumpyCore())`` evaluates kiln's compiled semantics (divmod, integer pow, saturating
casts, the math library...) elementwise on whole numpy arrays, with no code generated. It proves
the seam -- everything above the core is shared with the LLVM backend -- and it is what the tests
compare with eager on edge values, operation by operation, independently of LLVM. It is a
reference, not a fast path: ``fma`` rounds exactly through Python fractions.

>>> from kiln.ir import dtypes as dt
>>> core = NumpyCore()
>>> core.add(core.constant(127, dt.int8), core.constant(1, dt.int8)).value
array(-128, dtype=int8)
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from ..ir import dtypes as dt
from ..ir.dtypes import DType
from .core import FloatMode, ModeMixin, Scalar

_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
}  # fmt: skip


def _scalar(value: Any, dtype: DType) -> Scalar:
    return Scalar(np.asarray(value).astype(dtype.np, copy=False), dtype)


def fused_multiply_add(a: float, b: float, c: float, single: bool) -> float:
    """a * b + c rounded once (to float32 when ``single``)."""
    if not all(np.isfinite((a, b, c))):
        return a * b + c  # inf/nan: the product and the sum give what fma gives
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return a * b + c  # the sign of an exact zero, which fractions do not carry
    try:
        nearest = float(exact)
    except OverflowError:
        return float("inf") if exact > 0 else float("-inf")
    if single and Fraction(nearest) != exact and int(np.float64(nearest).view(np.int64)) % 2 == 0:
        # round to odd, so that rounding on to float32 happens once (no double rounding)
        nearest = float(np.nextafter(nearest, np.inf if exact > nearest else -np.inf))
    return nearest


class NumpyCore(ModeMixin):
    """The core over numpy arrays (0-d or any shape; operands broadcast). Float modes change
    nothing here: numpy rounds every operation once."""

    def __init__(self) -> None:
        self.mode = FloatMode.ELEMENTWISE

    def constant(self, value: object, dtype: DType) -> Scalar:
        if dtype.category == dt.INTEGER:
            bits = 8 * dtype.itemsize
            v = int(value) & ((1 << bits) - 1)  # type: ignore[call-overload]
            value = v - (1 << bits) if dtype.is_signed and v >> (bits - 1) else v
        return _scalar(np.array(value).astype(dtype.np), dtype)

    def _binary(self, fn: Callable[..., Any], a: Scalar, b: Scalar) -> Scalar:
        assert a.dtype is b.dtype, f"operands of {a.dtype.name} and {b.dtype.name}"
        with np.errstate(all="ignore"):
            return _scalar(fn(a.value, b.value), a.dtype)

    def add(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.add, a, b)

    def sub(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.subtract, a, b)

    def mul(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.multiply, a, b)

    def div(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.true_divide, a, b)

    def frem(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.fmod, a, b)

    def neg(self, x: Scalar) -> Scalar:
        with np.errstate(all="ignore"):
            return _scalar(np.negative(x.value), x.dtype)

    def fma(self, a: Scalar, b: Scalar, c: Scalar) -> Scalar:
        single = a.dtype is dt.float32
        fn = np.frompyfunc(lambda x, y, z: fused_multiply_add(float(x), float(y), float(z), single), 3, 1)
        return _scalar(fn(a.value, b.value, c.value), a.dtype)

    def compare(self, op: str, a: Scalar, b: Scalar, *, unordered: bool = False) -> Scalar:
        assert a.dtype is b.dtype, f"operands of {a.dtype.name} and {b.dtype.name}"
        if a.dtype.category != dt.FLOATING:
            return _scalar(_COMPARE[op](a.value, b.value), dt.bool_)
        nan = np.isnan(a.value) | np.isnan(b.value)
        if op == "uno":
            return _scalar(nan, dt.bool_)
        result = _COMPARE[op](a.value, b.value)
        return _scalar(result | nan if unordered else result & ~nan, dt.bool_)

    def select(self, cond: Scalar, a: Scalar, b: Scalar) -> Scalar:
        return _scalar(np.where(cond.value, a.value, b.value), a.dtype)

    def cast(self, x: Scalar, dtype: DType) -> Scalar:
        assert dtype is not dt.bool_, "truth is a comparison, not a cast"
        with np.errstate(all="ignore"):
            return _scalar(np.asarray(x.value).astype(dtype.np), dtype)

    def bitcast(self, x: Scalar, dtype: DType) -> Scalar:
        return Scalar(np.ascontiguousarray(x.value).view(dtype.np), dtype)

    def _unary(self, fn: Callable[..., Any], x: Scalar) -> Scalar:
        with np.errstate(all="ignore"):
            return _scalar(fn(x.value), x.dtype)

    def floor(self, x: Scalar) -> Scalar:
        return self._unary(np.floor, x)

    def ceil(self, x: Scalar) -> Scalar:
        return self._unary(np.ceil, x)

    def roundeven(self, x: Scalar) -> Scalar:
        return self._unary(np.rint, x)

    def sqrt(self, x: Scalar) -> Scalar:
        return self._unary(np.sqrt, x)

    def fabs(self, x: Scalar) -> Scalar:
        return self._unary(np.abs, x)

    def copysign(self, magnitude: Scalar, sign: Scalar) -> Scalar:
        return self._binary(np.copysign, magnitude, sign)

    def and_(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.bitwise_and, a, b)

    def or_(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.bitwise_or, a, b)

    def xor(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.bitwise_xor, a, b)

    def not_(self, x: Scalar) -> Scalar:
        return self._unary(np.logical_not if x.dtype is dt.bool_ else np.invert, x)

    def shl(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.left_shift, a, b)

    def lshr(self, a: Scalar, b: Scalar) -> Scalar:
        unsigned = np.dtype(f"u{a.dtype.itemsize}")
        shifted = np.right_shift(np.asarray(a.value).view(unsigned), np.asarray(b.value).astype(unsigned))
        return Scalar(np.asarray(shifted).view(a.dtype.np), a.dtype)

    def ashr(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.right_shift, a, b)

    def sdiv(self, a: Scalar, b: Scalar) -> Scalar:
        # C's truncating division: (a - fmod(a, b)) is a multiple of b, so the floor division is exact
        return self._binary(lambda x, y: np.floor_divide(x - np.fmod(x, y), y), a, b)

    def srem(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.fmod, a, b)

    def udiv(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.floor_divide, a, b)

    def urem(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(np.remainder, a, b)

    def routine(self, name: str, body: Callable[..., Scalar], *args: Scalar) -> Scalar:
        with self.float_mode(FloatMode.EXACT):
            return body(self, *args)

    def libm_where(self, cond: Scalar, name: str, x: Scalar, otherwise: Scalar) -> Scalar:
        with np.errstate(all="ignore"):
            return _scalar(np.where(cond.value, getattr(np, name)(x.value), otherwise.value), x.dtype)
