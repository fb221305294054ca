"""LLVMEmitter against numpy: every elementwise primitive's scalar formula, compiled, equals eager.

Each case becomes one small LLVM function ``void f(ptr args, i64 n)`` looping over n elements of
contiguous (already broadcast) inputs; all cases of one test go into one module, compiled once.
Discrete ops must be bit-exact (nan positions and the sign of zeros included); the transcendental
ops from mathlib are held to ``MATH_ULPS`` units in the last place of eager's result.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from llvmlite import ir

from kiln.codegen.llvm import Unsupported, engine, flags
from kiln.codegen.llvm.emitter import LLVMEmitter, Scalar, load, memory_type, register_type, store
from kiln.ir import dtypes as dt
from kiln.ir.primitives import ELEMENTWISE, PRIMITIVES


def _have_mathlib() -> bool:
    try:
        from kiln.codegen import mathlib  # noqa: PLC0415 - written concurrently by another helper
    except ImportError:
        return False
    return hasattr(mathlib, "call")


HAVE_MATHLIB = _have_mathlib()
needs_mathlib = pytest.mark.skipif(not HAVE_MATHLIB, reason="kiln/codegen/mathlib (helper MATH) not there yet")

MATH_OPS = {"exp", "expm1", "log", "log1p", "sin", "cos", "tanh", "sigmoid", "erf"}
MATH_ULPS = 4  # mathlib's float32/float64 bound against eager; pow of floats is held to it too
INT_DTYPES = (dt.uint8, dt.int8, dt.int16, dt.int32, dt.int64)
COMPILED_DTYPES = (dt.bool_, *INT_DTYPES, dt.float32, dt.float64)
ELEMENTWISE_PRIMS = sorted((p for p in PRIMITIVES.values() if p.kind in ELEMENTWISE), key=lambda p: p.name)

# ----------------------------------------------------------------------------- the harness


@dataclass
class Case:
    formula: Callable[..., Scalar]  # (emitter, *scalars) -> Scalar
    args: tuple[np.ndarray, ...]  # broadcast and contiguous
    out: np.ndarray | None = None
    error: Exception | None = None  # what building raised (Unsupported...)


def _build(module: ir.Module, name: str, case: Case) -> np.dtype | None:
    ptr, i64 = ir.PointerType(), ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, i64]), name)
    args, n = fn.args
    entry, body, done = fn.append_basic_block("entry"), fn.append_basic_block("body"), fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    pointers = [
        b.load(b.gep(args, [ir.Constant(i64, k)], source_etype=ptr), typ=ptr) for k in range(len(case.args) + 1)
    ]
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), body, done)
    b.position_at_end(body)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    scalars = []
    for pointer, array in zip(pointers, case.args):
        dtype = dt.from_numpy_dtype(array.dtype)
        scalars.append(load(b, b.gep(pointer, [i], source_etype=memory_type(dtype)), dtype))
    result = case.formula(LLVMEmitter(b), *scalars)
    store(b, result, b.gep(pointers[-1], [i], source_etype=memory_type(result.dtype)))
    following = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(following, b.block)  # the latch: a formula may end in another block (integer pow's loop)
    b.cbranch(b.icmp_signed("<", following, n), body, done)
    b.position_at_end(done)
    b.ret_void()
    return result.dtype.np


# MCJIT takes ownership of the target machine it is given and frees it with the library; engine.py
# shares one cached target machine, so a freed Library breaks the next compile_ir (std::bad_alloc).
# Until engine.Library passes a fresh target machine, the test keeps its libraries alive.
_LIBRARIES: list[engine.Library] = []


def run(cases: list[Case]) -> list[Case]:
    """Compile every case into one module, run each over its inputs, fill ``case.out``."""
    module = ir.Module("emitter_test")
    built = []
    for k, case in enumerate(cases):
        try:
            out_dtype = _build(module, f"case{k}", case)
        except Unsupported as e:
            case.error = e
            del module.globals[f"case{k}"]  # half built: no terminator
            continue
        built.append((k, case, out_dtype))
    library = engine.Library([engine.compile_ir(str(module))])
    _LIBRARIES.append(library)
    signature = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
    for k, case, out_dtype in built:
        shape = case.args[0].shape if case.args else ()
        case.out = np.zeros(shape, out_dtype)
        pointers = (ctypes.c_void_p * (len(case.args) + 1))(*(a.ctypes.data for a in (*case.args, case.out)))
        signature(library.address(f"case{k}"))(pointers, case.out.size)
    return cases


def broadcast(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(np.ascontiguousarray(a) for a in np.broadcast_arrays(*arrays))


def prim_formula(prim, attrs: dict) -> Callable[..., Scalar]:
    return lambda em, *xs: prim.scalar(em, *xs, **attrs)


# ----------------------------------------------------------------------------- comparisons


def exact_mismatch(actual: np.ndarray, expected: np.ndarray) -> str | None:
    """None when equal bit for bit up to nan payloads: values, nan positions, signs of zeros."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"got {actual.dtype}{actual.shape}, expected {expected.dtype}{expected.shape}"
    if not np.array_equal(actual, expected, equal_nan=actual.dtype.kind == "f"):
        return f"got {actual!r}, expected {expected!r}"
    if actual.dtype.kind == "f":
        real = ~np.isnan(expected)
        if not np.array_equal(np.signbit(actual[real]), np.signbit(expected[real])):
            return f"signs of zeros differ: got {actual!r}, expected {expected!r}"
    return None


