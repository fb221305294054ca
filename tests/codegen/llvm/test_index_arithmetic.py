"""The i64 index arithmetic of the kernel generators (``loops.add``, ``mul``, ``minimum``, ``dot``):
constants folded and identities left out, so LLVM is not handed ``add i64 0, x`` nor ``mul x, 1``
to parse and remove; the values equal Python's."""

from __future__ import annotations

import ctypes
import itertools

import pytest
from llvmlite import ir

from kiln.codegen.llvm import engine, loops
from kiln.codegen.llvm.loops import I64, i64

_LIBRARIES: list = []


def _function(build):
    """Compile ``i64 f(i64 a, i64 b, i64 c)`` returning ``build(builder, a, b, c)``; (f, its IR text)."""
    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(I64, [I64, I64, I64]), "f")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    builder.ret(build(builder, *fn.args))
    text = str(module)
    library = engine.Library([engine.compile_here(text)])
    _LIBRARIES.append(library)
    return ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(library.address("f")), text


def _instructions(text: str) -> list[str]:
    return [line.split("=", 1)[1].split()[0] for line in text.splitlines() if "=" in line and "%" in line.split("=")[0]]


@pytest.mark.parametrize("coefficients", [(1, 0, 3), (0, 0, 0), (1, 1, 1), (2, 0, 1), (-1, 5, 0)])
def test_dot_leaves_out_zero_terms_and_unit_coefficients(coefficients):
    f, text = _function(lambda bld, *xs: loops.dot(bld, list(zip(xs, coefficients, strict=True))))
    muls = sum(c not in (0, 1) for c in coefficients)
    adds = max(0, sum(c != 0 for c in coefficients) - 1)
    assert sorted(_instructions(text)) == sorted(["mul"] * muls + ["add"] * adds)
    for a, b, c in itertools.product([0, 3, 17], repeat=3):
        assert f(a, b, c) == sum(x * k for x, k in zip((a, b, c), coefficients, strict=True))


def test_add_mul_and_minimum_fold_constants_and_identities():
    def build(bld, a, b, c):
        zero, one, seven = i64(0), i64(1), i64(7)
        assert loops.add(bld, zero, a) is a and loops.add(bld, a, zero) is a
        assert loops.mul(bld, one, b) is b and loops.mul(bld, b, one) is b
        assert loops.mul(bld, a, zero).constant == 0
        assert loops.add(bld, seven, i64(5)).constant == 12
        assert loops.mul(bld, seven, i64(-3)).constant == -21
        assert loops.minimum(bld, seven, i64(5)).constant == 5
        return loops.minimum(bld, loops.add(bld, loops.mul(bld, a, seven), b), c)

    f, text = _function(build)
    assert sorted(_instructions(text)) == ["add", "icmp", "mul", "select"]
    for a, b, c in itertools.product([0, 2, 9], [0, 4], [5, 100]):
        assert f(a, b, c) == min(a * 7 + b, c)
