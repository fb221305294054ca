"""Background compiles in the program worker (``kiln.compiler.program_worker``).

A background compile's passes and code generation run in a process of their own; the compile
thread loads the program as a disk-cache hit does. Each test compares the program with eager code
over several calls and with the same function compiled in this process (``wait=True``), and checks
where the compile ran: the worker (``report.worker``; the fusion pass never ran here) or, when the
worker cannot serve, the thread.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.compiler import driver, program_cache, program_worker
from kiln.runtime.cache import DiskCache

from .helpers import array, compiled_calls, state_of

RTOL, ATOL = 1e-5, 1e-6
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A disk cache of this test's own, so no earlier test's entry answers its compiles."""
    cache = DiskCache(tmp_path / "cache")
    monkeypatch.setattr(program_cache, "disk_cache", lambda: cache)
    return cache


@pytest.fixture
def fused_here(monkeypatch):
    """How many times this process ran the fusion pass."""
    runs = []
    original = driver.fuse

    def counted(*args, **kwargs):
        runs.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(driver, "fuse", counted)
    return runs


def _mlp():
    kiln.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _cnn():
    kiln.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def _step_of(model):
    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    return step


def _batches(shape, out, n=6):
    rng = np.random.default_rng(1)
    return [(kiln.tensor(rng.standard_normal(shape).astype(np.float32)),
             kiln.tensor(rng.standard_normal((shape[0], out)).astype(np.float32))) for _ in range(n)]  # fmt: skip


def _train(make, batches, **options):
    """Losses and final parameters of a training run of ``make()``'s model, its step compiled with
    ``options`` (none: eager); the step's compiled function too."""
    model = make()
    step = _step_of(model)
    run = step if not options else kiln.compile(step, **options)
    losses = []
    for i, (x, y) in enumerate(batches):
        losses.append(array(run(x, y)).item())
        if i == 0 and options.get("wait") is False:
            assert run.wait_compiled(120)  # the later calls run the program
    return losses, [array(p).copy() for p in model.parameters()], run


@pytest.mark.parametrize("make, shape, out", [(_mlp, (5, 8), 4), (_cnn, (3, 2, 6, 6), 3)], ids=["mlp", "cnn"])
def test_a_step_compiled_in_the_worker_matches_eager_and_the_program_compiled_here(make, shape, out, fresh_cache,
                                                                                 fused_here, monkeypatch):  # fmt: skip
    batches = _batches(shape, out)
    eager_losses, eager_params, _ = _train(make, batches)
    losses, params, step = _train(make, batches, wait=False)
    spec = state_of(step).specializations[0]
    assert spec.report.worker, "the background compile ran in the program worker"
    assert fused_here == [], "the passes ran in the worker, not in this process"
    assert compiled_calls(step) == [len(batches) - 1]
    np.testing.assert_allclose(losses, eager_losses, rtol=RTOL, atol=ATOL)
    for got, want in zip(params, eager_params, strict=True):  # the parameters the step updated in place
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    monkeypatch.setattr(program_cache, "disk_cache", lambda: DiskCache(fresh_cache.directory / "here"))
    here_losses, _, here = _train(make, batches, wait=True)
    here_spec = state_of(here).specializations[0]
    assert not here_spec.report.worker and fused_here, "a compile the caller waits for runs in its process"
    assert str(spec.graph) == str(here_spec.graph), "the same fused program"
    np.testing.assert_allclose(losses, here_losses, rtol=RTOL, atol=ATOL)


