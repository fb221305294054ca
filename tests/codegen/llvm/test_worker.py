"""The compile worker: the same object code as an in-process compile, LLVM's errors carried back,
a worker that dies or cannot start never fails a compile silently, and a process that compiles
many programs keeps a bounded amount of memory (llvmlite keeps ~100 KB per in-process compile)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from kiln.codegen.llvm import engine, worker

IR = """
define double @twice(double %x) {
entry:
  %y = fmul double %x, 2.0
  ret double %y
}
"""


@pytest.fixture
def fresh_worker(monkeypatch):
    w = worker.Worker()
    monkeypatch.setattr(worker, "WORKER", w)
    monkeypatch.setattr(engine, "_compiles", worker.IN_PROCESS_COMPILES)  # the next compile goes out
    yield w
    w.close()


def test_the_worker_gives_the_object_code_of_an_in_process_compile(fresh_worker):
    assert engine.compile_ir(IR) == engine.compile_here(IR)
    assert fresh_worker._process is not None and fresh_worker._answered


def test_llvm_errors_come_back_with_llvm_s_message(fresh_worker):
    with pytest.raises(RuntimeError, match="twice"):
        engine.compile_ir(IR.replace("ret double %y", "ret double %undefined_twice"))
    assert engine.compile_ir(IR) == engine.compile_here(IR)  # the worker lives on


def test_a_worker_that_dies_is_replaced(fresh_worker):
    engine.compile_ir(IR)
    fresh_worker._process.kill()
    fresh_worker._process.wait()
    assert engine.compile_ir(IR) == engine.compile_here(IR)


def test_a_worker_that_cannot_start_leaves_compiles_in_this_process(fresh_worker, monkeypatch, caplog):
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert engine.compile_ir(IR) == engine.compile_here(IR)
    assert fresh_worker.broken and "could not start" in caplog.text
    assert engine.compile_ir(IR) == engine.compile_here(IR)


def test_a_worker_is_replaced_after_its_share_of_compiles(fresh_worker, monkeypatch):
    monkeypatch.setattr(worker, "WORKER_COMPILES", 2)
    engine.compile_ir(IR)
    first = fresh_worker._process
    engine.compile_ir(IR)
    engine.compile_ir(IR)
    assert fresh_worker._process is not first and first.poll() is not None


def test_many_compiles_keep_memory_bounded(tmp_path):
    """200 programs of distinct shapes compiled and dropped after the first in-process ones: the
    resident memory grows by well under what llvmlite alone keeps in process (~17 MB here)."""
    script = textwrap.dedent("""
        import kiln
        def rss():
            return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024
        def compile_many(count, start):
            for i in range(start, start + count):
                f = kiln.compile(lambda x: (x * 2 + 1).exp().sum())  # compiled in the background
                f(kiln.ones(i))
                assert f.wait_compiled(60)
                f(kiln.ones(i))
        compile_many(60, 2)
        before = rss()
        compile_many(200, 100)
        print(rss() - before)
    """)
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/status")
    env = {"KILN_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    growth = float(out.stdout.split()[-1])
    assert growth < 8.0, f"RSS grew by {growth:.1f} MB over 200 compiles"


def test_a_forked_child_starts_a_worker_of_its_own(fresh_worker):
    import os

    engine.compile_ir(IR)
    parent_worker = fresh_worker._process
    pid = os.fork()
    if pid == 0:  # the child: compile through a worker of its own, then leave without cleanup
        ok = engine.compile_ir(IR) == engine.compile_here(IR) and fresh_worker._process is not parent_worker
        fresh_worker.close()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert engine.compile_ir(IR) == engine.compile_here(IR)  # the parent's worker is untouched
    assert fresh_worker._process is parent_worker


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no process priorities here")
def test_the_worker_runs_at_a_lower_priority_than_its_parent(fresh_worker):
    """A background compile's LLVM work yields a contended core to the eager calls of the parent."""
    parent = os.getpriority(os.PRIO_PROCESS, 0)
    if parent + worker.WORKER_NICE > 19:
        pytest.skip(f"this process runs at nice {parent}: no lower priority is left for the worker")
    engine.compile_ir(IR)  # the worker has started and served a request
    assert os.getpriority(os.PRIO_PROCESS, fresh_worker._process.pid) == parent + worker.WORKER_NICE


def test_lowering_the_priority_asks_for_worker_nice_and_never_fails(monkeypatch):
    asked = []
    monkeypatch.setattr(os, "nice", lambda increment: asked.append(increment) or 0)
    worker._lower_priority()
    assert asked == [worker.WORKER_NICE]

    def refused(increment):
        raise PermissionError("not allowed")

    monkeypatch.setattr(os, "nice", refused)
    worker._lower_priority()  # the compile goes on at the parent's priority


def test_llvm_warmed_up_as_a_worker_starts_compiles_the_same_code(fresh_worker):
    # the worker warms up before it serves (``engine.warm_up``): its code equals a compile here
    assert engine.compile_here(engine.LIGHT + IR) == fresh_worker.compile(engine.LIGHT + IR)
    script = textwrap.dedent(f"""
        import sys
        from kiln.codegen.llvm import engine
        if sys.argv[1] == "warm":
            engine.warm_up()
        sys.stdout.buffer.write(engine.compile_here({engine.LIGHT + IR!r}))
    """)
    cold, warm = (subprocess.run([sys.executable, "-c", script, mode], capture_output=True, check=True).stdout
                  for mode in ("cold", "warm"))  # fmt: skip
    assert cold == warm == engine.compile_here(engine.LIGHT + IR)


def test_a_request_for_the_workers_does_not_wait_for_a_compile_in_this_process(monkeypatch):
    """Starting the workers and sending them a request take no lock LLVM's in-process compiles hold
    (the eager thread's product kernels, compiled here: a cold DCGAN's first call waited 33-117 ms
    for one to start its workers)."""
    from kiln.codegen.llvm import worker_pool  # noqa: PLC0415

    done: list[str] = []
    monkeypatch.setattr(worker, "WORKER", worker.Worker())
    monkeypatch.setattr(worker_pool, "start_all", lambda: done.append("started"))
    monkeypatch.setattr(worker_pool, "compile_in_workers", lambda texts, timeout: [b"object"] * len(texts))

    def ask() -> None:
        engine.start_worker()
        done.append(engine.compile_ir(IR, timeout=60.0))  # with a time limit: to the workers

    with engine._lock:  # another thread compiling in this process
        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(5)
        finished = not asking.is_alive()
    asking.join()
    assert finished and done == ["started", b"object"]
