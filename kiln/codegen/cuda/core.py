"""The scalar core as Python source for ``numba.cuda.jit``: kiln/codegen/core.py written as text.

Each operation appends one assignment ``tN = <expression>`` to the function being written
(``Source``) and returns ``Scalar("tN", dtype)``; the kernel generator then wraps those lines in
loops. Every integer and float result is passed through its numpy type's constructor
(``np.int32(a + b)``): numba types ``int32 + int32`` as int64 and numpy scalars warn on overflow
but wrap, so the constructor gives modulo-``2**bits`` arithmetic in both, and operands of one
dtype never meet a mixed signed/unsigned promotion to float64.

What numba's Python operators cannot say exactly -- a fused multiply-add rounded once, floor and
friends that keep the float type, C's truncating division, a bit cast -- is a call into the small
runtime vocabulary of ``kiln.codegen.cuda.runtime`` (``fma_float32``, ``floor_float64``,
``sdiv``...), which has one implementation on the device (libdevice, shuffles) and one for
Numba's CUDA simulator (numpy, exact): the generated source is the same for both.

Routines (mathlib's exp, log...) become device functions, written once per module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ..core import FloatMode, ModeMixin, Scalar, Unsupported

#: dtypes the CUDA code generator compiles (numba has no bfloat16 scalar; float16 is left to eager)
SUPPORTED = {d.name for d in (dt.bool_, dt.int8, dt.int16, dt.int32, dt.int64, dt.uint8, dt.float32, dt.float64)}
_UNSIGNED = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_COMPARE_OPPOSITE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!="}


def np_type(dtype: DType) -> str:
    """The numpy constructor spelled in generated source (``np.float32``)."""
    if dtype.name not in SUPPORTED:
        raise Unsupported(f"{dtype.name} has no CUDA kernels")
    return "np.bool_" if dtype is dt.bool_ else f"np.{dtype.np.name}"


def literal(value: object, dtype: DType) -> str:
    """``value`` as a typed literal of ``dtype`` (integers wrap as numpy's astype does)."""
    if dtype is dt.bool_:
        return "True" if value else "False"
    if dtype.category == dt.INTEGER:
        bits = 8 * dtype.itemsize
        v = int(value) & ((1 << bits) - 1)  # type: ignore[call-overload]
        v = v - (1 << bits) if dtype.is_signed and v >> (bits - 1) else v
        return f"{np_type(dtype)}({v})"
    f = float(value)  # type: ignore[arg-type]
    # numba reads math.inf and math.nan as constants (it cannot call float() on a string)
    text = {"inf": "math.inf", "-inf": "-math.inf", "nan": "math.nan"}.get(repr(f), repr(f))
    return f"{np_type(dtype)}({text})"


class Source:
    """The lines of one function body being written, with fresh temporary names."""

    def __init__(self, indent: str = "    ", prefix: str = "t") -> None:
        self.lines: list[str] = []
        self.indent = indent
        self.prefix = prefix
        self.count = 0

    def fresh(self, stem: str = "") -> str:
        self.count += 1
        return f"{stem or self.prefix}{self.count}"

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)

    @contextlib.contextmanager
    def block(self, header: str) -> Iterator[None]:
        """``header:`` with the lines written inside the ``with`` indented under it."""
        self.emit(header + ":")
        saved, self.indent = self.indent, self.indent + "    "
        try:
            yield
        finally:
            self.indent = saved