def test_gradients_through_a_result_of_a_program_compiled_in_the_worker(fresh_cache, fused_here):
    def f(x, w):
        return (x @ w).tanh() * 3

    g = kiln.compile(f, wait=False)
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    for i in range(4):
        x = kiln.tensor(rng.standard_normal((5, 4)).astype(np.float32))
        w, w_eager = kiln.tensor(w0, requires_grad=True), kiln.tensor(w0, requires_grad=True)
        out, expected = g(x, w), f(x, w_eager)
        out.sum().backward()
        expected.sum().backward()
        np.testing.assert_allclose(array(out), array(expected), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(array(w.grad), array(w_eager.grad), rtol=RTOL, atol=ATOL)
        if i == 0:
            assert g.wait_compiled(120)
    spec = state_of(g).specializations[0]
    assert spec.report.worker and compiled_calls(g) == [3]
    assert fused_here == [], "the forward and the backward program compiled in the worker"


def test_a_worker_that_dies_mid_compile_leaves_the_compile_to_the_thread_and_is_replaced(fresh_cache, monkeypatch,
                                                                                        caplog):  # fmt: skip
    program_worker.start_soon()
    started = program_worker.WORKER.started
    monkeypatch.setattr(program_worker, "_sent", lambda process: process.kill())
    caplog.set_level(logging.DEBUG, logger="kiln")

    def f(x):
        return (x * 2).exp().sum(0)

    g = kiln.compile(f, wait=False)
    xs = [kiln.tensor(np.full((3, 2), i / 4, np.float32)) for i in range(4)]
    g(xs[0])
    assert g.wait_compiled(120)
    for x in xs[1:]:
        np.testing.assert_allclose(array(g(x)), array(f(x)), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [3] and not state_of(g).specializations[0].report.worker
    assert "the program worker ended while compiling" in caplog.text
    monkeypatch.setattr(program_worker, "_sent", lambda process: None)
    h = kiln.compile(lambda x: (x - 1).abs() * 3, wait=False)
    h(xs[1])
    assert h.wait_compiled(120)
    assert state_of(h).specializations[0].report.worker, "a later compile started a new worker"
    assert program_worker.WORKER.started == started + 1
    np.testing.assert_allclose(array(h(xs[2])), np.abs(array(xs[2]) - 1) * 3, rtol=RTOL, atol=ATOL)


def test_a_worker_that_cannot_start_leaves_compiles_to_the_thread_said_once(fresh_cache, monkeypatch, caplog):
    monkeypatch.setattr(program_worker, "WORKER", program_worker.Worker())
    monkeypatch.setattr(program_worker, "_start", lambda: subprocess.Popen(
        [sys.executable, "-c", "raise SystemExit(1)"], stdin=subprocess.PIPE, stdout=subprocess.PIPE))  # fmt: skip
    caplog.set_level(logging.DEBUG, logger="kiln")
    x = kiln.tensor(np.linspace(-1, 1, 6, dtype=np.float32))
    for fn in (lambda x: x.sin() + 1, lambda x: x.cos() * 2):
        g = kiln.compile(fn, wait=False)
        g(x)
        assert g.wait_compiled(120)
        np.testing.assert_allclose(array(g(x)), array(fn(x)), rtol=RTOL, atol=ATOL)
        assert compiled_calls(g) == [1] and not state_of(g).specializations[0].report.worker
    assert program_worker.WORKER.broken
    assert caplog.text.count("no program worker") == 1, caplog.text


def test_the_entry_a_background_compile_writes_is_hit_by_a_second_process(tmp_path):
    # The working directory holds a module named as one the compiler imports: the worker must not
    # import the user's files (its path starts at kiln's folder, not the working directory).
    (tmp_path / "safetensors.py").write_text("raise ImportError('the user's safetensors.py was imported')\n")
    (tmp_path / "user").mkdir()
    script = tmp_path / "user" / "second.py"
    script.write_text(
        textwrap.dedent("""
        import sys
        import numpy as np
        import kiln
        from kiln.frontend.jit.call_cache import CompiledFunction

        def f(x):
            return (x * x + 1).log().sum(1)

        g = kiln.compile(f, wait=sys.argv[1] == "wait")
        x = kiln.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
        g(x)
        assert g.wait_compiled(120)
        report = g.state.specializations[0].report
        print(report.cache, report.worker, np.asarray(g(x).numpy()).round(4).tolist())
    """)
    )
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}

    def run(mode: str) -> list[str]:
        done = subprocess.run([sys.executable, str(script), mode], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=180)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.split(maxsplit=2)

    first, second = run("background"), run("wait")
    assert first[:2] == ["miss", "True"], "compiled in the worker, its entry written"
    assert second[:2] == ["hit", "False"], "the second process loaded that entry"
    assert first[2] == second[2]


@pytest.fixture
def eager_kernels_on(monkeypatch):
    """Eager kernels on, compiling in the background (the suite runs with them off), an empty cache."""
    from kiln.frontend import eager_kernels

    monkeypatch.setattr(eager_kernels.CACHE, "synchronous", False)
    eager_kernels.CACHE.clear()
    eager_kernels.set_enabled(True)
    yield eager_kernels
    eager_kernels.set_enabled(False)
    eager_kernels.CACHE.clear()


def _ready_worker() -> None:
    """A program compiled in the background: the worker is ready (its ``ok`` was read)."""
    g = kiln.compile(lambda x: x * 3 - 1, wait=False)
    g(kiln.ones(2, 3))
    assert g.wait_compiled(120) and state_of(g).specializations[0].report.worker
    assert program_worker.WORKER.ready


def _compiled_kernels(eager_kernels) -> int:
    assert eager_kernels.CACHE.wait(120)
    return sum(e.program is not None for e in eager_kernels.CACHE.entries.values())


def test_eager_kernels_compile_in_a_ready_worker_and_never_wait_for_a_busy_one(fresh_cache, eager_kernels_on,
                                                                              fused_here):  # fmt: skip
    _ready_worker()
    x = kiln.tensor(np.random.default_rng(3).standard_normal((64, 128)).astype(np.float32))
    np.testing.assert_allclose(array(x.tanh() * 2), np.tanh(x.numpy()) * 2, rtol=1e-5, atol=1e-6)
    assert _compiled_kernels(eager_kernels_on) > 0 and fused_here == [], "compiled in the worker"
    np.testing.assert_allclose(array(x.tanh() * 2), np.tanh(x.numpy()) * 2, rtol=1e-5, atol=1e-6)
    before = _compiled_kernels(eager_kernels_on)
    with program_worker.WORKER.lock:  # as a program's compile holds it
        np.testing.assert_allclose(array(x.exp() + 1), np.exp(x.numpy()) + 1, rtol=1e-5, atol=1e-6)
        assert _compiled_kernels(eager_kernels_on) > before, "compiled meanwhile, not after the program"
    assert fused_here, "on its thread"


def test_a_worker_past_the_deadline_is_stopped_and_the_compile_ends_as_one_past_it_here(fresh_cache, monkeypatch,
                                                                                       caplog):  # fmt: skip
    import signal

    monkeypatch.setenv("KILN_JIT_STRICT", "0")  # fall back, as outside the test suite
    program_worker.start_soon()
    started = program_worker.WORKER.started
    monkeypatch.setattr(program_worker, "_sent", lambda process: process.send_signal(signal.SIGSTOP))
    caplog.set_level(logging.DEBUG, logger="kiln")

    def f(x):
        return (x * 2 + 1).exp().sum(-1)

    g = kiln.compile(f, options=kiln.CompileOptions(wait=False, compile_timeout=0.5))
    x = kiln.tensor(np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32))
    g(x)
    assert g.wait_compiled(120)
    for _ in range(2):
        np.testing.assert_allclose(array(g(x)), array(f(x)), rtol=1e-6)
    report = state_of(g).specializations[0].report
    assert report.abandoned and not report.worker, "past its deadline, as a compile here would be"
    assert "ran past the compile's deadline" in caplog.text
    monkeypatch.setattr(program_worker, "_sent", lambda process: None)
    program_worker.start_soon()
    assert program_worker.WORKER.started == started + 1, "the stopped worker was replaced"


