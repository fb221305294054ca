"""Long programs and failing kernels: a fused chain of thousands of ops compiles with the LLVM
backend (no recursion, no interpreter fallback), a ResNet-shaped training step compiles and matches
eager over several calls, and a kernel the code generator or LLVM fails on runs on the interpreter
while the other kernels stay compiled. Timings are benchmarks/long_programs.py's business."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from benchmarks.long_programs import chain_program, specialization
from kiln.codegen.llvm import engine, kernel_cache, kernels, reduction
from kiln.compiler import program_cache
from kiln.ir.graph import KERNEL, GraphBuilder
from kiln.ir.types import TensorType
from kiln.passes.fusion import fuse
from kiln.passes.fusion_rules import MAX_KERNEL_NODES
from kiln.runtime.cache import DiskCache
from kiln.runtime.executor import CompiledProgram


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """Compile caches of this test's own (programs and kernels): code compiled with an injected failure
    is never shared, and no kernel compiled before skips the failure injected here."""
    cache, kernels = DiskCache(tmp_path / "cache"), DiskCache(tmp_path / "kernels")
    monkeypatch.setattr(program_cache, "disk_cache", lambda: cache)
    monkeypatch.setattr(kernel_cache, "kernel_cache", lambda: kernels)
    return cache


def _specialization(compiled):
    return compiled.state.specializations[-1]


def test_a_10000_node_chain_fuses_into_bounded_kernels_without_recursion():
    b = GraphBuilder()
    x = b.input(TensorType((8,), kiln.float32))
    v = x
    for i in range(10_000):
        v = b.node(("neg", "exp", "tanh", "abs")[i % 4], [v])
    fused = fuse(b.build([v]))
    sizes = [len(n.attrs["bodies"][0].nodes) for n in fused.nodes if n.op == KERNEL]
    assert sum(sizes) == 10_000 and max(sizes) <= MAX_KERNEL_NODES
    # the code generator walks a long body without recursion (the limit is far below its depth)
    module = kernels.KernelModule()
    for node in fused.nodes:
        module.add(node, [(1,)])
    assert "define void" in module.ir()


def test_a_long_chain_compiles_with_llvm_and_matches_eager(private_cache):
    step, eager = chain_program(1200)  # 3.5 kernels' worth: deeper than the recursion limit allowed
    for _ in range(3):
        np.testing.assert_allclose(step().numpy(), eager().numpy(), rtol=1e-5, atol=1e-6)
    spec = specialization(step)
    assert isinstance(spec.program, CompiledProgram)
    assert spec.report.declined == [] and spec.report.kernels >= 2


def _block(nn):
    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            out = nn.functional.relu(self.bn1(self.conv1(x)))
            return nn.functional.relu(self.bn2(self.conv2(out)) + x)

    return Block


def _resnet_step(seed: int = 0):
    nn = kiln.nn
    kiln.manual_seed(seed)
    block = _block(nn)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), block(4), block(4),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))  # fmt: skip
    rng = np.random.default_rng(seed)
    x = kiln.from_numpy(rng.standard_normal((2, 3, 6, 6), dtype=np.float32))
    y = kiln.from_numpy(rng.integers(0, 5, 2))
    optimizer = kiln.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return step, model


def test_a_resnet_shaped_training_step_compiles_and_matches_eager(private_cache):
    step, model = _resnet_step()
    compiled = kiln.compile(step)
    eager, reference = _resnet_step()
    ours = [compiled().numpy() for _ in range(4)]
    theirs = [eager().numpy() for _ in range(4)]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-6)
    spec = _specialization(compiled)
    assert isinstance(spec.program, CompiledProgram) and spec.report.declined == []


def _two_kernel_function():
    def fn(x, w):
        h = (x * 2.0 + 1.0).exp()  # an elementwise kernel
        return (h @ w).softmax(-1)  # matmul, then a reduction kernel

    rng = np.random.default_rng(0)
    return fn, [kiln.from_numpy(rng.standard_normal(s, dtype=np.float32)) for s in ((5, 7), (7, 3))]


def _check_one_kernel_on_the_interpreter(reason: str) -> None:
    fn, args = _two_kernel_function()
    compiled = kiln.compile(fn)
    for _ in range(3):
        np.testing.assert_allclose(compiled(*args).numpy(), fn(*args).numpy(), rtol=1e-5, atol=1e-6)
    report = _specialization(compiled).report
    assert len(report.declined) == 1 and reason in report.declined[0][1]
    assert report.kernels == 1  # the other kernel stays compiled


def test_a_kernel_the_code_generator_fails_on_runs_on_the_interpreter(private_cache, monkeypatch):
    def broken(*args, **kwargs):
        raise TypeError("an injected bug")

    monkeypatch.delenv("KILN_JIT_STRICT", raising=False)
    monkeypatch.setattr(reduction, "emit_reduction", broken)
    _check_one_kernel_on_the_interpreter("the LLVM code generator failed (TypeError: an injected bug)")


def test_a_kernel_llvm_fails_on_runs_on_the_interpreter(private_cache, monkeypatch):
    compile_many, requests = engine.compile_many, []

    def failing_many(texts: list[str], timeout: float | None = None) -> list[bytes]:
        """Every compile (compile_ir is one of a single module) fails on the softmax kernel."""
        requests.append(len(texts))
        if any("llvm.maximum" in text for text in texts):  # only the softmax kernel reduces with a maximum
            raise RuntimeError("LLVM ERROR: an injected failure")
        return compile_many(texts, timeout)

    monkeypatch.delenv("KILN_JIT_STRICT", raising=False)
    monkeypatch.setattr(engine, "compile_many", failing_many)
    _check_one_kernel_on_the_interpreter("LLVM failed on its code (RuntimeError: LLVM ERROR: an injected failure)")
    # both kernels' modules in one request (a busy machine) or each as it was generated (an idle core:
    # the second may not be sent once the first failed), then each kernel alone
    assert requests[-2:] == [1, 1] and requests[:-2] in ([2], [1], [1, 1])


def test_a_failing_kernel_still_raises_under_strict_mode(private_cache, monkeypatch):
    monkeypatch.setenv("KILN_JIT_STRICT", "1")
    monkeypatch.setattr(reduction, "emit_reduction", lambda *a, **k: 1 / 0)
    fn, args = _two_kernel_function()
    with pytest.raises(ZeroDivisionError):
        kiln.compile(fn)(*args)
