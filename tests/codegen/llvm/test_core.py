"""LLVMCore: the fast-math flags of each float mode, where kiln's semantics put each mode, and the
native ``combine`` override of the LLVM emitter.

The flags are part of what the code computes: ``contract`` in elementwise arithmetic only,
nothing in numpy's divmod and in mathlib's routines (every rounding there is accounted for),
``reassoc`` only in a reduction's accumulation.
"""

from __future__ import annotations

from llvmlite import ir

from kiln.codegen.core import FloatMode
from kiln.codegen.llvm import flags
from kiln.codegen.llvm.core import LLVMCore
from kiln.codegen.llvm.emitter import LLVMEmitter
from kiln.ir import dtypes as dt


def _function() -> tuple[ir.Module, ir.IRBuilder]:
    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "f")
    return module, ir.IRBuilder(fn.append_basic_block())


def _float_ops(text: str) -> list[str]:
    ops = ("fadd", "fsub", "fmul", "fdiv", "frem", "fneg")
    return [line.strip() for line in text.splitlines() if any(f"= {op} " in line for op in ops)]


def test_each_mode_carries_its_flags():
    _, builder = _function()
    core = LLVMCore(builder)
    x = core.constant(1.5, dt.float32)
    assert "fmul contract float" in str(core.mul(x, x).value)
    for mode, expected in ((FloatMode.EXACT, "fmul float"), (FloatMode.REDUCTION, "fmul reassoc contract float")):
        with core.float_mode(mode):
            assert expected in str(core.mul(x, x).value)
    assert core.mode is FloatMode.ELEMENTWISE
    assert flags.BY_MODE[FloatMode.EXACT] == () and not flags.FORBIDDEN & set(flags.REDUCTION)


def test_divmod_and_mathlib_routines_carry_no_flags_elementwise_arithmetic_does():
    module, builder = _function()
    em = LLVMEmitter(builder)
    x = em.constant(2.5, dt.float64)
    before = len(list(builder.block.instructions))
    em.floordiv(x, em.constant(-1.5, dt.float64))
    divmod_ops = _float_ops("\n".join(str(i) for i in list(builder.block.instructions)[before:]))
    assert divmod_ops and not any("contract" in op or "reassoc" in op for op in divmod_ops), divmod_ops
    em.exp(x)
    em.pow(x, x)
    routines = [f for f in module.functions if f.name.startswith("kiln.math.")]
    assert {f.name for f in routines} >= {"kiln.math.exp.f64", "kiln.math.pow.f64"}
    for routine in routines:
        assert not any("contract" in op or "reassoc" in op for op in _float_ops(str(routine))), routine.name
    assert "fadd contract double" in str(em.add(x, x).value)


def test_float_max_reductions_use_llvm_maximum_and_integer_ones_the_shared_step():
    module, builder = _function()
    em = LLVMEmitter(builder)
    acc, x = em.constant(1.0, dt.float32), em.constant(2.0, dt.float32)
    assert "llvm.maximum.f32" in str(em.combine("max", acc, x).value)
    assert "fadd reassoc contract float" in str(em.combine("add", acc, x).value)
    i, j = em.constant(1, dt.int32), em.constant(2, dt.int32)
    step = em.combine("max", i, j)
    assert step.dtype is dt.int32 and "select" in str(step.value) and "icmp sgt" in str(module)