def test_decorating_never_waits_for_a_compile_in_the_worker_and_a_forked_child_has_a_worker_of_its_own():
    worker = program_worker.WORKER
    with worker.lock:  # as a compile in the worker holds it
        done = threading.Event()
        threading.Thread(target=lambda: (kiln.compile(lambda x: x + 1, wait=False), done.set()), daemon=True).start()
        assert done.wait(10), "kiln.compile waited for the worker's lock"
        pid = os.fork()
        if pid == 0:  # the child: the lock its parent holds is not its worker's
            ok = program_worker.WORKER is not worker and program_worker.WORKER.lock.acquire(timeout=5)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_warmed_up_worker_imports_nothing_more_for_its_first_compile(tmp_path):
    """``program_worker.warm_up`` (run once the worker said it is ready) imports what a first
    compile of elementwise and reduction kernels would: the code generator, llvmlite and LLVM."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import kiln
        from kiln.compiler import program_worker
        program_worker.warm_up()
        before = set(sys.modules)
        x = kiln.from_numpy(np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(4, 6))
        step = kiln.compile(lambda t: ((t * 2.0).tanh() + t.exp()).sum(-1) / (t * t).sum(), wait=True)
        got, want = step(x).numpy(), ((x * 2.0).tanh() + x.exp()).sum(-1).numpy() / (x * x).sum().numpy()
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)
        assert step.state.specializations[-1].report.kernels > 0
        print(sorted(m for m in set(sys.modules) - before if m.startswith(("kiln.codegen", "llvmlite"))))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_PROGRAM_WORKER="0")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
