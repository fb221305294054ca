"""kiln's semantics over a second core: ``Semantics(NumpyCore())`` against eager, without LLVM.

The numpy core maps each core operation onto one numpy call, so whatever these tests find wrong
is in kiln/codegen/semantics.py or mathlib (shared by every backend), not in a code generator.
Discrete results must be bit-exact (nan positions and signs of zeros included); the
transcendental routines are held to ``MATH_ULPS`` of eager's result, as the LLVM tests hold them.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kiln.codegen.core import Scalar, Unsupported
from kiln.codegen.numpy_core import NumpyCore
from kiln.codegen.semantics import Semantics
from kiln.ir import dtypes as dt
from kiln.ir.emitter import BINARY_METHODS, UNARY_METHODS
from kiln.ir.primitives import ELEMENTWISE, PRIMITIVES, Kind
from tests.codegen.llvm.test_emitter import (
    BINARY,
    COMPILED_DTYPES,
    FLOAT_EDGES,
    FLOAT_GRID,
    INT_DTYPES,
    MATH_OPS,
    MATH_ULPS,
    UNARY,
    UNSUPPORTED,
    eager,
    exact_mismatch,
    expected_of,
    int_values,
    ulps,
)

P = PRIMITIVES
ELEMENTWISE_PRIMS = sorted((p for p in PRIMITIVES.values() if p.kind in ELEMENTWISE), key=lambda p: p.name)


def scalar(array) -> Scalar:
    array = np.ascontiguousarray(array)
    return Scalar(array, dt.from_numpy_dtype(array.dtype))


def evaluate(prim, args, attrs=None) -> np.ndarray:
    """``prim``'s formula on the numpy core, element by element of the broadcast ``args``."""
    em = Semantics(NumpyCore())
    args = np.broadcast_arrays(*args)
    return np.asarray(prim.scalar(em, *(scalar(a) for a in args), **(attrs or {})).value)


def check(label: str, got: np.ndarray, expected: np.ndarray, inexact: bool = False) -> str | None:
    if inexact:
        worst = ulps(got, expected).max(initial=0.0)
        return None if worst <= MATH_ULPS else f"{label}: {worst} ulps: got {got!r}, expected {expected!r}"
    problem = exact_mismatch(got, expected)
    return problem and f"{label}: {problem}"


def test_semantics_implements_the_whole_emitter_protocol():
    for name in (*UNARY_METHODS, *BINARY_METHODS, "select", "cast"):
        assert callable(getattr(Semantics, name, None)), f"Semantics lacks {name}"


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_registry_samples_match_eager(float_dtype):
    """Every elementwise primitive's samples, formula on the numpy core vs the eager kernel."""
    rng = np.random.default_rng(0)
    failures = []
    for prim in ELEMENTWISE_PRIMS:
        for sample in prim.samples(rng):
            args = [np.asarray(a) for a in sample.args]
            args = [a.astype(float_dtype) if a.dtype.kind == "f" else a for a in args]
            args = [np.ascontiguousarray(a) for a in np.broadcast_arrays(*args)]
            expected = eager(prim, args, sample.attrs)
            got = evaluate(prim, args, sample.attrs)
            inexact = prim.name in MATH_OPS or (prim.name == "pow" and expected.dtype.kind == "f")
            failures.append(check(prim.name, got, expected, inexact))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", (dt.bool_, *INT_DTYPES), ids=lambda d: d.name)
def test_integer_and_bool_ops_on_edge_values(dtype):
    """Division by zero (numpy's 0), INT_MIN // -1 (wraps), wrapping arithmetic, every pair of
    edge values; what numpy rejects for bool raises Unsupported."""
    values = int_values(dtype)
    a, b = (np.ascontiguousarray(g) for g in np.meshgrid(values, values))
    failures = []
    for name, args in [(n, (a, b)) for n in BINARY] + [(n, (values,)) for n in UNARY]:
        if (name, dtype.name) in UNSUPPORTED:
            with pytest.raises(Unsupported):
                evaluate(P[name], args)
            continue
        failures.append(check(f"{name}[{dtype.name}]", evaluate(P[name], args), expected_of(P[name], args)))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)


def test_integer_division_by_zero_and_int_min_by_minus_one():
    a = np.array([7, -7, 7, -7, 5, -128, -128, 0], np.int8)
    b = np.array([2, 2, -2, -2, 0, -1, 0, 0], np.int8)
    np.testing.assert_array_equal(evaluate(P["floor_divide"], (a, b)), [3, -4, -4, 3, 0, -128, 0, 0])
    np.testing.assert_array_equal(evaluate(P["remainder"], (a, b)), [1, 1, -1, -1, 0, 0, 0, 0])
    big = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).min], np.int64)
    np.testing.assert_array_equal(evaluate(P["floor_divide"], (big, np.array([-1, 0]))), [big[0], 0])