def ulps(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Distance in units in the last place (0 where both are nan or equal, huge where one is nan)."""
    itype = np.int32 if actual.dtype == np.float32 else np.int64

    def ordered(x):
        bits = x.view(itype).astype(np.int64)
        return np.where(bits < 0, np.iinfo(itype).min - bits, bits).astype(np.float64)

    distance = np.abs(ordered(actual) - ordered(expected))
    both_nan = np.isnan(actual) & np.isnan(expected)
    one_nan = np.isnan(actual) ^ np.isnan(expected)
    return np.where(both_nan, 0.0, np.where(one_nan, np.inf, distance))


def eager(prim, args, attrs) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(prim.eager(np, *args, **attrs))


# ----------------------------------------------------------------------------- the registry walk


def _as_float(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return array.astype(dtype) if array.dtype.kind == "f" else array


def _registry_cases(float_dtype: np.dtype) -> list[tuple[object, Case, np.ndarray]]:
    """One case per primitive, attributes and input dtypes: its samples' elements side by side
    (one function each keeps the module small; the formula sees one element at a time anyway)."""
    rng = np.random.default_rng(0)
    groups: dict[tuple, tuple[object, dict, list, list]] = {}
    for prim in ELEMENTWISE_PRIMS:
        for sample in prim.samples(rng):
            args = broadcast(*(_as_float(np.asarray(a), float_dtype) for a in sample.args))
            inexact = prim.name in MATH_OPS or (prim.name == "pow" and args[0].dtype.kind == "f")
            if inexact and not HAVE_MATHLIB:
                continue
            key = (prim.name, tuple(sorted(sample.attrs.items(), key=str)), tuple(a.dtype for a in args))
            group = groups.setdefault(key, (prim, sample.attrs, [], []))
            group[2].append([a.ravel() for a in args])
            group[3].append(eager(prim, args, sample.attrs).ravel())
    out = []
    for prim, attrs, arg_lists, expected in groups.values():
        args = tuple(np.concatenate(column) for column in zip(*arg_lists))
        out.append((prim, Case(prim_formula(prim, attrs), args), np.concatenate(expected)))
    return out


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_registry_samples_match_eager(float_dtype):
    cases = _registry_cases(np.dtype(float_dtype))
    run([case for _, case, _ in cases])
    failures = []
    for prim, case, expected in cases:
        assert case.error is None, f"{prim.name}: {case.error}"
        inexact = prim.name in MATH_OPS or (prim.name == "pow" and expected.dtype.kind == "f")
        if inexact:
            worst = ulps(case.out, expected).max(initial=0.0)
            problem = None if worst <= MATH_ULPS else f"{worst} ulps: got {case.out!r}, expected {expected!r}"
        else:
            problem = exact_mismatch(case.out, expected)
        if problem:
            failures.append(f"{prim.name}{[a.dtype.name for a in case.args]}: {problem}")
    assert not failures, "\n".join(failures)


def test_every_elementwise_primitive_is_walked():
    names = {p.name for p in ELEMENTWISE_PRIMS}
    assert {"add", "floor_divide", "remainder", "maximum", "where", "cast", "round", "logical_xor"} <= names


# ----------------------------------------------------------------------------- integers and bools

P = PRIMITIVES
RAW_NUMPY = {"floor_divide": np.floor_divide, "remainder": np.remainder}  # eager raises on x // 0 first
UNSUPPORTED = {  # what numpy rejects (or computes in float16) for bool operands
    ("neg", "bool"), ("sign", "bool"), ("round", "bool"), ("sub", "bool"), ("shift_left", "bool"),
    ("shift_right", "bool"),  # (PyTorch has no shift of bool)
}  # fmt: skip


def int_values(dtype: dt.DType) -> np.ndarray:
    """Zero, small values of both signs, and the extremes of ``dtype``."""
    if dtype is dt.bool_:
        return np.array([False, True])
    info = np.iinfo(dtype.np)
    values = [0, 1, -1, 2, -2, 3, -3, 7, -7, 100, -100, info.min, info.max, info.min + 1, info.max - 1]
    return np.unique(np.array(values, np.int64).astype(dtype.np))  # wraps into uint8


def expected_of(prim, args) -> np.ndarray:
    with np.errstate(all="ignore"):
        try:
            return np.asarray(prim.eager(np, *args))
        except ZeroDivisionError:
            return np.asarray(RAW_NUMPY[prim.name](*args))


def check_cases(cases: list[tuple[str, Case, np.ndarray | None]]) -> None:
    """Run and compare exactly; an expectation of None means the emitter must raise Unsupported."""
    run([case for _, case, _ in cases])
    failures = []
    for label, case, expected in cases:
        if expected is None:
            if not isinstance(case.error, Unsupported):
                failures.append(f"{label}: expected Unsupported, got {case.out!r}")
        elif case.error is not None:
            failures.append(f"{label}: {case.error}")
        elif problem := exact_mismatch(case.out, expected):
            failures.append(f"{label}: {problem}\n  inputs {case.args}")
    assert not failures, "\n".join(failures)


BINARY = ("add", "sub", "mul", "div", "floor_divide", "remainder", "maximum", "minimum", "eq", "ne", "lt", "le",
          "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
          "shift_left", "shift_right")  # fmt: skip
UNARY = ("neg", "abs", "sign", "floor", "ceil", "round", "logical_not", "bitwise_not")


@pytest.mark.parametrize("dtype", (dt.bool_, *INT_DTYPES), ids=lambda d: d.name)
def test_integer_and_bool_ops_match_numpy(dtype):
    """Every op on every pair of edge values: division by zero (numpy's 0), INT_MIN // -1 (wraps),
    negative operands, wrapping arithmetic; bool's int8 floor division and float64 true division."""
    values = int_values(dtype)
    a, b = (np.ascontiguousarray(g) for g in np.meshgrid(values, values))
    cases = []
    for name in BINARY:
        unsupported = (name, dtype.name) in UNSUPPORTED
        expected = None if unsupported else expected_of(P[name], (a, b))
        cases.append((f"{name}[{dtype.name}]", Case(prim_formula(P[name], {}), (a, b)), expected))
    for name in UNARY:
        unsupported = (name, dtype.name) in UNSUPPORTED
        expected = None if unsupported else expected_of(P[name], (values,))
        cases.append((f"{name}[{dtype.name}]", Case(prim_formula(P[name], {}), (values,)), expected))
    check_cases(cases)


@pytest.mark.parametrize("dtype", (dt.bool_, *INT_DTYPES), ids=lambda d: d.name)
def test_integer_pow_matches_numpy(dtype):
    """Square-and-multiply modulo 2**bits, exponents up to the dtype's maximum."""
    values = int_values(dtype)
    exponents = values[values >= 0] if dtype is not dt.bool_ else values
    exponents = np.concatenate([exponents, np.arange(0, 20, dtype=dtype.np)]) if dtype is not dt.bool_ else exponents
    a, b = (np.ascontiguousarray(g) for g in np.meshgrid(values, exponents))
    check_cases([(f"pow[{dtype.name}]", Case(prim_formula(P["pow"], {}), (a, b)), expected_of(P["pow"], (a, b)))])


@pytest.mark.parametrize("dtype", [d for d in INT_DTYPES if d.is_signed], ids=lambda d: d.name)
def test_integer_pow_negative_exponent_is_pytorchs(dtype):
    """numpy raises for negative integer exponents; the kernel gives PyTorch's 1, +-1 or 0 (no UB)."""
    a = np.array([0, 1, -1, -1, 2, -2, 5, np.iinfo(dtype.np).min], dtype.np)
    b = np.array([-1, -3, -3, -2, -1, -2, -1, -1], dtype.np)
    expected = np.array([0, 1, -1, 1, 0, 0, 0, 0], dtype.np)
    check_cases([("pow", Case(prim_formula(P["pow"], {}), (a, b)), expected)])


def test_integer_division_edges_by_hand():
    """Python's floor semantics written out, independent of numpy."""
    a = np.array([7, -7, 7, -7, 5, -128, -128, 0], np.int8)
    b = np.array([2, 2, -2, -2, 0, -1, 0, 0], np.int8)
    check_cases([
        ("floordiv", Case(prim_formula(P["floor_divide"], {}), (a, b)), np.array([3, -4, -4, 3, 0, -128, 0, 0], np.int8)),
        ("mod", Case(prim_formula(P["remainder"], {}), (a, b)), np.array([1, 1, -1, -1, 0, 0, 0, 0], np.int8)),
    ])  # fmt: skip


@pytest.mark.parametrize("dtype", COMPILED_DTYPES, ids=lambda d: d.name)
def test_where_for_every_dtype(dtype):
    values = int_values(dtype) if dtype.category != dt.FLOATING else np.array([-0.0, 1.5, np.nan], dtype.np)
    cond = np.arange(values.size) % 2 == 0
    args = (cond, values, np.ascontiguousarray(values[::-1]))
    check_cases([("where", Case(prim_formula(P["where"], {}), args), np.where(*args))])


# ----------------------------------------------------------------------------- casts

FLOAT_EDGES = np.array([0.0, -0.0, 0.7, -0.7, 2.5, -2.5, 127.9, 128.0, -129.0, 255.9, 256.0, 3e9, -3e9, 2.0**31,
                        -(2.0**31), 2.0**63, 9.3e18, -9.3e18, 1.8e19, 1e30, -1e30, np.inf, -np.inf, np.nan, 1e-310,
                        0.1, 3.5e38, 1e300, -1e-300])  # fmt: skip


@pytest.mark.parametrize("src", COMPILED_DTYPES, ids=lambda d: d.name)
def test_cast_to_every_dtype(src):
    """float -> int saturates, nan -> 0, then wraps (float_to_int); ints wrap; x -> bool is x != 0;
    float64 -> float32 rounds to nearest and overflows to inf."""
    with np.errstate(all="ignore"):
        values = FLOAT_EDGES.astype(src.np) if src.category == dt.FLOATING else int_values(src)
    cases = []
    for target in COMPILED_DTYPES:
        expected = eager(P["cast"], (values,), {"dtype": target})
        cases.append(
            (f"{src.name}->{target.name}", Case(prim_formula(P["cast"], {"dtype": target}), (values,)), expected)
        )
    check_cases(cases)


# ----------------------------------------------------------------------------- floats beyond the samples

FLOAT_GRID = np.array([0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.0, -3.0, 7.0, -7.0, 0.1, 1e-310, 2.0**52 + 1,
                       4503599627370497.5, 1e300, -1e300, np.inf, -np.inf, np.nan])  # fmt: skip
DISCRETE = ("floor_divide", "remainder", "maximum", "minimum", "add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt",
            "ge", "logical_and", "logical_or", "logical_xor")  # fmt: skip


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_float_discrete_ops_on_edge_grid(float_dtype):
    """numpy's floor_divide/remainder (inf, nan, signed zeros, zero divisors), max/min ties of
    -0.0 and 0.0, round half to even, sign of nan and of -0.0, on every pair of edge values."""
    with np.errstate(all="ignore"):
        values = FLOAT_GRID.astype(float_dtype)
    a, b = (np.ascontiguousarray(g) for g in np.meshgrid(values, values))
    cases = [(name, Case(prim_formula(P[name], {}), (a, b)), expected_of(P[name], (a, b))) for name in DISCRETE]
    cases += [(name, Case(prim_formula(P[name], {}), (values,)), expected_of(P[name], (values,)))
              for name in ("neg", "abs", "sign", "floor", "ceil", "round", "logical_not", "sqrt", "rsqrt")]  # fmt: skip
    check_cases(cases)


def test_round_half_even_by_hand():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 8388609.0], np.float32)
    expected = np.array([0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 0.0, 8388609.0], np.float32)
    check_cases([("round", Case(prim_formula(P["round"], {}), (x,)), expected)])


