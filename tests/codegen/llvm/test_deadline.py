"""Every compile has a deadline, and the compile worker never outlives its parent nor its deadline.

Past the deadline the LLVM compile is abandoned (its worker killed), the program runs on the
interpreter saying why, and nothing is cached; ``KILN_JIT_STRICT=1`` (the test suite's setting)
raises ``CompileTimeout`` instead. A compile that never ends comes from ``_endless_ir``: LLVM 22's
loop vectorizer walks the squaring chain of a value loaded from one address without memoizing
(2**62 steps), the cause of the integer-pow hang that kiln's own code generator now avoids.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import engine, worker
from kiln.compiler import options, program_cache
from kiln.runtime.executor import CompiledProgram

SMALL_IR = """
define double @twice(double %x) {
entry:
  %y = fmul double %x, 2.0
  ret double %y
}
"""


def _endless_ir(squarings: int = 62) -> str:
    """A loop whose body squares ``p[0]`` ``squarings`` times, marked free of memory dependences
    (as kiln marks its loops): LLVM's vectorizer spends ~2**squarings steps deciding it is uniform."""
    body = ["%b0 = load i64, ptr %p"]
    body += [f"%b{k + 1} = mul i64 %b{k}, %b{k}" for k in range(squarings)]
    body += [
        "%q = getelementptr inbounds i64, ptr %out, i64 %i",
        f"store i64 %b{squarings}, ptr %q, !llvm.access.group !0",
    ]
    lines = "\n  ".join(body)
    return textwrap.dedent("""
        define void @endless(ptr %p, ptr %out) {
        entry:
          br label %head
        head:
          %i = phi i64 [0, %entry], [%next, %body]
          %more = icmp slt i64 %i, 1024
          br i1 %more, label %body, label %done
        body:
          LINES
          %next = add nsw i64 %i, 1
          br label %head, !llvm.loop !2
        done:
          ret void
        }
        !0 = distinct !{}
        !1 = !{!"llvm.loop.parallel_accesses", !0}
        !2 = distinct !{!2, !1}
    """).replace("LINES", lines)


@pytest.fixture
def fresh_worker(monkeypatch):
    w = worker.Worker()
    monkeypatch.setattr(worker, "WORKER", w)
    yield w
    w.close()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie waiting for init to reap it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


# ----------------------------------------------------------------------------- the worker
def test_a_compile_with_a_limit_runs_in_the_worker_and_matches_in_process(fresh_worker):
    assert engine.compile_ir(SMALL_IR, timeout=30.0) == engine.compile_here(SMALL_IR)
    assert fresh_worker._process is not None  # even the process's first compile: only there can it be stopped


def _never_in_process(*args):
    raise AssertionError("the endless module was compiled in this process, where nothing can stop it")


@linux_only
def test_a_compile_past_its_limit_is_abandoned_and_its_worker_killed(fresh_worker, monkeypatch):
    start = time.monotonic()
    with monkeypatch.context() as patch, pytest.raises(worker.CompileTimeout, match="within 1 s"):
        patch.setattr(engine, "_optimized", _never_in_process)  # the worker loads an engine of its own
        engine.compile_ir(_endless_ir(), timeout=1.0)
    assert time.monotonic() - start < 10
    assert fresh_worker._process is None and not fresh_worker.broken  # killed and reaped
    assert engine.compile_ir(SMALL_IR, timeout=30.0) == engine.compile_here(SMALL_IR)
    assert fresh_worker._process is not None  # a new worker


def test_a_spent_deadline_fails_before_llvm_starts(fresh_worker):
    with pytest.raises(worker.CompileTimeout, match="spent before LLVM started"):
        engine.compile_ir(SMALL_IR, timeout=-0.5)
    assert fresh_worker._process is None


