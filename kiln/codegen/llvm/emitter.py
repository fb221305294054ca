"""The scalar emitter protocol (kiln/ir/emitter.py) in LLVM IR, for every dtype kiln compiles.

A primitive's ``scalar(em, *values)`` formula, evaluated on an ``LLVMEmitter``, appends the
instructions for one element at the builder's position. Values flowing through formulas are
``Scalar``\\ s: an LLVM register value and the kiln dtype it holds (bool is ``i1`` in registers,
``i8`` 0/1 in memory). Each method's result dtype is what the primitive's eager (numpy) kernel
returns: comparisons give bool, integer true division gives float64, bool floor division int8.

Semantics equal numpy's exactly wherever they are discrete, with no undefined behaviour: integer
division by zero gives 0 (numpy's result; eager raises first), ``INT_MIN // -1`` wraps, float to
int casts saturate with nan -> 0 (``kiln.ir.dtypes.float_to_int``), max/min propagate nan.
Operations eager rejects for a dtype (``-bool``, ``sign`` of bool, float16 anywhere) raise
``Unsupported`` at code generation time, so the node falls back to the interpreter.

>>> from llvmlite import ir
>>> from kiln.ir import dtypes as dt
>>> fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
>>> em = LLVMEmitter(ir.IRBuilder(fn.append_basic_block()))
>>> em.lt(em.constant(1, dt.int32), em.constant(2, dt.int32)).dtype is dt.bool_
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from . import Unsupported, flags

_I1, _I8, _I64 = ir.IntType(1), ir.IntType(8), ir.IntType(64)
_F64 = ir.DoubleType()
_INT_LIMIT = 9.2e18  # float_to_int's clamp: the float64 below 2**63 that int64 holds exactly


def register_type(dtype: DType) -> ir.Type:
    """The LLVM type of a value of ``dtype`` in registers (bool -> i1, int32 -> i32, f32 -> float)."""
    if dtype is dt.bool_:
        return _I1
    if dtype is dt.float32:
        return ir.FloatType()
    if dtype is dt.float64:
        return _F64
    if dtype.category == dt.INTEGER:
        return ir.IntType(8 * dtype.itemsize)
    raise Unsupported(f"the LLVM backend does not compile {dtype.name} (the interpreter runs it)")


def memory_type(dtype: DType) -> ir.Type:
    """The LLVM type of an element of ``dtype`` in memory (bool is a byte holding 0 or 1)."""
    return _I8 if dtype is dt.bool_ else register_type(dtype)


@dataclass(frozen=True)
class Scalar:
    """One element's value in a formula: an LLVM register value and its kiln dtype."""

    value: ir.Value
    dtype: DType


def load(builder: ir.IRBuilder, pointer: ir.Value, dtype: DType) -> Scalar:
    """Load the element at ``pointer``; a bool byte reads as True when nonzero."""
    value = builder.load(pointer, typ=memory_type(dtype), align=dtype.itemsize)
    if dtype is dt.bool_:
        value = builder.icmp_unsigned("!=", value, ir.Constant(_I8, 0))
    return Scalar(value, dtype)


def store(builder: ir.IRBuilder, scalar: Scalar, pointer: ir.Value) -> None:
    """Store ``scalar`` at ``pointer`` (bool as the byte 0 or 1)."""
    value = scalar.value
    if scalar.dtype is dt.bool_:
        value = builder.zext(value, _I8)
    builder.store(value, pointer, align=scalar.dtype.itemsize)


def _kind(dtype: DType) -> str:
    """'f' float, 's' signed int, 'u' unsigned int, 'b' bool."""
    if dtype.category == dt.FLOATING:
        return "f"
    if dtype.category == dt.BOOL:
        return "b"
    return "s" if dtype.is_signed else "u"


def _intrinsic(builder: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """Call the overloaded LLVM intrinsic ``llvm.<name>`` on float/double arguments."""
    ty = args[0].type
    full = f"llvm.{name}.{'f32' if isinstance(ty, ir.FloatType) else 'f64'}"
    module = builder.module
    fn = module.globals.get(full)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ty, [ty] * len(args)), full)
    return builder.call(fn, args)