class SourceCore(ModeMixin):
    """The core writing into ``source``; ``module`` collects routines (device functions). Float
    modes change nothing: numba's CUDA target contracts nothing unless asked (fastmath is off), and
    the runtime's ``fma_*`` is the only fused operation."""

    def __init__(self, source: Source, module: CudaModule) -> None:
        self.source = source
        self.module = module
        self.mode = FloatMode.ELEMENTWISE

    def _let(self, expression: str, dtype: DType) -> Scalar:
        name = self.source.fresh()
        self.source.emit(f"{name} = {expression}")
        return Scalar(name, dtype)

    def _typed(self, expression: str, dtype: DType) -> Scalar:
        return self._let(expression if dtype is dt.bool_ else f"{np_type(dtype)}({expression})", dtype)

    def constant(self, value: object, dtype: DType) -> Scalar:
        return Scalar(literal(value, dtype), dtype)

    def _binary(self, op: str, a: Scalar, b: Scalar) -> Scalar:
        assert a.dtype is b.dtype, f"operands of {a.dtype.name} and {b.dtype.name}"
        return self._typed(f"{a.value} {op} {b.value}", a.dtype)

    def add(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary("+", a, b)

    def sub(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary("-", a, b)

    def mul(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary("*", a, b)

    def div(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary("/", a, b)

    def _call(self, fn: str, *args: Scalar) -> Scalar:
        return self._typed(f"{fn}_{args[0].dtype.name}({', '.join(str(a.value) for a in args)})", args[0].dtype)

    def frem(self, a: Scalar, b: Scalar) -> Scalar:
        return self._call("fmod", a, b)

    def neg(self, x: Scalar) -> Scalar:
        return self._typed(f"-{x.value}", x.dtype)

    def fma(self, a: Scalar, b: Scalar, c: Scalar) -> Scalar:
        return self._call("fma", a, b, c)

    def compare(self, op: str, a: Scalar, b: Scalar, *, unordered: bool = False) -> Scalar:
        assert a.dtype is b.dtype, f"operands of {a.dtype.name} and {b.dtype.name}"
        x, y = a.value, b.value
        if a.dtype.category != dt.FLOATING:
            return self._let(f"{x} {op} {y}", dt.bool_)
        nan = f"({x} != {x} or {y} != {y})"
        if op == "uno":
            return self._let(nan, dt.bool_)
        # Python's operators are ordered (false with nan) except != (true with nan)
        if op == "!=":
            return self._let(f"{x} != {y}" if unordered else f"not ({x} == {y} or {nan})", dt.bool_)
        return self._let(f"not ({x} {_COMPARE_OPPOSITE[op]} {y})" if unordered and op != "==" else
                         (f"({x} == {y} or {nan})" if unordered else f"{x} {op} {y}"), dt.bool_)  # fmt: skip

    def select(self, cond: Scalar, a: Scalar, b: Scalar) -> Scalar:
        return self._let(f"{a.value} if {cond.value} else {b.value}", a.dtype)

    def cast(self, x: Scalar, dtype: DType) -> Scalar:
        assert dtype is not dt.bool_, "truth is a comparison, not a cast"
        if x.dtype is dt.bool_:  # numba converts bool to an integer or float directly; numpy too
            return self._typed(f"1 if {x.value} else 0", dtype)
        return self._typed(str(x.value), dtype)

    def bitcast(self, x: Scalar, dtype: DType) -> Scalar:
        self.module.need_bitcast(x.dtype, dtype)
        return self._let(f"bitcast_{x.dtype.name}_{dtype.name}({x.value})", dtype)

    def floor(self, x: Scalar) -> Scalar:
        return self._call("floor", x)

    def ceil(self, x: Scalar) -> Scalar:
        return self._call("ceil", x)

    def roundeven(self, x: Scalar) -> Scalar:
        return self._call("rint", x)

    def sqrt(self, x: Scalar) -> Scalar:
        return self._call("sqrt", x)

    def fabs(self, x: Scalar) -> Scalar:
        return self._call("fabs", x)

    def copysign(self, magnitude: Scalar, sign: Scalar) -> Scalar:
        return self._call("copysign", magnitude, sign)

    def and_(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary("&", a, b)

    def or_(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary("|", a, b)

    def xor(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary("^", a, b)

    def not_(self, x: Scalar) -> Scalar:
        return self._let(f"not {x.value}", x.dtype) if x.dtype is dt.bool_ else self._typed(f"~{x.value}", x.dtype)

    def shl(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary("<<", a, b)

    def ashr(self, a: Scalar, b: Scalar) -> Scalar:
        return self._binary(">>", a, b)

    def _unsigned(self, fn: str, a: Scalar, b: Scalar) -> Scalar:
        u = f"np.{_UNSIGNED[a.dtype.itemsize]}"
        if a.dtype.is_signed:
            return self._typed(f"{u}({fn.format(f'{u}({a.value})', f'{u}({b.value})')})", a.dtype)
        return self._typed(fn.format(a.value, b.value), a.dtype)

    def lshr(self, a: Scalar, b: Scalar) -> Scalar:
        return self._unsigned("{} >> {}", a, b)

    def udiv(self, a: Scalar, b: Scalar) -> Scalar:
        return self._unsigned("{} // {}", a, b)

    def urem(self, a: Scalar, b: Scalar) -> Scalar:
        return self._unsigned("{} % {}", a, b)

    def sdiv(self, a: Scalar, b: Scalar) -> Scalar:
        return self._typed(f"sdiv({a.value}, {b.value})", a.dtype)

    def srem(self, a: Scalar, b: Scalar) -> Scalar:
        return self._typed(f"srem({a.value}, {b.value})", a.dtype)

    def routine(self, name: str, body: Callable[..., Scalar], *args: Scalar) -> Scalar:
        function = self.module.routine(name, body, tuple(a.dtype for a in args))
        return self._typed(f"{function}({', '.join(str(a.value) for a in args)})", args[0].dtype)

    def libm_where(self, cond: Scalar, name: str, x: Scalar, otherwise: Scalar) -> Scalar:
        return self._let(f"{np_type(x.dtype)}(libm_{name}_{x.dtype.name}({x.value})) if {cond.value} "
                         f"else {otherwise.value}", x.dtype)  # fmt: skip


class CudaModule:
    """The device functions of one generated module (routines, bit casts) and its kernels' text."""

    def __init__(self) -> None:
        self.functions: list[str] = []
        self.kernels: list[str] = []
        self._routines: dict[tuple, str] = {}
        self._bitcasts: set[tuple[str, str]] = set()

    def routine(self, name: str, body: Callable[..., Scalar], dtypes: tuple[DType, ...]) -> str:
        key = (name, tuple(d.name for d in dtypes))
        if key not in self._routines:
            function = f"routine_{name}_{'_'.join(key[1])}"
            source = Source()
            core = SourceCore(source, self)
            params = [Scalar(f"a{k}", d) for k, d in enumerate(dtypes)]
            with core.float_mode(FloatMode.EXACT):
                result = body(core, *params)
            lines = [f"def {function}({', '.join(str(p.value) for p in params)}):", *source.lines,
                     f"    return {result.value}"]  # fmt: skip
            self.functions.append("@cuda.jit(device=True)\n" + "\n".join(lines))
            self._routines[key] = function
        return self._routines[key]

    def need_bitcast(self, source: DType, target: DType) -> None:
        key = (source.name, target.name)
        if key not in self._bitcasts:
            self._bitcasts.add(key)
            self.functions.append(
                f"@cuda.jit(device=True)\ndef bitcast_{source.name}_{target.name}(x):\n"
                f"    buffer = cuda.local.array(1, {np_type(source)})\n    buffer[0] = x\n"
                f"    return buffer.view({np_type(target)})[0]"
            )

    def text(self) -> str:
        return "\n\n\n".join([*self.functions, *self.kernels]) + "\n"
