"""Kernels of little work are optimized lightly (no loop unrolling: about half LLVM's time), larger
ones and symbolic ones fully; either way the compiled results equal eager's over several calls, in
this process and in the compile worker."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import backend, engine, kernel_cache, worker
from kiln.codegen.llvm.kernel_info import KernelInfo
from kiln.compiler import program_cache
from kiln.ir.types import Sym
from kiln.runtime.cache import DiskCache

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


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Caches of this test's own (the program cache off) and the modules LLVM is asked to compile."""
    programs = DiskCache(tmp_path / "programs")
    programs.enabled = False
    kernels = DiskCache(tmp_path / "kernels")
    monkeypatch.setattr(program_cache, "disk_cache", lambda: programs)
    monkeypatch.setattr(kernel_cache, "kernel_cache", lambda: kernels)
    compile_many, compiled = engine.compile_many, []

    def counted(texts, timeout=None):
        compiled.extend(texts)
        return compile_many(texts, timeout)

    monkeypatch.setattr(engine, "compile_many", counted)
    return compiled


def _step(x, w):
    h = (x @ w).tanh() * 0.5 + x  # an elementwise kernel
    return h.sum(-1), (h * h).mean()  # reductions


@pytest.mark.parametrize("below", [0, 1 << 40])
def test_compiled_results_equal_eager_whichever_kernels_are_light(modules, monkeypatch, below):
    monkeypatch.setattr(backend, "LIGHT_BELOW_BYTES", below)
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
    assert llvm == f"LLVM ({len(modules)} modules, {len(modules) if below else 0} light)"
    assert 0 < code_s + llvm_s <= dict(report.stage_seconds)["generate (llvm)"]
    assert any(line.startswith("code generation: kernel code") for line in report.describe())
