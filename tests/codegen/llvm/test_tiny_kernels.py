"""Kernels of almost no work are compiled as cheaply as LLVM can (two cleanup passes, the fast
instruction selector): the same results as the whole pipeline's code, in this process and in the
compile worker, loaded by kiln's own ELF loader, and compiled programs equal eager over several calls."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import backend, engine, worker
from kiln.codegen.llvm.kernel_info import KernelInfo
from kiln.ir.types import Sym
from kiln.runtime import elf

# y[i] = x[i] * 3 + 1 over 8 doubles, with the redundant index arithmetic kiln's generator emits
SCALE = """
define void @scale(ptr %x, ptr %y) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %zero = mul nsw i64 0, 16
  %at = add nsw i64 %zero, %i
  %a = getelementptr inbounds double, ptr %x, i64 %at
  %v = load double, ptr %a
  %m = fmul double %v, 3.0
  %r = fadd double %m, 1.0
  %b = getelementptr inbounds double, ptr %y, i64 %at
  store double %r, ptr %b
  %next = add nsw i64 %i, 1
  %done = icmp eq i64 %next, 8
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def _scale(objects: list[bytes], loaded_by) -> np.ndarray:
    library = loaded_by(objects)
    x = np.arange(8, dtype=np.float64) - 2.5
    y = np.zeros(8, dtype=np.float64)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(library.address("scale"))(x.ctypes.data, y.ctypes.data)
    return y


def test_a_tiny_module_is_compiled_cheaply_and_computes_the_same():
    tiny, full = engine.compile_here(engine.TINY + SCALE), engine.compile_here(SCALE)
    assert tiny != full  # another code generator made it
    expected = (np.arange(8) - 2.5) * 3.0 + 1.0
    loaders = [engine.Library] + ([elf.LoadedObjects] if elf.supported() else [])
    for loaded_by in loaders:  # a cache hit loads it without LLVM, by kiln's ELF loader
        for objects in ([tiny], [full], [tiny, engine.compile_here(engine.LIGHT + SCALE.replace("@scale", "@s2"))]):
            np.testing.assert_allclose(_scale(objects, loaded_by), expected, rtol=1e-12)


def test_the_worker_compiles_a_tiny_module_as_this_process_does(monkeypatch):
    fresh = worker.Worker()
    monkeypatch.setattr(worker, "WORKER", fresh)
    try:
        tiny = engine.TINY + SCALE
        assert engine.compile_ir(tiny, timeout=60.0) == engine.compile_here(tiny)  # a limit: in the worker
    finally:
        fresh.close()


def test_which_kernels_are_tiny():
    small, large = backend.TINY_BELOW_BYTES - 1, backend.TINY_BELOW_BYTES
    assert backend.tiny(KernelInfo("k", 4, small)) and backend.light(KernelInfo("k", 4, small))
    assert not backend.tiny(KernelInfo("k", 4, large)) and backend.light(KernelInfo("k", 4, large))
    # over a symbolic size the work is not known: the whole pipeline
    assert not backend.tiny(KernelInfo("k", 4, 0, symbols=(Sym("n"),), rows_per_size=1, bytes_per_size=8))
    assert backend.TINY_BELOW_BYTES <= backend.LIGHT_BELOW_BYTES


def _step(x, w, b):
    h = (x @ w + b).tanh() * 0.5 + x  # a kernel over the whole batch
    scale = (b * b).sum().sqrt() + 1.0  # kernels over a few elements: an optimizer's scalars
    return h.sum(-1) / scale, (h * h).mean(), b * 0.9 - scale


TINY_BELOW_BYTES = backend.TINY_BELOW_BYTES


@pytest.mark.parametrize("below", [0, TINY_BELOW_BYTES, 1 << 40])
def test_compiled_results_equal_eager_whichever_kernels_are_tiny(modules, monkeypatch, below):
    monkeypatch.setattr(backend, "TINY_BELOW_BYTES", below)
    program = kiln.compile(_step)
    rng = np.random.default_rng(2)
    w = kiln.from_numpy(rng.standard_normal((16, 16)).astype(np.float32) * 0.2)
    b = kiln.from_numpy(rng.standard_normal(16).astype(np.float32))
    for _ in range(3):
        x = kiln.from_numpy(rng.standard_normal((64, 16)).astype(np.float32))
        for ours, theirs in zip(program(x, w, b), _step(x, w, b), strict=True):
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-5)
    tiny = sum(text.startswith(engine.TINY) for text in modules)
    if below == 0:
        assert tiny == 0
    elif below == TINY_BELOW_BYTES:  # the scalar kernels, not the batch's
        assert 0 < tiny < len(modules)
    else:  # all but the kernels calling kiln's math routines (tanh)
        assert 0 < tiny == sum("kiln.math." not in text for text in modules) < len(modules)
    _, (llvm, _) = program.state.specializations[-1].report.generate_seconds
    assert llvm.endswith(f", {tiny} tiny)")


def test_a_kernel_calling_a_math_routine_is_tiny_only_over_a_few_elements():
    small, few, many = KernelInfo("k", 4, backend.TINY_BELOW_BYTES - 1), backend.TINY_MATH_ELEMENTS, 64
    assert backend._tier_line(small, "define void @k() {...}", many) == engine.TINY
    calls_exp = 'define void @k() {... call float @"kiln.math.exp.f32"(float %x) ...}'
    assert backend._tier_line(small, calls_exp, many) == engine.LIGHT  # unoptimized, each call costs much more
    assert backend._tier_line(small, calls_exp, few) == engine.TINY  # a scalar's pow: LLVM's time is the cost
    assert backend._tier_line(KernelInfo("k", 4, backend.LIGHT_BELOW_BYTES), calls_exp, 1) == ""


def _scalars(step, b):
    loss = (b * b).sum()
    return b * step.pow(0.9), loss.exp() + 1.0  # Adam's bias correction, a loss's exp: one element each


def test_a_scalar_kernel_calling_a_math_routine_is_tiny_and_computes_the_same(modules):
    program = kiln.compile(_scalars)
    rng = np.random.default_rng(4)
    b = kiln.from_numpy(rng.standard_normal(8).astype(np.float32) * 0.3)
    for k in range(1, 4):
        step = kiln.from_numpy(np.array(k + 0.5, dtype=np.float32))
        for ours, theirs in zip(program(step, b), _scalars(step, b), strict=True):
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)
    assert any(text.startswith(engine.TINY) and "kiln.math." in text for text in modules)