@pytest.mark.parametrize("dtype", (dt.bool_, *INT_DTYPES), ids=lambda d: d.name)
def test_integer_pow_wraps_as_numpy(dtype):
    values = int_values(dtype)
    exponents = values if dtype is dt.bool_ else np.concatenate([values[values >= 0], np.arange(20, dtype=dtype.np)])
    a, b = (np.ascontiguousarray(g) for g in np.meshgrid(values, exponents))
    assert not exact_mismatch(evaluate(P["pow"], (a, b)), expected_of(P["pow"], (a, b)))


@pytest.mark.parametrize("dtype", [d for d in INT_DTYPES if d.is_signed], ids=lambda d: d.name)
def test_integer_pow_negative_exponents_are_pytorchs(dtype):
    a = np.array([0, 1, -1, -1, 2, -2, 5, np.iinfo(dtype.np).min], dtype.np)
    b = np.array([-1, -3, -3, -2, -1, -2, -1, -1], dtype.np)
    np.testing.assert_array_equal(evaluate(P["pow"], (a, b)), np.array([0, 1, -1, 1, 0, 0, 0, 0], dtype.np))


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_float_divmod_and_discrete_ops_on_the_edge_grid(float_dtype):
    """numpy's floor_divide/remainder signs (inf, nan, signed zeros, zero divisors), max/min ties
    and nan, rounding, sign of nan, on every pair of edge values."""
    with np.errstate(all="ignore"):
        values = FLOAT_GRID.astype(float_dtype)
    a, b = (np.ascontiguousarray(g) for g in np.meshgrid(values, values))
    names = ("floor_divide", "remainder", "maximum", "minimum", "eq", "ne", "lt", "logical_xor", "div", "sub")
    failures = [check(n, evaluate(P[n], (a, b)), expected_of(P[n], (a, b))) for n in names]
    failures += [check(n, evaluate(P[n], (values,)), expected_of(P[n], (values,)))
                 for n in ("neg", "abs", "sign", "floor", "ceil", "round", "logical_not", "sqrt")]  # fmt: skip
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)


def test_max_min_propagate_nan():
    a = np.array([np.nan, 1.0, -0.0, 0.0, np.nan])
    b = np.array([1.0, np.nan, 0.0, -0.0, np.nan])
    nan_first = np.array([np.nan, np.nan, 0.0, -0.0, np.nan])
    assert not exact_mismatch(evaluate(P["maximum"], (a, b)), nan_first)
    assert not exact_mismatch(evaluate(P["minimum"], (a, b)), nan_first)


@pytest.mark.parametrize("src", COMPILED_DTYPES, ids=lambda d: d.name)
def test_saturating_casts_to_every_dtype(src):
    """float -> int truncates, saturates at +-9.2e18 and wraps narrower; nan -> 0; x -> bool is x != 0."""
    with np.errstate(all="ignore"):
        values = FLOAT_EDGES.astype(src.np) if src.category == dt.FLOATING else int_values(src)
    failures = []
    for target in COMPILED_DTYPES:
        attrs = {"dtype": target}
        got = evaluate(P["cast"], (values,), attrs)
        failures.append(check(f"{src.name}->{target.name}", got, eager(P["cast"], (values,), attrs)))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("prim", [p for p in PRIMITIVES.values() if p.kind is Kind.REDUCE and p.combine],
                         ids=lambda p: p.name)  # fmt: skip
@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
def test_reductions_fold_their_combine_op_from_their_identity(prim, dtype):
    """Each registry reduction's ``combine`` folded over a row from ``identity(dtype)`` equals eager
    (left to right, so float sums are compared with a tolerance; the rest exactly)."""
    rng = np.random.default_rng(1)
    x = rng.integers(-5, 6, size=(4, 7)).astype(dtype)
    if dtype is np.float64:
        x = rng.normal(size=(4, 7))
        x[1, 2], x[2, 3] = np.nan, -np.inf
    expected = eager(prim, (x,), {"axes": (1,), "keepdim": False})
    kind = dt.from_numpy_dtype(expected.dtype)
    em = Semantics(NumpyCore())
    acc = em.constant(prim.identity(kind), kind)
    for k in range(x.shape[1]):
        acc = em.combine(prim.combine, acc, em.cast(scalar(x[:, k]), kind))
    if kind.category == dt.FLOATING:
        np.testing.assert_allclose(acc.value, expected, rtol=1e-12)
    else:
        np.testing.assert_array_equal(acc.value, expected)


def test_the_shared_code_generator_modules_do_not_import_llvmlite():
    """A second backend uses the core, semantics, mathlib, kernel DAG and index algebra without LLVM."""
    modules = "core semantics mathlib kernel_dag index numpy_core".split()
    code = "import sys; " + "; ".join(f"import kiln.codegen.{m}" for m in modules)
    code += "; assert 'llvmlite' not in sys.modules, 'llvmlite was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