def test_max_min_propagate_nan_and_tie_like_numpy():
    a = np.array([np.nan, 1.0, -0.0, 0.0, np.nan], np.float64)
    b = np.array([1.0, np.nan, 0.0, -0.0, np.nan], np.float64)
    check_cases([
        ("max", Case(prim_formula(P["maximum"], {}), (a, b)), np.array([np.nan, np.nan, 0.0, -0.0, np.nan])),
        ("min", Case(prim_formula(P["minimum"], {}), (a, b)), np.array([np.nan, np.nan, 0.0, -0.0, np.nan])),
    ])  # fmt: skip


# ----------------------------------------------------------------------------- types, memory, flags


def test_register_and_memory_types():
    assert str(register_type(dt.bool_)) == "i1" and str(memory_type(dt.bool_)) == "i8"
    assert [str(register_type(d)) for d in INT_DTYPES] == ["i8", "i8", "i16", "i32", "i64"]
    assert (str(register_type(dt.float32)), str(register_type(dt.float64))) == ("float", "double")
    with pytest.raises(Unsupported, match="float16"):
        register_type(dt.float16)


def test_bool_bytes_load_as_truth_and_store_as_0_or_1():
    raw = np.array([0, 1, 2, 255], np.uint8).view(np.bool_)
    case = run([Case(lambda em, x: em.logical_not(em.logical_not(x)), (raw,))])[0]
    assert case.out.view(np.uint8).tolist() == [0, 1, 1, 1]