_ORDERED = {"eq": "==", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


class LLVMEmitter:
    """Emits LLVM IR for scalar formulas at ``builder``'s position (see the module docstring)."""

    def __init__(self, builder: ir.IRBuilder) -> None:
        self.builder = builder

    # ------------------------------------------------------------------ helpers

    def constant(self, value: object, dtype: DType) -> Scalar:
        """A constant of ``dtype``; integers wrap modulo 2**bits like numpy's astype."""
        ty = register_type(dtype)
        if dtype is dt.bool_:
            return Scalar(ir.Constant(ty, int(bool(value))), dtype)
        if dtype.category == dt.INTEGER:
            bits = ty.width
            v = int(value) & ((1 << bits) - 1)  # type: ignore[call-overload]
            return Scalar(ir.Constant(ty, v - (1 << bits) if v >> (bits - 1) else v), dtype)
        return Scalar(ir.Constant(ty, float(value)), dtype)  # type: ignore[arg-type]

    def _const(self, like: Scalar, value: object) -> ir.Value:
        return self.constant(value, like.dtype).value

    def _same(self, name: str, a: Scalar, b: Scalar) -> DType:
        if a.dtype is not b.dtype:
            raise TypeError(f"{name}: expected operands of one dtype, got {a.dtype.name} and {b.dtype.name}")
        return a.dtype

    def _reject(self, name: str, x: Scalar, why: str = "as eager does") -> NoReturn:
        raise Unsupported(f"{name} of {x.dtype.name} is not compiled ({why})")

    def _truth(self, x: Scalar) -> ir.Value:
        """x != 0 as an i1 (nan is true, as in numpy)."""
        kind = _kind(x.dtype)
        if kind == "b":
            return x.value
        if kind == "f":
            return self.builder.fcmp_unordered("!=", x.value, self._const(x, 0.0))
        return self.builder.icmp_unsigned("!=", x.value, self._const(x, 0))

    # ------------------------------------------------------------------ unary

    def neg(self, x: Scalar) -> Scalar:
        kind = _kind(x.dtype)
        if kind == "b":
            self._reject("neg", x, "numpy rejects negating bool")
        if kind == "f":
            return Scalar(self.builder.fneg(x.value, flags=flags.ELEMENTWISE), x.dtype)
        return Scalar(self.builder.neg(x.value), x.dtype)  # wraps: -INT_MIN == INT_MIN

    def abs(self, x: Scalar) -> Scalar:
        kind = _kind(x.dtype)
        if kind == "f":
            return Scalar(_intrinsic(self.builder, "fabs", x.value), x.dtype)
        if kind in "ub":
            return x
        b = self.builder
        negative = b.icmp_signed("<", x.value, self._const(x, 0))
        return Scalar(b.select(negative, b.neg(x.value), x.value), x.dtype)  # abs(INT_MIN) wraps to INT_MIN

    def sign(self, x: Scalar) -> Scalar:
        kind = _kind(x.dtype)
        b = self.builder
        if kind == "b":
            self._reject("sign", x, "numpy has no sign of bool")
        if kind == "u":
            return Scalar(b.zext(self._truth(x), x.value.type), x.dtype)
        zero, one, minus = self._const(x, 0), self._const(x, 1), self._const(x, -1)
        if kind == "f":  # nan: neither comparison holds -> +0, as eager's where(x != x, 0, ...)
            pos, neg = b.fcmp_ordered(">", x.value, zero), b.fcmp_ordered("<", x.value, zero)
        else:
            pos, neg = b.icmp_signed(">", x.value, zero), b.icmp_signed("<", x.value, zero)
        return Scalar(b.select(pos, one, b.select(neg, minus, zero)), x.dtype)

    def _rounding(self, name: str, intrinsic: str, x: Scalar) -> Scalar:
        kind = _kind(x.dtype)
        if kind == "f":
            return Scalar(_intrinsic(self.builder, intrinsic, x.value), x.dtype)
        if kind == "b" and name == "round_half_even":
            self._reject(name, x, "numpy rounds bool to float16")
        return x  # integers (and bool for floor/ceil) are their own rounding in numpy

    def floor(self, x: Scalar) -> Scalar:
        return self._rounding("floor", "floor", x)

    def ceil(self, x: Scalar) -> Scalar:
        return self._rounding("ceil", "ceil", x)

    def round_half_even(self, x: Scalar) -> Scalar:
        return self._rounding("round_half_even", "roundeven", x)

    def logical_not(self, x: Scalar) -> Scalar:
        return Scalar(self.builder.not_(self._truth(x)), dt.bool_)

    def _float_only(self, name: str, x: Scalar) -> None:
        if x.dtype.category != dt.FLOATING:
            self._reject(name, x, "a floating point op; the frontend promotes integers first")

    def sqrt(self, x: Scalar) -> Scalar:
        self._float_only("sqrt", x)
        return Scalar(_intrinsic(self.builder, "sqrt", x.value), x.dtype)

    def rsqrt(self, x: Scalar) -> Scalar:
        # a true division, never an approximate reciprocal square root: eager is 1 / sqrt(x)
        self._float_only("rsqrt", x)
        root = self.sqrt(x).value
        return Scalar(self.builder.fdiv(self._const(x, 1.0), root, flags=flags.ELEMENTWISE), x.dtype)

    def _math(self, name: str, *args: Scalar) -> Scalar:
        self._float_only(name, args[0])
        from . import mathlib  # noqa: PLC0415 - written alongside; only transcendental ops need it

        return Scalar(mathlib.call(self.builder, name, *(a.value for a in args)), args[0].dtype)

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

    def _arith(self, name: str, a: Scalar, b: Scalar, float_op: str, int_op: str, bool_op: str | None) -> Scalar:
        dtype = self._same(name, a, b)
        kind = _kind(dtype)
        bld = self.builder
        if kind == "f":
            return Scalar(getattr(bld, float_op)(a.value, b.value, flags=flags.ELEMENTWISE), dtype)
        if kind == "b":
            if bool_op is None:
                self._reject(name, a, "numpy rejects it for bool")
            return Scalar(getattr(bld, bool_op)(a.value, b.value), dtype)
        return Scalar(getattr(bld, int_op)(a.value, b.value), dtype)  # wraps modulo 2**bits

    def add(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("add", a, b, "fadd", "add", "or_")

    def sub(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("sub", a, b, "fsub", "sub", None)

    def mul(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("mul", a, b, "fmul", "mul", "and_")

    def div(self, a: Scalar, b: Scalar) -> Scalar:
        dtype = self._same("div", a, b)
        if dtype.category != dt.FLOATING:  # numpy's true division of integers and bools is float64
            a, b = self.cast(a, dt.float64), self.cast(b, dt.float64)
        return Scalar(self.builder.fdiv(a.value, b.value, flags=flags.ELEMENTWISE), a.dtype)

    def floordiv(self, a: Scalar, b: Scalar) -> Scalar:
        return self._divmod("floordiv", a, b)[0]

    def mod(self, a: Scalar, b: Scalar) -> Scalar:
        return self._divmod("mod", a, b)[1]

    def _divmod(self, name: str, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        dtype = self._same(name, a, b)
        if dtype is dt.bool_:  # numpy computes bool // bool in int8
            a, b = self.cast(a, dt.int8), self.cast(b, dt.int8)
        if dtype.category == dt.FLOATING:
            return self._float_divmod(a, b)
        return self._int_divmod(a, b)

    def _int_divmod(self, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        """Floor division and remainder with the divisor's sign; x // 0 == x % 0 == 0 (numpy)
        and INT_MIN // -1 == INT_MIN (wraps) -- the divisor is made safe first, so no UB."""
        bld, zero, one = self.builder, self._const(a, 0), self._const(a, 1)
        by_zero = bld.icmp_unsigned("==", b.value, zero)
        if _kind(a.dtype) == "u":
            safe = bld.select(by_zero, one, b.value)
            q, r = bld.udiv(a.value, safe), bld.urem(a.value, safe)
        else:
            bits = a.value.type.width
            overflow = bld.and_(bld.icmp_signed("==", a.value, self._const(a, -(1 << (bits - 1)))),
                                bld.icmp_signed("==", b.value, self._const(a, -1)))  # fmt: skip
            safe = bld.select(bld.or_(by_zero, overflow), one, b.value)
            q, r = bld.sdiv(a.value, safe), bld.srem(a.value, safe)
            # truncation rounded toward zero; step down when the remainder's sign differs from the divisor's
            adjust = bld.and_(bld.icmp_signed("!=", r, zero), bld.icmp_signed("<", bld.xor(r, safe), zero))
            q = bld.sub(q, bld.zext(adjust, q.type))
            r = bld.add(r, bld.select(adjust, safe, zero))
        return Scalar(bld.select(by_zero, zero, q), a.dtype), Scalar(bld.select(by_zero, zero, r), a.dtype)

    def _float_divmod(self, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        """numpy's npy_divmod, step for step (no fast-math flags: every rounding matters)."""
        bld, x, y = self.builder, a.value, b.value
        zero, one = self._const(a, 0.0), self._const(a, 1.0)
        fmod = mod = bld.frem(x, y)  # C's fmod: exact (a libm call: x86 has no vector fmod)
        quotient = bld.fdiv(x, y)
        div = bld.fdiv(bld.fsub(x, mod), y)
        mod_nonzero = bld.fcmp_unordered("!=", mod, zero)  # C's `if (mod)`: nan is true
        signs_differ = bld.xor(bld.fcmp_ordered("<", y, zero), bld.fcmp_ordered("<", mod, zero))
        adjust = bld.and_(mod_nonzero, signs_differ)
        mod = bld.select(adjust, bld.fadd(mod, y), mod)
        div = bld.select(adjust, bld.fsub(div, one), div)
        mod = bld.select(mod_nonzero, mod, _intrinsic(bld, "copysign", zero, y))
        # snap the quotient to the nearest integer, keeping the sign of a zero quotient
        floor = _intrinsic(bld, "floor", div)
        snapped = bld.select(bld.fcmp_ordered(">", bld.fsub(div, floor), self._const(a, 0.5)),
                             bld.fadd(floor, one), floor)  # fmt: skip
        signed_zero = _intrinsic(bld, "copysign", zero, quotient)
        floordiv = bld.select(bld.fcmp_unordered("!=", div, zero), snapped, signed_zero)
        by_zero = bld.fcmp_ordered("==", y, zero)
        floordiv = bld.select(by_zero, quotient, floordiv)  # x // 0 is x / 0; x % 0 is fmod's nan
        return Scalar(floordiv, a.dtype), Scalar(bld.select(by_zero, fmod, mod), a.dtype)

    def pow(self, a: Scalar, b: Scalar) -> Scalar:
        dtype = self._same("pow", a, b)
        if dtype.category == dt.FLOATING:
            return self._math("pow", a, b)
        if dtype is dt.bool_:  # numpy computes bool ** bool in int8
            a, b = self.cast(a, dt.int8), self.cast(b, dt.int8)
        return self._int_pow(a, b)

    def _int_pow(self, a: Scalar, b: Scalar) -> Scalar:
        """a ** b modulo 2**bits by square-and-multiply, one loop iteration per exponent bit up to the
        highest one set. (Unrolled over all 64 bits, the chains of selects and multiplies kept
        LLVM's optimizer busy for minutes.) A negative exponent, which numpy rejects, gives
        PyTorch's integer result: 1 for a == 1, +-1 for a == -1, else 0."""
        bld = self.builder
        signed = _kind(a.dtype) == "s"
        zero, one = self._const(a, 0), self._const(a, 1)
        negative = bld.icmp_signed("<", b.value, zero) if signed else None
        exponent = bld.select(negative, zero, b.value) if signed else b.value
        entry = bld.block
        loop = bld.append_basic_block("pow.loop")
        done = bld.append_basic_block("pow.done")
        bld.branch(loop)
        bld.position_at_end(loop)
        result, base, bits = bld.phi(one.type), bld.phi(one.type), bld.phi(one.type)
        for phi, start in ((result, one), (base, a.value), (bits, exponent)):
            phi.add_incoming(start, entry)
        odd = bld.icmp_unsigned("!=", bld.and_(bits, one), zero)
        next_result = bld.select(odd, bld.mul(result, base), result)
        next_base, next_bits = bld.mul(base, base), bld.lshr(bits, one)
        for phi, value in ((result, next_result), (base, next_base), (bits, next_bits)):
            phi.add_incoming(value, loop)
        bld.cbranch(bld.icmp_unsigned("!=", next_bits, zero), loop, done)
        bld.position_at_end(done)
        if not signed:
            return Scalar(next_result, a.dtype)
        odd = bld.icmp_unsigned("!=", bld.and_(b.value, one), zero)
        minus_one = self._const(a, -1)
        by_minus_one = bld.select(odd, minus_one, one)
        inverse = bld.select(bld.icmp_signed("==", a.value, one), one,
                             bld.select(bld.icmp_signed("==", a.value, minus_one), by_minus_one, zero))  # fmt: skip
        return Scalar(bld.select(negative, inverse, next_result), a.dtype)

    def _extremum(self, name: str, a: Scalar, b: Scalar, op: str) -> Scalar:
        dtype = self._same(name, a, b)
        bld = self.builder
        if _kind(dtype) == "f":
            # numpy: (a op b or isnan(a)) ? a : b -- nan wins, and a tie (-0.0 vs 0.0) gives b
            take_a = bld.or_(bld.fcmp_ordered(op, a.value, b.value), bld.fcmp_unordered("uno", a.value, a.value))
        elif _kind(dtype) == "s":
            take_a = bld.icmp_signed(op, a.value, b.value)
        else:
            take_a = bld.icmp_unsigned(op, a.value, b.value)
        return Scalar(bld.select(take_a, a.value, b.value), dtype)

    def max(self, a: Scalar, b: Scalar) -> Scalar:
        return self._extremum("max", a, b, ">")

    def min(self, a: Scalar, b: Scalar) -> Scalar:
        return self._extremum("min", a, b, "<")

    # ------------------------------------------------------------------ comparisons and logic

    def _compare(self, name: str, a: Scalar, b: Scalar) -> Scalar:
        dtype = self._same(name, a, b)
        bld, kind = self.builder, _kind(dtype)
        if kind == "f":  # ordered (false with nan) except ne, which is true with nan
            cmp = bld.fcmp_unordered("!=", a.value, b.value) if name == "ne" else \
                bld.fcmp_ordered(_ORDERED[name], a.value, b.value)  # fmt: skip
        else:
            op = "!=" if name == "ne" else _ORDERED[name]
            cmp = (bld.icmp_signed if kind == "s" else bld.icmp_unsigned)(op, a.value, b.value)
        return Scalar(cmp, dt.bool_)

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
        return Scalar(self.builder.and_(self._truth(a), self._truth(b)), dt.bool_)

    def logical_or(self, a: Scalar, b: Scalar) -> Scalar:
        return Scalar(self.builder.or_(self._truth(a), self._truth(b)), dt.bool_)

    def logical_xor(self, a: Scalar, b: Scalar) -> Scalar:
        return Scalar(self.builder.xor(self._truth(a), self._truth(b)), dt.bool_)

    # ------------------------------------------------------------------ select and cast

    def select(self, cond: Scalar, a: Scalar, b: Scalar) -> Scalar:
        dtype = self._same("select", a, b)
        return Scalar(self.builder.select(self._truth(cond), a.value, b.value), dtype)

    def cast(self, x: Scalar, dtype: DType) -> Scalar:
        """numpy's astype, except float -> int: truncate, nan -> 0, saturate at +-9.2e18, then wrap
        into narrower types (``kiln.ir.dtypes.float_to_int``); anything -> bool is ``x != 0``."""
        src, bld = x.dtype, self.builder
        target = register_type(dtype)
        if src is dtype:
            return x
        if dtype is dt.bool_:
            return Scalar(self._truth(x), dtype)
        kind = _kind(src)
        if dtype.category == dt.FLOATING:
            if kind == "f":
                return Scalar((bld.fpext if dtype is dt.float64 else bld.fptrunc)(x.value, target), dtype)
            convert = bld.sitofp if kind == "s" else bld.uitofp
            return Scalar(convert(x.value, target), dtype)
        if kind == "f":
            return Scalar(self._float_to_int(x, target), dtype)
        width, src_width = target.width, x.value.type.width
        if width == src_width:  # int8 <-> uint8: the same bits
            return Scalar(x.value, dtype)
        if width < src_width:
            return Scalar(bld.trunc(x.value, target), dtype)
        return Scalar((bld.sext if kind == "s" else bld.zext)(x.value, target), dtype)

    def _float_to_int(self, x: Scalar, target: ir.IntType) -> ir.Value:
        bld = self.builder
        value = x.value if x.dtype is dt.float64 else bld.fpext(x.value, _F64)
        limit = ir.Constant(_F64, _INT_LIMIT)
        neg_limit = ir.Constant(_F64, -_INT_LIMIT)
        value = bld.select(bld.fcmp_unordered("uno", value, value), ir.Constant(_F64, 0.0), value)
        value = bld.select(bld.fcmp_ordered(">", value, limit), limit, value)
        value = bld.select(bld.fcmp_ordered("<", value, neg_limit), neg_limit, value)
        wide = bld.fptosi(value, _I64)  # in range now: defined
        return wide if target.width == 64 else bld.trunc(wide, target)
