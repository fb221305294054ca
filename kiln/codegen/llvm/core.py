"""The scalar core (kiln/codegen/core.py) over llvmlite's IRBuilder.

Each method appends one instruction (or an intrinsic call) at the builder's position. Floats
carry the fast-math flags of the core's mode (``flags.BY_MODE``); integers carry none. bool is
``i1`` in registers, ``i8`` 0/1 in memory (``load``/``store`` in emitter.py). Routines are
``internal alwaysinline`` functions of the module, defined on first use.

>>> from llvmlite import ir
>>> from kiln.ir import dtypes as dt
>>> fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
>>> core = LLVMCore(ir.IRBuilder(fn.append_basic_block()))
>>> one = core.constant(1.0, dt.float32)
>>> "fadd contract float" in str(core.add(one, one).value)
True
>>> with core.float_mode(FloatMode.EXACT):
...     "fadd float" in str(core.add(one, one).value)
True
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ..core import FloatMode, ModeMixin, Scalar, Unsupported
from . import flags

_I1, _I8 = ir.IntType(1), ir.IntType(8)
_SUFFIX = {dt.float32: "f32", dt.float64: "f64"}


def register_type(dtype: DType) -> ir.Type:
    """The LLVM type of a value of ``dtype`` in registers (bool -> i1, int32 -> i32, f32 -> float)."""
    if dtype is dt.bool_:
        return _I1
    if dtype is dt.float32:
        return ir.FloatType()
    if dtype is dt.float64:
        return ir.DoubleType()
    if dtype.category == dt.INTEGER:
        return ir.IntType(8 * dtype.itemsize)
    raise Unsupported(f"the LLVM backend does not compile {dtype.name} (the interpreter runs it)")


def intrinsic(builder: ir.IRBuilder, name: str, *args: ir.Value, fastmath: tuple[str, ...] = ()) -> ir.Value:
    """Call the overloaded LLVM intrinsic ``llvm.<name>`` on float/double arguments (with the
    fast-math flags ``fastmath``)."""
    ty = args[0].type
    full = f"llvm.{name}.{'f32' if isinstance(ty, ir.FloatType) else 'f64'}"
    module = builder.module
    fn = module.globals.get(full)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ty, [ty] * len(args)), full)
    return builder.call(fn, args, fastmath=fastmath)


def _is_float(x: Scalar) -> bool:
    return x.dtype.category == dt.FLOATING


def _signed(dtype: DType) -> bool:
    return dtype.category == dt.INTEGER and dtype.is_signed


class LLVMCore(ModeMixin):
    """The scalar core at ``builder``'s position (see the module docstring)."""

    def __init__(self, builder: ir.IRBuilder, mode: FloatMode = FloatMode.ELEMENTWISE) -> None:
        self.builder = builder
        self.mode = mode

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

    # ---------------------------------------------------------------- arithmetic

    def _arith(self, float_op: str, int_op: str, a: Scalar, b: Scalar) -> Scalar:
        assert a.dtype is b.dtype, f"{int_op} of {a.dtype.name} and {b.dtype.name}"
        if _is_float(a):
            return Scalar(getattr(self.builder, float_op)(a.value, b.value, flags=flags.BY_MODE[self.mode]), a.dtype)
        return Scalar(getattr(self.builder, int_op)(a.value, b.value), a.dtype)

    def add(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("fadd", "add", a, b)

    def sub(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("fsub", "sub", a, b)

    def mul(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("fmul", "mul", a, b)

    def div(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("fdiv", "sdiv", a, b)

    def frem(self, a: Scalar, b: Scalar) -> Scalar:
        return self._arith("frem", "srem", a, b)  # a libm call: x86 has no vector fmod

    def neg(self, x: Scalar) -> Scalar:
        if _is_float(x):
            return Scalar(self.builder.fneg(x.value, flags=flags.BY_MODE[self.mode]), x.dtype)
        return Scalar(self.builder.neg(x.value), x.dtype)

    def fma(self, a: Scalar, b: Scalar, c: Scalar) -> Scalar:
        return Scalar(intrinsic(self.builder, "fma", a.value, b.value, c.value), a.dtype)

    # ---------------------------------------------------------------- comparisons, select, conversions

    def compare(self, op: str, a: Scalar, b: Scalar, *, unordered: bool = False) -> Scalar:
        assert a.dtype is b.dtype, f"{op} of {a.dtype.name} and {b.dtype.name}"
        bld = self.builder
        if _is_float(a):
            fcmp = bld.fcmp_unordered if unordered or op == "uno" else bld.fcmp_ordered
            return Scalar(fcmp(op, a.value, b.value), dt.bool_)
        icmp = bld.icmp_signed if _signed(a.dtype) else bld.icmp_unsigned
        return Scalar(icmp(op, a.value, b.value), dt.bool_)

    def select(self, cond: Scalar, a: Scalar, b: Scalar) -> Scalar:
        return Scalar(self.builder.select(cond.value, a.value, b.value), a.dtype)

    def cast(self, x: Scalar, dtype: DType) -> Scalar:
        assert dtype is not dt.bool_, "truth is a comparison, not a cast"
        bld, src, target = self.builder, x.dtype, register_type(dtype)
        if src is dtype:
            return x
        if dtype.category == dt.FLOATING:
            if _is_float(x):
                return Scalar((bld.fpext if dtype.itemsize > src.itemsize else bld.fptrunc)(x.value, target), dtype)
            return Scalar((bld.sitofp if _signed(src) else bld.uitofp)(x.value, target), dtype)
        if _is_float(x):
            return Scalar((bld.fptosi if _signed(dtype) else bld.fptoui)(x.value, target), dtype)
        width, src_width = target.width, x.value.type.width
        if width == src_width:  # int8 <-> uint8: the same bits
            return Scalar(x.value, dtype)
        if width < src_width:
            return Scalar(bld.trunc(x.value, target), dtype)
        return Scalar((bld.sext if _signed(src) else bld.zext)(x.value, target), dtype)

    def bitcast(self, x: Scalar, dtype: DType) -> Scalar:
        return Scalar(self.builder.bitcast(x.value, register_type(dtype)), dtype)

    # ---------------------------------------------------------------- float operations with vector forms

    def _intrinsic(self, name: str, *args: Scalar) -> Scalar:
        return Scalar(intrinsic(self.builder, name, *(a.value for a in args)), args[0].dtype)

    def floor(self, x: Scalar) -> Scalar:
        return self._intrinsic("floor", x)

    def ceil(self, x: Scalar) -> Scalar:
        return self._intrinsic("ceil", x)

    def roundeven(self, x: Scalar) -> Scalar:
        return self._intrinsic("roundeven", x)

    def sqrt(self, x: Scalar) -> Scalar:
        return self._intrinsic("sqrt", x)

    def fabs(self, x: Scalar) -> Scalar:
        return self._intrinsic("fabs", x)

    def copysign(self, magnitude: Scalar, sign: Scalar) -> Scalar:
        return self._intrinsic("copysign", magnitude, sign)

    # ---------------------------------------------------------------- integer and bool bit operations

    def _int(self, op: str, a: Scalar, b: Scalar) -> Scalar:
        assert a.dtype is b.dtype, f"{op} of {a.dtype.name} and {b.dtype.name}"
        return Scalar(getattr(self.builder, op)(a.value, b.value), a.dtype)

    def and_(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("and_", a, b)

    def or_(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("or_", a, b)

    def xor(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("xor", a, b)

    def not_(self, x: Scalar) -> Scalar:
        return Scalar(self.builder.not_(x.value), x.dtype)

    def shl(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("shl", a, b)

    def lshr(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("lshr", a, b)

    def ashr(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("ashr", a, b)

    def sdiv(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("sdiv", a, b)

    def srem(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("srem", a, b)

    def udiv(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("udiv", a, b)

    def urem(self, a: Scalar, b: Scalar) -> Scalar:
        return self._int("urem", a, b)

    # ---------------------------------------------------------------- routines

    def routine(self, name: str, body: Callable[..., Scalar], *args: Scalar) -> Scalar:
        """Call ``kiln.math.<name>.<f32|f64>``, defining it in the module on first use: an
        ``internal``, ``alwaysinline``, ``nounwind``, ``readnone`` function, so after inlining a
        loop over calls is straight-line code the vectorizer widens."""
        dtype = args[0].dtype
        symbol = f"kiln.math.{name}.{_SUFFIX.get(dtype, dtype.name)}"
        module = self.builder.module
        fn = module.globals.get(symbol)
        if fn is None:
            ty = register_type(dtype)
            fn = ir.Function(module, ir.FunctionType(ty, [register_type(a.dtype) for a in args]), name=symbol)
            fn.linkage = "internal"
            for attribute in ("alwaysinline", "nounwind", "readnone"):
                fn.attributes.add(attribute)
            inner = LLVMCore(ir.IRBuilder(fn.append_basic_block("entry")), FloatMode.EXACT)
            result = body(inner, *(Scalar(v, a.dtype) for v, a in zip(fn.args, args, strict=True)))
            inner.builder.ret(result.value)
        return Scalar(self.builder.call(fn, [a.value for a in args]), dtype)

    def libm_where(self, cond: Scalar, name: str, x: Scalar, otherwise: Scalar) -> Scalar:
        """A branch, taken only where ``cond`` holds, to a ``noinline`` wrapper of libm's ``name``.
        Called directly, the speculatable intrinsic would be if-converted by the vectorizer and
        run for every lane; behind a real call, the loop stays scalar and only the elements that
        need libm pay for it."""
        bld = self.builder
        start = bld.block
        with bld.if_then(cond.value, likely=False):
            slow = bld.call(_libm_function(bld.module, name, register_type(x.dtype)), [x.value])
            slow_block = bld.block
        result = bld.phi(register_type(x.dtype))
        result.add_incoming(otherwise.value, start)
        result.add_incoming(slow, slow_block)
        return Scalar(result, x.dtype)


def _libm_function(module: ir.Module, name: str, ty: ir.Type) -> ir.Function:
    suffix = "f32" if isinstance(ty, ir.FloatType) else "f64"
    symbol = f"kiln.math.{name}_slow.{suffix}"
    fn = module.globals.get(symbol)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ty, [ty]), name=symbol)
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        fn.attributes.add("nounwind")
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        builder.ret(intrinsic(builder, name, fn.args[0]))  # inf -> nan as numpy
    return fn
