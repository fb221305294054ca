"""LLVM compiles a program's first modules while the generator makes the rest (``compile_stream``):
the objects come back in order and equal in-process compiles, a module LLVM fails on still sends the
program's kernels to LLVM one by one (the failing one runs on the interpreter), a compile past its
deadline is still abandoned, and the generator's modules are cut by ``kernel_modules.Modules``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import engine, kernel_modules, worker, worker_pool
from kiln.codegen.llvm.compile_stream import CompileStream
from tests.codegen.llvm.test_deadline import _endless_ir


def _module(i: int) -> str:
    return f"define double @f{i}(double %x) {{\nentry:\n  %y = fmul double %x, {i + 1}.0\n  ret double %y\n}}\n"


@pytest.fixture(params=[1, 2], ids=["one thread", "two threads"])
def workers(request, monkeypatch):
    """Fresh WORKER and SPARE on a machine with an idle core, and how many threads a stream compiles on."""
    first, spare = worker.Worker(), worker.Worker()
    monkeypatch.setattr(worker, "WORKER", first)
    monkeypatch.setattr(worker, "SPARE", spare)
    monkeypatch.setattr(worker_pool, "_idle_core", lambda: True)
    yield first, spare, request.param
    first.close()
    spare.close()


def test_modules_compile_in_order_as_they_are_submitted(workers):
    first, spare, threads = workers
    stream = CompileStream(timeout=60.0, threads=threads)
    texts = [_module(i) for i in range(7)]
    for text in texts:
        stream.submit(text)
    assert stream.finish() == [engine.compile_here(text) for text in texts]
    assert first._compiles + spare._compiles == len(texts)  # each module once, in a worker (a time limit)
    assert (spare._compiles > 0) == (threads == 2)
    assert not first.busy and not spare.busy


def test_an_llvm_error_is_raised_by_finish_and_later_modules_are_not_compiled(workers, monkeypatch):
    compile_many, requests = engine.compile_many, []

    def failing(texts, timeout=None):
        requests.extend(texts)
        if "@f1(" in texts[0]:
            raise RuntimeError("LLVM ERROR: an injected failure")
        return compile_many(texts, timeout)

    monkeypatch.setattr(engine, "compile_many", failing)
    stream = CompileStream(timeout=60.0, threads=1)  # one thread: the order of the requests is known
    for i in range(4):
        stream.submit(_module(i))
    with pytest.raises(RuntimeError, match="an injected failure"):
        stream.finish()
    assert len(requests) == 2  # the module after the failing one never went to LLVM


def test_a_module_past_the_deadline_is_abandoned_and_the_workers_are_released(workers):
    first, spare, threads = workers
    stream = CompileStream(timeout=1.0, threads=threads)
    stream.submit(_module(0))
    stream.submit(_endless_ir())
    with pytest.raises(worker.CompileTimeout):
        stream.finish()
    assert not first.busy and not spare.busy
    assert engine.compile_many([_module(3)], 30.0) == [engine.compile_here(_module(3))]  # a new worker serves


def test_a_cancelled_stream_compiles_nothing_more(workers, monkeypatch):
    compile_many, requests, cancelled = engine.compile_many, [], threading.Event()

    def waiting(texts, timeout=None):
        requests.extend(texts)
        cancelled.wait(30)
        return compile_many(texts, timeout)

    monkeypatch.setattr(engine, "compile_many", waiting)
    stream = CompileStream(timeout=60.0, threads=1)
    for i in range(3):
        stream.submit(_module(i))
    stream.cancel()  # the generator raised while the first module compiles
    cancelled.set()
    for thread in stream._threads:
        thread.join(30)
    assert requests == [_module(0)]  # the module under way finished; the others never went to LLVM
    assert not any(w.busy for w in workers[:2])


def test_kernels_go_to_a_module_as_soon_as_it_is_full():
    light = engine.LIGHT + "x" * 1000  # 2.5 ms of LLVM, roughly
    modules = kernel_modules.Modules(first_alone=True)
    sent = [modules.add(k, light) for k in range(kernel_modules.KERNELS_PER_MODULE + 3)]
    assert sent[0] == [0]  # the first kernel alone: LLVM starts on it while the rest is generated
    assert sent[kernel_modules.KERNELS_PER_MODULE] == list(range(1, kernel_modules.KERNELS_PER_MODULE + 1))
    assert sum(group is not None for group in sent) == 2
    big = engine.LIGHT + "y" * int(kernel_modules.MODULE_MS / 2.5 * 1000)  # a whole module's worth alone
    assert modules.add(20, big) == [9, 10, 20]  # the tier's open module is full by LLVM's time
    assert modules.add(21, engine.TINY + "z") is None
    assert modules.add(22, light) is None
    assert modules.add(23, light) is None
    assert modules.rest() == [[22], [23], [21]]  # two light modules (one per worker), costlier than the tiny
    assert modules.rest() == []


def _step(x, w, b):
    h = (x @ w + b).relu() * 0.5 + x.tanh()
    scale = (b * b).sum().sqrt() + 1.0
    return (h * h).mean(-1) / scale, h.max(0).values, b * 0.9 - scale, (x - 1.0).exp().sum(0), (x * w[0]).sum(-1)


def _arrays(rng):
    w = kiln.from_numpy(rng.standard_normal((16, 16)).astype(np.float32) * 0.3)
    b = kiln.from_numpy(rng.standard_normal(16).astype(np.float32))
    return w, b


def _check(program, rng, w, b):
    for _ in range(2):
        x = kiln.from_numpy(rng.standard_normal((8, 16)).astype(np.float32))
        for ours, theirs in zip(program(x, w, b), _step(x, w, b), strict=True):
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-5)


def _events(monkeypatch) -> list[str]:
    """``"sent"`` for each module sent to a stream, ``"generated"`` for each kernel, in order."""
    from kiln.codegen.llvm import kernels

    events: list[str] = []
    submit, add = CompileStream.submit, kernels.KernelModule.add
    monkeypatch.setattr(CompileStream, "submit", lambda self, text: events.append("sent") or submit(self, text))
    monkeypatch.setattr(kernels.KernelModule, "add", lambda self, *a: events.append("generated") or add(self, *a))
    monkeypatch.setattr(kernel_modules, "MODULE_MS", 0.0)  # each kernel a module of its own
    return events


def test_llvm_starts_before_the_last_kernel_is_generated_where_a_core_is_idle(caches, monkeypatch):
    events = _events(monkeypatch)
    monkeypatch.setattr(worker_pool, "_idle_core", lambda: True)
    rng = np.random.default_rng(3)
    w, b = _arrays(rng)
    _check(kiln.compile(_step), rng, w, b)
    assert events.count("generated") >= 3
    assert events.index("sent") < len(events) - 1 - events[::-1].index("generated")


def test_on_a_busy_machine_every_module_goes_to_llvm_in_one_request_once_generated(caches, monkeypatch):
    events = _events(monkeypatch)
    monkeypatch.setattr(worker_pool, "_idle_core", lambda: False)
    compile_many, requests = engine.compile_many, []
    monkeypatch.setattr(
        engine,
        "compile_many",
        lambda texts, timeout=None: requests.append(events.count("generated")) or compile_many(texts, timeout),
    )
    rng = np.random.default_rng(3)
    w, b = _arrays(rng)
    _check(kiln.compile(_step), rng, w, b)
    assert "sent" not in events and requests == [events.count("generated")] and len(requests) == 1


@pytest.fixture
def streaming(monkeypatch):
    """A core idle and each kernel a module of its own: a program's modules go to LLVM as they are
    generated; ``streaming`` counts the modules sent so."""
    sent: list[str] = []
    submit = CompileStream.submit
    monkeypatch.setattr(CompileStream, "submit", lambda self, text: sent.append(text) or submit(self, text))
    monkeypatch.setattr(worker_pool, "_idle_core", lambda: True)
    monkeypatch.setattr(kernel_modules, "MODULE_MS", 0.0)
    return sent


def test_a_module_llvm_fails_on_sends_each_kernel_alone_and_only_that_one_runs_on_the_interpreter(
    caches, streaming, monkeypatch
):
    _, compiled = caches
    compile_many, requests = engine.compile_many, []

    def failing(texts, timeout=None):
        requests.append(len(texts))
        if any("llvm.sqrt" in text for text in texts):  # the kernel of the scale only
            raise RuntimeError("LLVM ERROR: an injected failure")
        return compile_many(texts, timeout)

    monkeypatch.delenv("KILN_JIT_STRICT", raising=False)
    monkeypatch.setattr(engine, "compile_many", failing)
    rng = np.random.default_rng(4)
    w, b = _arrays(rng)
    program = kiln.compile(_step)
    _check(program, rng, w, b)
    report = program.state.specializations[-1].report
    assert [why for _, why in report.declined] == [
        "LLVM failed on its code (RuntimeError: LLVM ERROR: an injected failure); a bug in kiln, please report it"
    ]
    assert report.kernels >= 3  # the others stay compiled
    alone = report.kernels + 1  # each kernel in a request of its own after the failure
    assert requests[-alone:] == [1] * alone
    assert streaming  # the modules went to LLVM while the program was generated


def test_past_the_deadline_a_compile_that_streams_is_abandoned_to_the_interpreter(caches, streaming, monkeypatch):
    monkeypatch.setenv("KILN_JIT_STRICT", "0")  # fall back, as outside the test suite
    rng = np.random.default_rng(6)
    w, b = _arrays(rng)
    program = kiln.compile(_step, options=kiln.CompileOptions(compile_timeout=1e-9))
    _check(program, rng, w, b)
    report = program.state.specializations[-1].report
    assert report.abandoned and report.kernels == 0 and streaming
    monkeypatch.setenv("KILN_JIT_STRICT", "1")
    x = kiln.from_numpy(rng.standard_normal((8, 16)).astype(np.float32))
    with pytest.raises(worker.CompileTimeout):  # strict mode raises instead
        kiln.compile(_step, options=kiln.CompileOptions(compile_timeout=1e-9))(x, w, b)


def _layers(x, ws):
    h = x
    for i, w in enumerate(ws):
        h = (h @ w).tanh() * (1.0 - 0.05 * i) + 0.1  # each layer's width its own: a kernel of its own
    return h.sum(-1)


def test_a_program_of_many_kernels_sends_its_first_kernel_to_llvm_alone(caches, monkeypatch):
    sent: list[str] = []
    submit = CompileStream.submit
    monkeypatch.setattr(CompileStream, "submit", lambda self, text: sent.append(text) or submit(self, text))
    monkeypatch.setattr(worker_pool, "_idle_core", lambda: True)
    rng = np.random.default_rng(6)
    widths = [8 + k for k in range(kernel_modules.KERNELS_PER_MODULE + 3)]
    ws = [kiln.from_numpy(rng.standard_normal((m, n)).astype(np.float32) * 0.3) for m, n in zip(widths, widths[1:])]
    program = kiln.compile(_layers)
    for _ in range(3):
        x = kiln.from_numpy(rng.standard_normal((4, widths[0])).astype(np.float32))
        np.testing.assert_allclose(program(x, ws).numpy(), _layers(x, ws).numpy(), rtol=1e-5, atol=1e-5)
    kernels = [text.count(engine.NEXT_MODULE) + 1 for text in sent]
    assert sum(kernels) == len(caches[1]) > kernel_modules.KERNELS_PER_MODULE  # each kernel sent once
    assert kernels[0] == 1 and max(kernels) > 1  # the first alone, the others several to a module


def test_modules_put_the_first_kernel_with_the_next_unless_asked():
    light = engine.LIGHT + "x" * 1000
    modules = kernel_modules.Modules()
    assert [modules.add(k, light) for k in range(2)] == [None, None]
    assert modules.rest() == [[0], [1]]  # two light modules, one per worker