@linux_only
def test_a_worker_nobody_stops_ends_itself_past_its_deadline():
    """The worker's own watchdog: its parent is alive and never kills it, yet the compile ends at
    its limit plus ``GRACE_SECONDS``."""
    process = subprocess.Popen([sys.executable, worker.__file__, str(os.getpid())], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        worker._write(process.stdin, worker._LIMIT.pack(0.5) + _endless_ir().encode())
        assert process.wait(timeout=0.5 + worker.GRACE_SECONDS + 15) == 3
    finally:
        process.kill()
        process.wait()


_PARENT = """
import sys, threading
from kiln.codegen.llvm import worker
w = worker.Worker()
def compile_forever():
    print(w._running().pid, flush=True)
    w.compile(sys.argv[1])
if sys.argv[2] == "thread":  # started from a thread that lives on: the parent-death signal is not armed
    threading.Thread(target=compile_forever).start()
else:
    compile_forever()
"""


@linux_only
@pytest.mark.parametrize("started_from", ["main", "thread"])
def test_a_worker_dies_with_its_parent(started_from):
    """An orphaned worker once ran a stuck compile for 79 minutes: SIGKILL the parent mid-compile
    and the worker must be gone within seconds (parent-death signal from the main thread, the
    watchdog's parent check from any thread)."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _endless_ir(), started_from], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))  # fmt: skip
    try:
        pid = int(parent.stdout.readline())
        time.sleep(1.0)  # the worker is importing llvmlite or already stuck in LLVM
        assert not _gone(pid), "the worker ended before its parent did"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert _wait_gone(pid, 5.0), f"worker {pid} outlived its parent"


# ----------------------------------------------------------------------------- kiln.compile
def _program(x):
    return (x * 2 + 1).exp().sum(-1)


@pytest.fixture
def own_disk_cache(monkeypatch, tmp_path):
    """A cache directory of this test's own (the process's cache object is made once: forget it)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    program_cache.disk_cache.cache_clear()
    yield tmp_path
    program_cache.disk_cache.cache_clear()


def test_past_the_deadline_the_program_runs_on_the_interpreter_saying_why(monkeypatch, own_disk_cache, caplog):
    monkeypatch.setenv("KILN_JIT_STRICT", "0")  # fall back, as outside the test suite
    x = kiln.tensor(np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32))
    compiled = kiln.compile(_program, options=kiln.CompileOptions(compile_timeout=1e-9))
    for _ in range(3):
        np.testing.assert_allclose(compiled(x).numpy(), _program(x).numpy(), rtol=1e-6)
    spec = compiled.state.specializations[-1]
    assert spec.report.abandoned and spec.report.kernels == 0
    assert "compile_timeout" in caplog.text
    assert "compile deadline" in str(kiln.explain(compiled))
    # nothing cached: a compile with time to spare compiles and stores, and the next one loads it
    again = kiln.compile(_program)
    again(x)
    report = again.state.specializations[-1].report
    assert (report.cache, report.abandoned) == ("miss", "") and report.kernels > 0
    assert isinstance(again.state.specializations[-1].program, CompiledProgram)
    third = kiln.compile(_program)
    np.testing.assert_allclose(third(x).numpy(), _program(x).numpy(), rtol=1e-6)
    assert third.state.specializations[-1].report.cache == "hit"


def test_in_strict_mode_a_compile_past_its_deadline_raises(own_disk_cache):
    compiled = kiln.compile(_program, options=kiln.CompileOptions(compile_timeout=1e-9))
    with pytest.raises(worker.CompileTimeout):
        compiled(kiln.ones(3, 5))


def test_no_deadline_compiles_as_before(own_disk_cache):
    compiled = kiln.compile(_program, options=kiln.CompileOptions(compile_timeout=None))
    x = kiln.ones(2, 4)
    np.testing.assert_allclose(compiled(x).numpy(), _program(x).numpy(), rtol=1e-6)
    assert compiled.state.specializations[-1].report.kernels > 0


# ----------------------------------------------------------------------------- the option
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "5", True])
def test_compile_timeout_must_be_positive_seconds(bad):
    with pytest.raises(ValueError, match="compile_timeout must be a number of seconds > 0 or None"):
        kiln.CompileOptions(compile_timeout=bad)


@pytest.mark.parametrize(("text", "seconds"), [("", 60.0), ("2.5", 2.5), ("0", None), ("off", None), ("none", None)])
def test_the_default_comes_from_kiln_compile_timeout(monkeypatch, text, seconds):
    monkeypatch.setenv("KILN_COMPILE_TIMEOUT", text)
    assert options.default_compile_timeout() == seconds
    assert kiln.CompileOptions().compile_timeout == seconds


@pytest.mark.parametrize("text", ["soon", "-3", "nan"])
def test_a_bad_kiln_compile_timeout_is_refused(monkeypatch, text):
    monkeypatch.setenv("KILN_COMPILE_TIMEOUT", text)
    with pytest.raises(ValueError, match="KILN_COMPILE_TIMEOUT must be a number of seconds"):
        kiln.CompileOptions()
