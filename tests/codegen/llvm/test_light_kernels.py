"""What LLVM is spared: kernels of little work are optimized lightly (no loop unrolling: about half
LLVM's time), larger ones and symbolic ones fully, and no loop around a long loop is unrolled;
either way the compiled code computes the same, and compiled results equal eager's over several
calls, in this process and in the compile worker."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llvmlite import ir

import kiln
from kiln.codegen.llvm import backend, engine, kernel_modules, loops, worker
from kiln.codegen.llvm.kernel_info import KernelInfo
from kiln.ir.types import Sym

# A loop of 8 trips with a dependence from one trip to the next: the vectorizer cannot widen it,
# so only the unroller changes it (it unrolls it fully).
RECURRENCE = """
define void @recur(ptr %p) {
entry:
  br label %loop
loop:
  %i = phi i64 [1, %entry], [%next, %loop]
  %before = sub i64 %i, 1
  %a = getelementptr inbounds double, ptr %p, i64 %before
  %b = getelementptr inbounds double, ptr %p, i64 %i
  %x = load double, ptr %a
  %y = fmul double %x, 3.0
  %z = fadd double %y, 1.0
  store double %z, ptr %b
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, 8
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def _run_recurrence(objects: list[bytes]) -> np.ndarray:
    library = engine.Library(objects)
    values = np.zeros(8, dtype=np.float64)
    values[0] = 0.5
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(library.address("recur"))(values.ctypes.data)
    return values


def test_a_light_module_keeps_its_loop_and_computes_the_same():
    full = engine.assembly(RECURRENCE)
    light = engine.assembly(engine.LIGHT + RECURRENCE)
    assert full != light
    if engine.triple().startswith("x86_64"):  # unrolled fully, the loop has no branch back; light, it keeps one
        assert full.count("\tj") < light.count("\tj")
    expected = [0.5]
    for _ in range(7):
        expected.append(expected[-1] * 3.0 + 1.0)
    for text in (RECURRENCE, engine.LIGHT + RECURRENCE):
        np.testing.assert_allclose(_run_recurrence([engine.compile_here(text)]), expected, rtol=1e-12)


def test_the_worker_optimizes_a_light_module_as_this_process_does(monkeypatch):
    fresh = worker.Worker()
    monkeypatch.setattr(worker, "WORKER", fresh)
    try:
        light = engine.LIGHT + RECURRENCE
        assert engine.compile_ir(light, timeout=60.0) == engine.compile_here(light)  # a limit: in the worker
        assert engine.compile_here(light) != engine.compile_here(RECURRENCE)
    finally:
        fresh.close()


def test_which_kernels_are_light():
    small, large = backend.LIGHT_BELOW_BYTES - 1, backend.LIGHT_BELOW_BYTES
    assert backend.light(KernelInfo("k", 4, small))
    assert not backend.light(KernelInfo("k", 4, large))
    # over a symbolic size the work is not known: the whole pipeline
    assert not backend.light(KernelInfo("k", 4, 0, symbols=(Sym("n"),), rows_per_size=1, bytes_per_size=8))


def _step(x, w):
    h = (x @ w).tanh() * 0.5 + x  # an elementwise kernel
    return h.sum(-1), (h * h).mean()  # reductions


@pytest.mark.parametrize("below", [0, 1 << 40])
def test_compiled_results_equal_eager_whichever_kernels_are_light(modules, monkeypatch, below):
    monkeypatch.setattr(backend, "LIGHT_BELOW_BYTES", below)
    monkeypatch.setattr(backend, "TINY_BELOW_BYTES", 0)  # tiny kernels: see test_tiny_kernels.py
    program = kiln.compile(_step)
    rng = np.random.default_rng(1)
    w = kiln.from_numpy(rng.standard_normal((16, 16)).astype(np.float32) * 0.2)
    for _ in range(3):
        x = kiln.from_numpy(rng.standard_normal((32, 16)).astype(np.float32))
        for ours, theirs in zip(program(x, w), _step(x, w), strict=True):
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    assert modules, "nothing was compiled"
    light = [text.startswith(engine.LIGHT) for text in modules]
    assert all(light) if below else not any(light)
    report = program.state.specializations[-1].report
    assert report.kernels == len(modules)
    # kiln.explain's timings split code generation: kiln's kernel code, then LLVM (and how many light)
    (code, code_s), (llvm, llvm_s) = report.generate_seconds
    assert code.startswith(f"kernel code ({len(modules)} distinct, 0 from the kernel cache)")
    grouped = len(kernel_modules.grouped(modules))  # several kernels to a module (engine.NEXT_MODULE)
    assert llvm == f"LLVM ({len(modules)} kernels in {grouped} modules, {len(modules) if below else 0} light, 0 tiny)"
    assert 0 < code_s + llvm_s <= dict(report.stage_seconds)["generate (llvm)"]
    assert any(line.startswith("code generation: kernel code") for line in report.describe())


def _row_sums(rows: int, length: int) -> str:
    """LLVM IR of ``row_sums(p, out)``: out[i] = sum of p[i * length : (i + 1) * length], two loops
    (the shape of a CNN's sum over a tensor's first and last axes, which LLVM unrolled 32 times over)."""
    module = ir.Module("row_sums")
    f32, ptr = ir.FloatType(), ir.PointerType()
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr]), "row_sums")
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    acc = builder.alloca(f32)
    p, out = function.args
    with loops.for_range(builder, 0, rows, name="i") as i:
        builder.store(f32(0.0), acc)
        with loops.for_range(builder, 0, length, name="j", parallel=True, interleave=4) as j:  # as reductions do
            at = builder.add(builder.mul(i, loops.i64(length)), j)
            value = builder.load(builder.gep(p, [at], inbounds=True, source_etype=f32), typ=f32)
            builder.store(builder.fadd(builder.load(acc, typ=f32), value, flags=("reassoc", "contract")), acc)
        builder.store(builder.load(acc, typ=f32), builder.gep(out, [i], inbounds=True, source_etype=f32))
    builder.ret_void()
    return str(module)


@pytest.mark.parametrize("length", [784, 8])
def test_a_loop_around_a_long_loop_is_not_unrolled_and_sums_the_same(monkeypatch, length):
    rows, long = 32, length >= loops.LONG_INNER
    text = _row_sums(rows, length)
    # loop properties on the inner loop's back edge (interleave, no unroll), and on the outer's when long
    assert text.count("!llvm.loop !") == (2 if long else 1)
    kept = engine.compile_here(text)
    monkeypatch.setattr(loops, "LONG_INNER", 1 << 40)  # as before: every outer loop unrollable
    unrollable = engine.compile_here(_row_sums(rows, length))
    if long:
        assert len(kept) < len(unrollable)  # not 32 copies of the inner loop
    else:
        assert kept == unrollable
    values = np.random.default_rng(0).standard_normal(rows * length).astype(np.float32)
    for objects in (kept, unrollable):
        library = engine.Library([objects])
        sums = np.zeros(rows, dtype=np.float32)
        call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(library.address("row_sums"))
        call(values.ctypes.data, sums.ctypes.data)
        np.testing.assert_allclose(sums, values.reshape(rows, length).sum(1), rtol=1e-5, atol=1e-5)
