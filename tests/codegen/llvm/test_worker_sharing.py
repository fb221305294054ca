"""The two compile workers: a request of many modules is shared between them where a core is idle
(the objects in order, the same as in-process compiles), a second thread is served by the second
worker meanwhile, and a second worker that cannot start, or an LLVM error, never loses a compile."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import engine, kernel_cache, worker, worker_pool
from kiln.compiler import program_cache
from kiln.runtime.cache import DiskCache


def _module(i: int) -> str:
    return f"""
define double @f{i}(double %x) {{
entry:
  %y = fmul double %x, {i + 1}.0
  ret double %y
}}
"""


TEXTS = [_module(i) for i in range(6)]


@pytest.fixture
def pair(monkeypatch):
    """Fresh WORKER and SPARE, and a machine with an idle core."""
    first, spare = worker.Worker(), worker.Worker()
    monkeypatch.setattr(worker, "WORKER", first)
    monkeypatch.setattr(worker, "SPARE", spare)
    monkeypatch.setattr(worker_pool, "_idle_core", lambda: True)
    yield first, spare
    first.close()
    spare.close()


def test_a_large_request_is_shared_and_its_objects_come_back_in_order(pair):
    first, spare = pair
    objects = worker_pool.compile_in_workers(TEXTS, timeout=60.0)
    assert objects == [engine.compile_here(text) for text in TEXTS]
    assert first._answered and spare._answered  # both compiled a part
    assert first._compiles + spare._compiles == len(TEXTS)
    assert not first.busy and not spare.busy


def test_a_small_request_or_a_busy_machine_uses_one_worker(pair, monkeypatch):
    first, spare = pair
    assert worker_pool.compile_in_workers(TEXTS[: worker_pool.SHARE_FROM - 1]) == [
        engine.compile_here(t) for t in TEXTS[:3]
    ]
    assert first._answered and spare._process is None
    monkeypatch.setattr(worker_pool, "_idle_core", lambda: False)
    worker_pool.start_all()
    assert worker_pool.compile_in_workers(TEXTS) == [engine.compile_here(text) for text in TEXTS]
    assert spare._process is None  # never started: it would only take CPU from other work


def test_a_second_thread_is_served_by_the_spare_while_the_first_worker_is_busy(pair):
    first, spare = pair
    claimed = worker_pool._claim(share=False)
    assert claimed == [first]
    try:
        assert worker_pool.compile_in_workers(TEXTS[:1]) == [engine.compile_here(TEXTS[0])]  # did not wait
        assert spare._answered and not first._answered
    finally:
        worker_pool._release(claimed)


def test_on_a_busy_machine_too_a_second_thread_takes_the_spare_and_one_request_is_not_shared(pair, monkeypatch):
    """A small request (an eager kernel's) must not wait for a program's whole request on the other
    worker; one request is still compiled by one worker (a second would take CPU from other work)."""
    first, spare = pair
    monkeypatch.setattr(worker_pool, "_idle_core", lambda: False)
    claimed = worker_pool._claim(share=False)
    assert claimed == [first]
    objects: list = []
    second = threading.Thread(target=lambda: objects.extend(worker_pool.compile_in_workers(TEXTS[:1])), daemon=True)
    try:
        second.start()
        second.join(30)
        assert not second.is_alive(), "the second thread waited for the busy first worker"
        assert objects == [engine.compile_here(TEXTS[0])]
        assert spare._answered and not first._answered
    finally:
        worker_pool._release(claimed)
    assert worker_pool.compile_in_workers(TEXTS) == [engine.compile_here(text) for text in TEXTS]
    assert first._compiles == len(TEXTS) and spare._compiles == 1, "the large request: on the first worker alone"


def test_a_spare_that_cannot_start_leaves_its_part_to_the_first_worker(pair, monkeypatch):
    first, spare = pair

    def cannot_start():
        raise OSError("no such program")

    monkeypatch.setattr(spare, "_start", cannot_start)
    assert worker_pool.compile_in_workers(TEXTS) == [engine.compile_here(text) for text in TEXTS]
    assert spare.broken and first._compiles == len(TEXTS)
    assert worker_pool._usable() == [first]


def test_an_llvm_error_in_a_shared_request_is_raised_and_releases_both(pair):
    first, spare = pair
    bad = [*TEXTS[:5], TEXTS[5].replace("ret double %y", "ret double %undefined_f5")]
    with pytest.raises(RuntimeError, match="undefined_f5"):
        worker_pool.compile_in_workers(bad)
    assert not first.busy and not spare.busy
    assert worker_pool.compile_in_workers(TEXTS) == [engine.compile_here(text) for text in TEXTS]


def test_engine_compiles_through_the_shared_workers(pair, monkeypatch):
    monkeypatch.setattr(engine, "_compiles", worker.IN_PROCESS_COMPILES)  # the next compiles go out
    assert engine.compile_many(TEXTS) == [engine.compile_here(text) for text in TEXTS]
    assert all(w._answered for w in pair)


def test_the_chunks_take_the_costliest_modules_first_each_in_order():
    texts = ["a" * 10, "b" * 1, "c" * 9, "d" * 2, "e" * 8, engine.TINY + "f" * 30]
    chunks = worker_pool._chunks(texts)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(6)) and all(c == sorted(c) for c in chunks)
    assert chunks == [[0], [2], [4], [5], [3], [1]]  # a tiny module costs a tenth of its length
    many = worker_pool._chunks(["x" * (100 - i) for i in range(20)])
    assert len(many) == 2 * worker_pool.CHUNKS_PER_WORKER - 1 and many[0] == [0, 1, 2]


def test_the_worker_done_first_takes_the_chunks_left(pair, monkeypatch):
    """One worker slowed down: the other compiles more than half of the modules, in order."""
    first, spare = pair
    compile_many = worker.Worker.compile_many

    def slow_spare(self, texts, timeout=None):
        if self is spare:
            time.sleep(0.5)
        return compile_many(self, texts, timeout)

    monkeypatch.setattr(worker.Worker, "compile_many", slow_spare)
    texts = [_module(i) for i in range(16)]
    assert worker_pool.compile_in_workers(texts) == [engine.compile_here(text) for text in texts]
    assert first._compiles > len(texts) // 2 and spare._compiles >= 1
    assert first._compiles + spare._compiles == len(texts)


def test_a_pipe_closed_while_waiting_reads_as_a_dead_worker():
    """At exit the worker is closed while a compile thread may still wait on its reply: that thread
    ends quietly (it used to die with 'I/O operation on closed file')."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE)  # fmt: skip
    process.stdout.close()
    try:
        assert worker.Worker._exchange(process, b"request") is None
    finally:
        process.kill()
        process.wait()


def test_background_compiles_through_the_two_workers_match_eager_across_the_switch(pair, tmp_path, monkeypatch):
    # compiles on the background threads, as where the program worker cannot take them
    # (kiln.compiler.program_worker, whose own test file covers the compiles it takes)
    monkeypatch.setenv("KILN_PROGRAM_WORKER", "0")
    off = DiskCache(tmp_path / "programs")
    off.enabled = False
    monkeypatch.setattr(program_cache, "disk_cache", lambda: off)
    kernels = DiskCache(tmp_path / "kernels")
    monkeypatch.setattr(kernel_cache, "kernel_cache", lambda: kernels)

    def f(x):
        return (x * 2.0).exp().sum(-1), (x - 1.0).tanh()

    def g(x):
        return (x.sin() + 3.0).log().mean(0), x.abs().amax(-1)

    rng = np.random.default_rng(0)
    inputs = [kiln.from_numpy(rng.standard_normal((6, 5)).astype(np.float32)) for _ in range(4)]
    compiled = {fn: kiln.compile(fn, options=kiln.CompileOptions(wait=False)) for fn in (f, g)}
    for i, x in enumerate(inputs):
        if i == 2:  # the switch: both programs ready
            assert all(c.wait_compiled(60) for c in compiled.values())
        for fn, c in compiled.items():
            for ours, theirs in zip(c(x), fn(x), strict=True):
                np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    assert all(c.state.specializations[0].calls == 2 for c in compiled.values())  # calls 3 and 4 ran compiled
    assert sum(w._compiles for w in pair) >= 4 and not any(w.busy for w in pair)  # LLVM ran in the workers


@pytest.fixture
def looks(monkeypatch):
    """A machine of two cores whose clock and CPU times the test sets: ``looks.append((seconds,
    idle ticks, total ticks))`` is what the next look finds; the load average says busy."""
    found: list[tuple[float, int, int]] = []
    monkeypatch.setattr(worker_pool, "_last_look", None)
    monkeypatch.setattr(worker_pool, "_clock", lambda: found[0][0])
    monkeypatch.setattr(worker_pool, "_cpu_times", lambda: found.pop(0)[1:])
    monkeypatch.setattr(worker_pool.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(worker_pool, "_cores", lambda: 2)
    monkeypatch.setattr(worker_pool.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    return found


def test_a_core_idle_since_the_last_look_is_idle_whatever_the_load_average(looks):
    """The passes and the code generator keep one core of two busy: the other was idle, though the
    last minute's load average (this process's own training, say) says 3."""
    looks += [(10.0, 1000, 4000), (10.2, 1020, 4040)]  # 20 of 40 ticks idle: one core of two
    assert not worker_pool._idle_core()  # no earlier look: the load average decides
    assert worker_pool._idle_core()
    looks.append((10.4, 1021, 4080))  # another process took the idle core
    assert not worker_pool._idle_core()


def test_a_look_too_soon_or_too_late_leaves_it_to_the_load_average(looks, monkeypatch):
    looks += [(10.0, 1000, 4000), (10.005, 1001, 4001), (10.2, 1020, 4040)]
    assert worker_pool._idle_cores_since() is None  # the first look
    assert worker_pool._idle_cores_since() is None  # 5 ms later: says nothing, keeps the first look
    assert worker_pool._idle_cores_since() == pytest.approx(1.0)  # measured from the first look
    looks.append((100.0, 9000, 40000))  # minutes later: says nothing about now
    assert worker_pool._idle_cores_since() is None
    monkeypatch.setattr(worker_pool.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    looks.append((300.0, 9000, 40000))
    assert worker_pool._idle_core()  # the load average: a core is idle


def test_the_cpu_times_are_read_from_proc_stat_where_there_is_one():
    times = worker_pool._cpu_times()
    if sys.platform.startswith("linux"):
        assert times is not None and 0 <= times[0] <= times[1]
    else:
        assert times is None


def test_a_process_on_one_core_never_uses_the_second_worker(looks, monkeypatch):
    monkeypatch.setattr(worker_pool, "_cores", lambda: 1)  # the other cores idle, but not this process's
    looks += [(10.0, 1000, 4000), (10.2, 1040, 4040)]
    assert not worker_pool._idle_core() and not worker_pool._idle_core()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_compile_workers_cpu_time_counts_as_idle(pair, monkeypatch):
    """A core the compile's own workers used (starting up while the passes ran) was not taken by
    other work: on a quiet machine of two cores, it decides for the second worker and for compiling
    while generating (``compile_stream.worth_it``)."""
    first, _ = pair
    assert worker_pool._worker_ticks() == 0  # none running
    first.compile_many([TEXTS[0]], 30.0)  # its start-up and a compile: several ticks of CPU
    assert worker_pool._worker_ticks() > 0
    monkeypatch.setattr(worker_pool, "_worker_ticks", lambda: 10**6)
    with_workers = worker_pool._cpu_times()
    monkeypatch.setattr(worker_pool, "_worker_ticks", lambda: 0)
    without = worker_pool._cpu_times()
    assert with_workers is not None and without is not None
    assert 10**6 - 10**4 < with_workers[0] - without[0] <= 10**6  # the machine's idle ticks moved on meanwhile
