"""Compiling in the background (``kiln.compile``'s default; the suite waits, see conftest.py).

A traced call returns its eager result at once; its program compiles on a daemon thread; calls of
that key run eagerly until it is ready, then run it. Every test compares with eager code over
calls made before, during and after the switch. A compile held back by an event (``_hold``)
makes "during" certain, whatever the machine's speed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import kiln
from kiln.frontend.jit import build, call_cache

from .helpers import array, compiled_calls, state_of

RTOL, ATOL = 1e-5, 1e-6


def background(fn, **options):
    return kiln.compile(fn, options=kiln.CompileOptions(wait=False, **options))


@pytest.fixture
def hold(monkeypatch):
    """An event that each background compile waits for before it starts."""
    release = threading.Event()
    original = build.PendingSpecialization.compile

    def held(self):
        assert release.wait(60), "the test never released the compile"
        return original(self)

    monkeypatch.setattr(build.PendingSpecialization, "compile", held)
    yield release
    release.set()


def test_the_default_is_to_compile_in_the_background(monkeypatch):
    monkeypatch.delenv("KILN_COMPILE_WAIT", raising=False)
    assert kiln.CompileOptions().wait is False
    monkeypatch.setenv("KILN_COMPILE_WAIT", "1")
    assert kiln.CompileOptions().wait is True
    assert kiln.compile(lambda x: x, wait=False).options.wait is False
    assert kiln.compile(lambda x: x, options=kiln.CompileOptions(recompile_limit=3), wait=False).options == \
        kiln.CompileOptions(recompile_limit=3, wait=False)  # fmt: skip
    monkeypatch.setenv("KILN_COMPILE_WAIT", "sometimes")
    with pytest.raises(ValueError, match="KILN_COMPILE_WAIT must be 1 .* or 0 .*got 'sometimes'"):
        kiln.CompileOptions()
    with pytest.raises(TypeError, match="wait must be True or False, got 'yes'"):
        kiln.compile(lambda x: x, wait="yes")


def test_calls_run_eagerly_until_the_program_is_ready_then_run_it(hold):
    def f(x, w):
        return ((x @ w).tanh() * 2 + 1).sum(1)

    g = background(f)
    rng = np.random.default_rng(0)
    w = kiln.tensor(rng.standard_normal((6, 3)).astype(np.float32))
    xs = [kiln.tensor(rng.standard_normal((4, 6)).astype(np.float32)) for _ in range(6)]
    for x in xs[:3]:  # the traced call, then calls while the compile is held back
        np.testing.assert_allclose(array(g(x, w)), array(f(x, w)), rtol=RTOL, atol=ATOL)
    assert state_of(g).specializations == [] and len(state_of(g).pending) == 1
    hold.set()
    assert g.wait_compiled(60)
    for x in xs[3:]:
        np.testing.assert_allclose(array(g(x, w)), array(f(x, w)), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [3], "the program ran from the call after it was ready"
    assert [e.kind for e in state_of(g).events] == ["compiled"]


def test_mutated_arguments_and_captured_state_match_eager_across_the_switch(hold):
    def make():
        state = {"total": kiln.zeros(5), "calls": kiln.zeros(())}

        def step(x, out):
            out.mul_(0.5).add_(x)  # an argument changed in place
            state["total"].add_(x * 2)  # captured state changed in place
            state["calls"].add_(1)
            return out.sum() + state["total"].mean()

        return step, state

    eager_step, eager_state = make()
    step, state = make()
    g = background(step)
    out_e, out_c = kiln.ones(5), kiln.ones(5)
    for i in range(8):
        if i == 3:
            hold.set()
            g.wait_compiled(60)
        x = kiln.arange(5, dtype=kiln.float32) * (i + 1)
        np.testing.assert_allclose(array(g(x, out_c)), array(eager_step(x, out_e)), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(array(out_c), array(out_e), rtol=RTOL, atol=ATOL)
        for key in state:
            np.testing.assert_allclose(array(state[key]), array(eager_state[key]), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [5]


def test_a_training_step_and_gradients_match_eager_across_the_switch(hold):
    def make():
        kiln.manual_seed(3)
        model = kiln.nn.Sequential(kiln.nn.Linear(4, 8), kiln.nn.Tanh(), kiln.nn.Linear(8, 1))
        opt = kiln.optim.Adam(model.parameters(), lr=0.05)

        def step(x, y):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss.detach()

        return model, step

    (m_e, step_e), (m_c, step_c) = make(), make()
    g = background(step_c)
    rng = np.random.default_rng(1)
    for i in range(7):
        if i == 2:
            hold.set()
            g.wait_compiled(60)
        x = kiln.tensor(rng.standard_normal((16, 4)).astype(np.float32))
        y = kiln.tensor(rng.standard_normal((16, 1)).astype(np.float32))
        np.testing.assert_allclose(array(g(x, y)), array(step_e(x, y)), rtol=RTOL, atol=ATOL)
        for pc, pe in zip(m_c.parameters(), m_e.parameters(), strict=True):
            np.testing.assert_allclose(array(pc), array(pe), rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(array(pc.grad), array(pe.grad), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [5] and len(state_of(g).specializations) == 1


def test_gradients_through_a_result_match_eager_during_and_after(hold):
    w_c = kiln.tensor([0.5, -1.0, 2.0], requires_grad=True)
    w_e = kiln.tensor([0.5, -1.0, 2.0], requires_grad=True)

    def make(w):
        return lambda x: (x * w).sin().sum()

    g, f = background(make(w_c)), make(w_e)
    for i in range(5):
        if i == 2:
            hold.set()
            g.wait_compiled(60)
        x = kiln.tensor([1.0, 2.0, 3.0]) * (i + 1)
        g(x).backward()  # the first call's sets w.grad: no second trace (the call reads no .grad)
        f(x).backward()
        np.testing.assert_allclose(array(w_c.grad), array(w_e.grad), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [3]


def test_a_compile_that_fails_in_the_background_falls_back_saying_why(monkeypatch):
    monkeypatch.delenv("KILN_JIT_STRICT", raising=False)

    def broken(*args, **kwargs):
        raise RuntimeError("the code generator broke")

    monkeypatch.setattr(build, "compile_graph", broken)

    def f(x):
        return x * 2 + 1

    g = background(f)
    with pytest.warns(kiln.CompileWarning, match="the compile failed in the background .*code generator broke"):
        assert g(kiln.ones(3)).tolist() == [3.0, 3.0, 3.0]
        assert g.wait_compiled(60)
    for _ in range(3):  # eagerly, for good, and nothing is traced again
        assert g(kiln.ones(3)).tolist() == [3.0, 3.0, 3.0]
    assert state_of(g).specializations == [] and [e.kind for e in state_of(g).events] == ["break"]
    report = kiln.explain(g)
    assert "the compile failed in the background (RuntimeError: the code generator broke)" in report.breaks[0]


def test_a_failed_background_compile_raises_under_kiln_jit_strict(monkeypatch):
    monkeypatch.setenv("KILN_JIT_STRICT", "1")
    monkeypatch.setattr(build, "compile_graph", lambda *a, **k: 1 / 0)
    g = background(lambda x: x + 1)
    with pytest.warns(kiln.CompileWarning):
        g(kiln.ones(2))
        with pytest.raises(RuntimeError, match="a compile failed in the background") as raised:
            g.wait_compiled(60)
    assert isinstance(raised.value.__cause__, ZeroDivisionError)


def test_explain_says_compiling_in_the_background_then_ready(hold):
    g = background(lambda x: (x.exp() + 1).log().sum())
    g(kiln.ones(8))
    summary = kiln.explain(g).summary()
    assert "0 specialization(s)" in summary and "1 compiling in the background" in summary
    assert "Compiling in the background (those calls run eagerly until it is ready):" in summary
    assert "made because first call" in summary
    hold.set()
    summary = kiln.explain(g, kiln.ones(8)).summary()  # explain with arguments waits for the compile
    assert "1 specialization(s)" in summary and "compiling in the background" not in summary.lower()
    assert "compiled in the background: ready" in summary


def test_wait_compiled_waits_for_every_pending_compile(hold):
    fs = [background(lambda x, k=k: x * k) for k in range(3)]
    for f in fs:
        f(kiln.ones(2))
    assert kiln.jit.wait_compiled(0.05) is False  # still held back
    hold.set()
    assert kiln.jit.wait_compiled(60) is True
    assert all(len(state_of(f).specializations) == 1 for f in fs)
    assert [f(kiln.ones(2)).tolist() for f in fs] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    assert all(compiled_calls(f) == [1] for f in fs)


def test_pending_compiles_count_toward_the_recompile_limit(hold):
    g = background(lambda x: x + 1.0, recompile_limit=2)
    with pytest.warns(kiln.CompileWarning, match="limit of 2 specializations is reached"):
        for n in (1, 2, 3):
            assert g(kiln.ones(n)).tolist() == [2.0] * n
    assert len(state_of(g).pending) == 2
    hold.set()
    g.wait_compiled(60)
    assert len(state_of(g).specializations) == 2


def test_a_slow_background_compile_says_so_and_the_call_does_not_wait(monkeypatch, hold):
    monkeypatch.setattr(call_cache, "SLOW_COMPILE_SECONDS", 0.05)
    g = background(lambda x: (x * 3).sum())
    start = time.perf_counter()
    with pytest.warns(kiln.CompileWarning, match=r"compiling \S+ \(\d+ nodes\)\.\.\. .* in the background; calls run "
                      "eagerly until it is ready") as record:  # fmt: skip
        assert g(kiln.ones(4)).item() == 12.0  # the line the warning points at
        assert time.perf_counter() - start < 30, "the traced call waited for its compile"
        time.sleep(0.3)
        hold.set()
        g.wait_compiled(60)
    assert record[0].filename == __file__


def test_threads_calling_one_function_during_and_after_its_compile(hold):
    def f(x):
        return (x * x).sum(0) - x.mean()

    g = background(f)
    xs = [kiln.tensor(np.random.default_rng(i).standard_normal((5, 3)).astype(np.float32)) for i in range(4)]
    errors: list = []

    def work(i):
        try:
            for k in range(30):
                if k == 10 and i == 0:
                    hold.set()
                x = xs[(i + k) % len(xs)]
                np.testing.assert_allclose(array(g(x)), array(f(x)), rtol=RTOL, atol=ATOL)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    assert g.wait_compiled(60) and len(state_of(g).specializations) == 1
    np.testing.assert_allclose(array(g(xs[0])), array(f(xs[0])), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g)[0] >= 1


def test_the_process_exits_while_a_compile_is_pending(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text(
        textwrap.dedent("""
        import threading
        import kiln
        from kiln.frontend.jit import build

        build.PendingSpecialization.compile = lambda self: threading.Event().wait()  # never finishes
        f = kiln.compile(lambda x: x + 1, wait=False)
        print(f(kiln.ones(2)).tolist(), flush=True)
    """)
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    env.pop("KILN_COMPILE_WAIT", None)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[2.0, 2.0]"
    assert time.perf_counter() - start < 60


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_a_pending_key_eagerly_and_does_not_wait_for_it(hold):
    g = background(lambda x: x * 3)
    assert g(kiln.ones(2)).tolist() == [3.0, 3.0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's compile never finishes here
        try:
            ok = g.wait_compiled(None) is False and g(kiln.ones(2)).tolist() == [3.0, 3.0]
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 2) == b"ok"
    os.waitpid(pid, 0)
    hold.set()
    assert g.wait_compiled(60) and g(kiln.ones(2)).tolist() == [3.0, 3.0] and compiled_calls(g) == [1]


def test_a_ragged_epoch_compiling_in_the_background_makes_its_batch_dynamic(monkeypatch):
    """Calls at new sizes arrive while the first program still compiles: the trace at the second
    size is compared with the pending one (and its program compiles in the background too, cached
    under the dynamic key), so the epoch makes the static and the dynamic program, not one per size;
    every step equals eager's."""
    hold, original = threading.Event(), build.PendingSpecialization.compile

    def held(self):  # background compiles wait for the test; a compile in front of a call would not
        if threading.current_thread() is not threading.main_thread():
            assert hold.wait(60), "the test never released the compile"
        return original(self)

    monkeypatch.setattr(build.PendingSpecialization, "compile", held)

    def make():
        rng = np.random.default_rng(0)
        w = kiln.tensor(rng.standard_normal((6, 3)).astype(np.float32), requires_grad=True)

        def step(x):
            loss = (x @ w).tanh().square().mean()
            loss.backward()
            with kiln.no_grad():
                w.sub_(0.1 * w.grad)
                w.grad = None
            return loss

        return step, w

    eager, w_eager = make()
    fn, w = make()
    compiled = background(fn)
    rng = np.random.default_rng(1)
    for n in (8, 8, 5, 8, 3, 8, 7, 8):
        x = rng.standard_normal((n, 6)).astype(np.float32)
        np.testing.assert_allclose(array(compiled(kiln.tensor(x))), array(eager(kiln.tensor(x))), rtol=RTOL, atol=ATOL)
        if n == 5:
            hold.set()  # the static program finishes only after the call at a second size was traced
    assert compiled.wait_compiled(60)
    for n in (4, 9):
        x = rng.standard_normal((n, 6)).astype(np.float32)
        np.testing.assert_allclose(array(compiled(kiln.tensor(x))), array(eager(kiln.tensor(x))), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(array(w), array(w_eager), rtol=RTOL, atol=ATOL)
    specs = state_of(compiled).specializations
    assert len(specs) == 2 and sorted(str(s.dynamic) for s in specs) == ["None", "[(0, 0)]"]  # static, then dynamic