def test_float_only_ops_reject_integers():
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
    em = LLVMEmitter(ir.IRBuilder(fn.append_basic_block()))
    x = em.constant(3, dt.int32)
    for name in ("exp", "log", "sqrt", "rsqrt", "tanh", "erf"):
        with pytest.raises(Unsupported, match=f"{name} of int32"):
            getattr(em, name)(x)
    with pytest.raises(TypeError, match="int32 and float32"):
        em.add(x, em.constant(1.0, dt.float32))


def test_arithmetic_carries_the_elementwise_flags_and_never_forbidden_ones():
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
    em = LLVMEmitter(ir.IRBuilder(fn.append_basic_block()))
    x = em.constant(1.5, dt.float32)
    for name in ("add", "sub", "mul", "div"):
        assert "fadd contract" in str(em.add(x, x).value) or name != "add"
        assert f"f{name} contract" in str(getattr(em, name)(x, x).value)
    text = str(fn)
    assert not any(flag in text for flag in flags.FORBIDDEN)
    assert flags.ELEMENTWISE == ("contract",) and "reassoc" in flags.REDUCTION


@needs_mathlib
@pytest.mark.parametrize("dtype", [dt.float32, dt.float64], ids=lambda d: d.name)
def test_transcendental_methods_call_kilns_mathlib(dtype):
    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "f")
    em = LLVMEmitter(ir.IRBuilder(fn.append_basic_block()))
    x = em.constant(0.5, dtype)
    for name in sorted(MATH_OPS):
        assert getattr(em, name)(x).dtype is dtype
    em.pow(x, x)
    suffix = "f32" if dtype is dt.float32 else "f64"
    assert {f"kiln.math.{name}.{suffix}" for name in (*MATH_OPS, "pow")} <= set(module.globals)
    external = {g.name for g in module.functions if g.is_declaration and not g.name.startswith("llvm.")}
    assert not external, f"calls outside the module: {external}"
