"""The CPU thread pool: splitting, serial fallbacks, errors, concurrent and nested callers."""

import ctypes
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.runtime import threads

KERNEL_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
UNIT = 4096  # elements per parallel unit of the compiled scale kernel

SCALE_IR = r"""
define void @scale(ptr noalias %args, i64 %begin, i64 %end) {
entry:
  %inp = load ptr, ptr %args
  %op = getelementptr ptr, ptr %args, i64 1
  %out = load ptr, ptr %op
  %s = mul i64 %begin, 4096
  %e = mul i64 %end, 4096
  %c = icmp slt i64 %s, %e
  br i1 %c, label %loop, label %exit
loop:
  %i = phi i64 [%s, %entry], [%i1, %loop]
  %pi = getelementptr float, ptr %inp, i64 %i
  %x = load float, ptr %pi
  %y = fmul float %x, 2.0
  %po = getelementptr float, ptr %out, i64 %i
  store float %y, ptr %po
  %i1 = add i64 %i, 1
  %c2 = icmp slt i64 %i1, %e
  br i1 %c2, label %loop, label %exit
exit:
  ret void
}
"""


@pytest.fixture(autouse=True)
def restore_threads():
    saved = threads.get_num_threads()
    yield
    threads.set_num_threads(saved)


@pytest.fixture
def always_split(monkeypatch):
    monkeypatch.setattr(threads, "PARALLEL_MIN_WORK_BYTES", 0)
    monkeypatch.setattr(threads, "NATIVE_MIN_WORK_BYTES", 0)
    monkeypatch.setattr(threads, "WAKE_MIN_WORK_BYTES", 0)  # the native pool wakes sleeping workers for any work


@pytest.fixture(scope="module")
def scale():
    """A compiled kernel with the real ABI: out[i] = 2 * in[i] over units of 4096 float32."""
    pytest.importorskip("llvmlite")
    from kiln.codegen.llvm.engine import Library, compile_ir

    library = Library([compile_ir(SCALE_IR)])
    kernel = KERNEL_TYPE(library.address("scale"))
    kernel.library = library  # the function pointer is valid while the library lives
    return kernel


def run_scale(kernel, units: int, parallel: bool = True, spin: bool = True) -> tuple[np.ndarray, np.ndarray]:
    source = np.random.default_rng(units).standard_normal(units * UNIT).astype(np.float32)
    out = np.full_like(source, np.nan)
    args = (ctypes.c_void_p * 2)(source.ctypes.data, out.ctypes.data)
    if parallel:
        threads.parallel_for(kernel, ctypes.addressof(args), units, out.nbytes * 2, spin=spin)
    else:
        kernel(ctypes.addressof(args), 0, units)
    return source, out


def _native_supported() -> bool:
    try:
        from kiln.codegen.llvm import pool  # noqa: PLC0415 - importing it installs the pool
    except ImportError:  # no llvmlite
        return False
    return pool.supported()


needs_native = pytest.mark.skipif(not _native_supported(), reason="no native pool on this platform")


class Recorder:
    """A Python 'kernel' that records which thread ran which range."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, args, begin, end):
        with self.lock:
            self.calls.append((begin, end, threading.get_ident()))


def test_num_threads_default_and_set():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert threads._default_num_threads() == expected
    kiln.set_num_threads(3)
    assert kiln.get_num_threads() == 3 == threads.get_num_threads()


@pytest.mark.parametrize("bad", [0, -2])
def test_set_num_threads_rejects_non_positive(bad):
    with pytest.raises(RuntimeError, match=f"expects a positive integer, but got {bad}"):
        kiln.set_num_threads(bad)


@pytest.mark.parametrize("bad", [1.5, "2", True, None])
def test_set_num_threads_rejects_non_int(bad):
    with pytest.raises(RuntimeError, match=f"expects an int, but got {type(bad).__name__}"):
        kiln.set_num_threads(bad)


@pytest.mark.parametrize("num_threads", [2, 3, 4])
@pytest.mark.parametrize("extent", [0, 1, 2, 3, 7, 100])
def test_chunks_cover_the_extent_once(always_split, num_threads, extent):
    kiln.set_num_threads(num_threads)
    record = Recorder()
    threads.parallel_for(record, None, extent, 1 << 30)
    ranges = sorted((b, e) for b, e, _ in record.calls)
    assert ranges == chunks_of(extent, num_threads)  # fewer units than chunks: one chunk per unit
    covered = [i for b, e in ranges for i in range(b, e)]
    assert covered == list(range(extent))
    assert all(e > b for b, e in ranges)
    # claimed as they come: by the caller and the workers, never by more threads than asked for
    assert len({ident for _, _, ident in record.calls}) <= num_threads


@pytest.mark.parametrize("case", ["small", "one_thread", "one_unit"])
def test_serial_paths_make_one_call_on_the_caller(case):
    kiln.set_num_threads(1 if case == "one_thread" else 4)
    extent = 1 if case == "one_unit" else 64
    work = threads.PARALLEL_MIN_WORK_BYTES - 1 if case == "small" else threads.PARALLEL_MIN_WORK_BYTES
    record = Recorder()
    threads.parallel_for(record, None, extent, work)
    assert record.calls == [(0, extent, threading.get_ident())]


def test_large_work_splits_without_patching_the_threshold():
    kiln.set_num_threads(2)
    record = Recorder()
    threads.parallel_for(record, None, 10, threads.PARALLEL_MIN_WORK_BYTES)
    assert sorted((b, e) for b, e, _ in record.calls) == chunks_of(10, 2)


@pytest.mark.parametrize("spin", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("units", [1, 2, 3, 5, 64])
def test_compiled_kernel_split_equals_serial(always_split, scale, units, spin):
    kiln.set_num_threads(3)
    source, split = run_scale(scale, units, spin=spin)
    _, serial = run_scale(scale, units, parallel=False)
    np.testing.assert_array_equal(split, serial)
    np.testing.assert_array_equal(split, 2 * source)


@pytest.mark.parametrize("failing_begin", [0, 4, 8])
def test_exceptions_propagate_after_all_chunks_finish(always_split, failing_begin):
    kiln.set_num_threads(3)
    finished = []

    def kernel(args, begin, end):
        if begin == failing_begin:
            raise ValueError(f"chunk {begin} failed")
        finished.append(begin)

    with pytest.raises(ValueError, match=f"chunk {failing_begin} failed"):
        threads.parallel_for(kernel, None, 12, 1, spin=True)  # a Python kernel: the Python pool, even so
    assert sorted(finished) == [b for b, _ in chunks_of(12, 3) if b != failing_begin]
    record = Recorder()  # the pool still works afterwards
    threads.parallel_for(record, None, 12, 1)
    assert len(record.calls) == len(chunks_of(12, 3))


def test_concurrent_callers_get_their_own_results(always_split, scale):
    kiln.set_num_threads(2)
    failures = []

    def caller(seed):
        try:
            for units in range(1 + seed, 40, 4):
                source, out = run_scale(scale, units)
                if not np.array_equal(out, 2 * source):
                    failures.append((seed, units))
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    callers = [threading.Thread(target=caller, args=(seed,)) for seed in range(4)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in callers), "parallel_for deadlocked"
    assert failures == []


def test_nested_call_runs_serially_without_deadlock(always_split):
    kiln.set_num_threads(2)
    inner_calls = []

    def inner(args, begin, end):
        inner_calls.append((args, begin, end, threading.get_ident()))

    def outer(args, begin, end):
        threads.parallel_for(inner, begin, 10, 1 << 30)

    outer_callback = KERNEL_TYPE(lambda args, begin, end: outer(args, begin, end))
    result = []
    runner = threading.Thread(target=lambda: result.append(threads.parallel_for(outer_callback, None, 2, 1)))
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive(), "nested parallel_for deadlocked"
    assert result == [None]
    # each outer chunk made one serial inner call over the whole extent, on the thread running it
    assert sorted(call[:3] for call in inner_calls) == [(0, 0, 10), (1, 0, 10)]


def _child_runs_parallel_for(queue, native):
    threads.PARALLEL_MIN_WORK_BYTES = threads.WAKE_MIN_WORK_BYTES = 0
    record, kernel = native_recorder() if native else (Recorder(),) * 2
    threads.parallel_for(kernel, None, 4, 1, spin=native)
    queue.put(sorted((b, e) for b, e, _ in record.calls))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_native)], ids=["python", "native"])
def test_pool_works_in_a_forked_child(always_split, native):
    kiln.set_num_threads(2)
    _, kernel = native_recorder() if native else (None, Recorder())
    threads.parallel_for(kernel, None, 4, 1, spin=native)  # the parent's workers exist before the fork
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_child_runs_parallel_for, args=(results, native))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert results.get(timeout=5) == chunks_of(4, 2)


def _blas_threads(threadpoolctl) -> list[int]:
    return [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]


def test_set_num_threads_limits_blas_too():
    """set_num_threads(n) gives every loaded BLAS (numpy's at least) n threads, and setting the
    previous count back restores them: a benchmark's libraries all run on kiln's count."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not _blas_threads(threadpoolctl):
        pytest.skip("no BLAS library is loaded in this process (threadpoolctl finds none)")
    original = kiln.get_num_threads()
    kiln.set_num_threads(1)
    assert set(_blas_threads(threadpoolctl)) == {1}
    assert kiln.get_num_threads() == 1
    kiln.set_num_threads(2)
    assert set(_blas_threads(threadpoolctl)) == {2}
    kiln.set_num_threads(original)
    assert set(_blas_threads(threadpoolctl)) == {original}
    assert kiln.get_num_threads() == original
    np.testing.assert_allclose(np.ones((64, 64)) @ np.ones((64, 64)), np.full((64, 64), 64.0))  # BLAS still works


def test_import_kiln_does_not_import_threadpoolctl():
    """threadpoolctl is imported by the first set_num_threads, not by `import kiln`."""
    root = Path(kiln.__file__).parent.parent
    code = "import sys, kiln; print('threadpoolctl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


# ----------------------------------------------------------------------------- the native pool


def native_recorder(meet: int = 1) -> tuple[Recorder, object]:
    """A Recorder behind a ctypes function pointer: parallel_for hands it to the native pool.
    ``meet``: each call waits (10 s at most) until that many threads have called, so that a task's
    chunks, claimed as they come, cannot all go to the thread that is first there."""
    record = Recorder()
    arrived = threading.Condition()

    def call(args, begin, end):
        record(args, begin, end)
        with arrived:
            arrived.notify_all()
            arrived.wait_for(lambda: len({ident for _, _, ident in record.calls}) >= meet, timeout=10)

    return record, KERNEL_TYPE(call)


def chunks_of(extent: int, threads_: int) -> list[tuple[int, int]]:
    """The ranges the pools run ``[0, extent)`` in, over ``threads_`` threads."""
    count = min(extent, threads_ * threads.CHUNKS_PER_THREAD)
    return [(extent * c // count, extent * (c + 1) // count) for c in range(count)]


@pytest.fixture(autouse=True)
def native_pool(request, monkeypatch):
    """The native pool installed for the tests that name it, whatever KILN_NATIVE_POOL says."""
    if "native" in request.node.name:
        from kiln.codegen.llvm import pool  # noqa: PLC0415

        monkeypatch.setattr(threads, "_native_factory", None)
        monkeypatch.setattr(threads, "_native", _shared_native_pool(pool))


_POOLS: list = []


def _shared_native_pool(pool):
    if not _POOLS:
        _POOLS.append(pool.NativePool())
    return _POOLS[0]


def _let_workers_sleep() -> None:
    """Park the native workers and wait until every one of them sleeps in futex."""
    threads._native.park()
    _wait_until_asleep(threads._native, 10)


@pytest.fixture
def workers_spin_long():
    """Idle native workers spin for 10 s instead of SPIN_NS: awake for the whole test, whatever the
    machine's load (park still sends them to sleep)."""
    from kiln.codegen.llvm import pool  # noqa: PLC0415

    threads._native.set_spin(10**10)
    yield
    threads._native.set_spin(pool.SPIN_NS)


@needs_native
def test_native_pool_splits_and_wakes_sleeping_workers(always_split):
    kiln.set_num_threads(2)
    for _ in range(3):  # spinning workers, then sleeping ones
        record, kernel = native_recorder(meet=2)
        threads.parallel_for(kernel, None, 10, 1, spin=True)
        assert sorted((b, e) for b, e, _ in record.calls) == chunks_of(10, 2)
        assert len({ident for _, _, ident in record.calls}) == 2
        _let_workers_sleep()


def _wait_until_asleep(native, timeout: float) -> float:
    """Seconds until every native worker sleeps (asserting it happens within ``timeout``)."""
    start = time.monotonic()
    while native.sleepers() < len(native.workers):
        assert time.monotonic() - start < timeout, "idle native workers never went to sleep"
        time.sleep(0.0005)
    return time.monotonic() - start


def _wait_until_awake(native, timeout: float) -> None:
    """Wait until no native worker sleeps (one woken counts as asleep until it has run)."""
    start = time.monotonic()
    while native.sleepers():
        assert time.monotonic() - start < timeout, "woken native workers never ran"
        time.sleep(0.0005)


@needs_native
def test_idle_native_workers_spin_for_a_time_not_a_count_of_rounds(always_split):
    """An idle worker sleeps once it has spun for the time set, not after a count of pause rounds
    (whose length is the CPU's: on the CI machine the workers slept before the next kernel came)."""
    from kiln.codegen.llvm import pool  # noqa: PLC0415

    native = threads._native
    kiln.set_num_threads(2)
    try:
        for budget in (0.05, 0.2):
            native.set_spin(int(budget * 1e9))
            start = time.monotonic()
            threads.parallel_for(native_recorder(meet=2)[1], None, 10, threads.WAKE_MIN_WORK_BYTES, spin=True)
            elapsed = (time.monotonic() - start) + _wait_until_asleep(native, 10)
            assert elapsed >= budget
    finally:
        native.set_spin(pool.SPIN_NS)
    threads.parallel_for(native_recorder(meet=2)[1], None, 10, threads.WAKE_MIN_WORK_BYTES, spin=True)
    assert _wait_until_asleep(native, 10) < 5  # SPIN_NS, 0.1 ms, and this machine's latency


@needs_native
def test_native_pool_keeps_small_work_on_the_caller_while_workers_sleep(workers_spin_long):
    """With the thresholds as shipped: from NATIVE_MIN_WORK_BYTES a spin kernel is split over awake
    workers (the Python pool only splits from PARALLEL_MIN_WORK_BYTES); below WAKE_MIN_WORK_BYTES
    it runs on the caller in one call while they sleep, and a large one wakes them."""
    assert threads.NATIVE_MIN_WORK_BYTES < threads.WAKE_MIN_WORK_BYTES <= threads.PARALLEL_MIN_WORK_BYTES
    kiln.set_num_threads(2)
    small = threads.NATIVE_MIN_WORK_BYTES
    # a task that wakes them; every worker (the pool may hold more than this task uses, from an
    # earlier test's thread count) is awake once the OS has run it, which a loaded machine delays
    threads.parallel_for(native_recorder(meet=2)[1], None, 10, threads.WAKE_MIN_WORK_BYTES, spin=True)
    _wait_until_awake(threads._native, 10)
    record, kernel = native_recorder()
    threads.parallel_for(kernel, None, 10, small, spin=True)  # the workers still spin
    assert sorted((b, e) for b, e, _ in record.calls) == chunks_of(10, 2)
    record = Recorder()
    threads.parallel_for(record, None, 10, small)  # not a spin kernel: below the Python pool's threshold
    assert record.calls == [(0, 10, threading.get_ident())]
    _let_workers_sleep()
    record, kernel = native_recorder()
    threads.parallel_for(kernel, None, 10, small, spin=True)
    assert record.calls == [(0, 10, threading.get_ident())]
    threads.parallel_for(kernel, None, 10, threads.WAKE_MIN_WORK_BYTES, spin=True)
    assert sorted((b, e) for b, e, _ in record.calls[1:]) == chunks_of(10, 2)


def test_a_native_pool_that_cannot_be_built_leaves_the_python_pool(always_split, monkeypatch, caplog):
    def broken():
        raise OSError("no executable memory")

    monkeypatch.setattr(threads, "_native", None)
    monkeypatch.setattr(threads, "_native_factory", broken)
    kiln.set_num_threads(2)
    record, kernel = native_recorder()
    with caplog.at_level("WARNING", logger="kiln"):
        threads.parallel_for(kernel, None, 10, 1, spin=True)
    assert sorted((b, e) for b, e, _ in record.calls) == chunks_of(10, 2)  # split, by Python threads
    assert "native thread pool could not be built" in caplog.text and "no executable memory" in caplog.text


@needs_native
@pytest.mark.parametrize("num_threads", [2, 3, 5])
def test_native_pool_compiled_kernel_after_sleeping(always_split, scale, num_threads):
    kiln.set_num_threads(num_threads)
    for _ in range(2):
        source, split = run_scale(scale, 7)
        np.testing.assert_array_equal(split, 2 * source)
        _let_workers_sleep()


@needs_native
def test_native_pool_back_to_back_tasks_with_more_threads_than_cores(always_split, scale):
    """Workers the OS runs late (5 threads on this machine's cores) take no chunk of a task they did
    not see: every task's output is exactly its own, none left unwritten (NaN) or written twice."""
    kiln.set_num_threads(5)
    for units in [*range(1, 24)] * 12:
        source, split = run_scale(scale, units)
        np.testing.assert_array_equal(split, 2 * source)
    kiln.set_num_threads(2)  # the workers started for 5 stay, and sit out a task of 2 threads
    for _ in range(20):
        record, kernel = native_recorder()
        threads.parallel_for(kernel, None, 64, 1, spin=True)
        assert sorted((b, e) for b, e, _ in record.calls) == chunks_of(64, 2)
        assert len({ident for _, _, ident in record.calls}) <= 2


def test_process_with_native_workers_exits_cleanly():
    """The workers run compiled code: at exit they are stopped before the code is freed."""
    root = Path(kiln.__file__).parent.parent
    code = (
        "import numpy as np, kiln\n"
        "kiln.set_num_threads(2)\n"
        "f = kiln.compile(lambda a: a * 2)\n"
        "x = kiln.from_numpy(np.ones(1 << 21, np.float32))\n"
        "assert float(f(x).sum()) == 2.0 * (1 << 21)\n"
        "print('done')\n"
    )
    env = {**os.environ, "KILN_NATIVE_POOL": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stdout + out.stderr


@needs_native
def test_native_worker_started_just_before_a_task_takes_it(always_split, scale):
    """A worker started by the call that publishes a task must run that task's chunk (it was once
    taken for an old task when the thread read the generation only after the publish: a hang)."""
    done = []

    def grow():
        for count in range(2, 9):
            kiln.set_num_threads(count)  # each count starts one more worker, right before the task
            source, split = run_scale(scale, 16)
            np.testing.assert_array_equal(split, 2 * source)
        done.append(True)

    runner = threading.Thread(target=grow, daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert done == [True], "a task never finished: a new worker missed it"


@needs_native
def test_parked_native_workers_sleep_and_wake_for_the_next_task(always_split, scale):
    """park() (the executor calls it before a step that may run on other threads: a BLAS call) sends
    spinning workers to sleep at once; the next task still runs on them, with the right result."""
    kiln.set_num_threads(2)
    record, kernel = native_recorder()
    threads.parallel_for(kernel, None, 10, 1, spin=True)
    threads.park()
    threads.park()  # a second park with nothing spinning is a no-op
    record, kernel = native_recorder(meet=2)
    threads.parallel_for(kernel, None, 10, 1, spin=True)
    assert sorted((b, e) for b, e, _ in record.calls) == chunks_of(10, 2)
    assert len({ident for _, _, ident in record.calls}) == 2
    source, split = run_scale(scale, 5)
    np.testing.assert_array_equal(split, 2 * source)


def _extern_steps(program, op: str) -> list:
    return [step for step in program._steps if getattr(step, "node", None) is not None and step.node.op == op
            and hasattr(step, "parks")]  # fmt: skip


def test_every_program_splits_on_the_native_pool_and_parks_it_only_before_blas(monkeypatch, eager_on):
    """The executor runs every program's large kernels on the native pool (splits from
    NATIVE_MIN_WORK_BYTES, workers spinning between kernels), a program that calls eager kernels too;
    a step that may run on other threads parks the workers first: numpy's matmul (a product of 16
    columns, which kiln's product kernel declines), not numpy's one-thread kernels (a concatenation)
    nor kiln's product kernel, which runs on the workers (a product of 256 columns)."""
    rng = np.random.default_rng(0)
    x = kiln.from_numpy(rng.standard_normal((256, 1024)).astype(np.float32))  # elementwise kernels of 2 MiB work
    narrow = kiln.from_numpy(rng.standard_normal((1024, 16)).astype(np.float32))  # 4M multiply-adds: BLAS threads
    wide = kiln.from_numpy(rng.standard_normal((1024, 256)).astype(np.float32))

    def f(a):
        return kiln.cat([(a @ narrow) * 2, a[:, :16]], dim=1) + 1, (a @ wide) * 2 + 1, a * 2 + 1

    fn = kiln.compile(f, wait=True)  # (eager_on: kiln's product kernel is compiled with the program)
    for _ in range(3):
        fn(x)
    program = fn.state.specializations[-1].program
    assert {call.spin for call in program.kernel_calls} == {True}
    if threads.min_work_bytes(True) < threads.min_work_bytes(False):  # 2 MiB: split on the native pool only
        assert any(call.work > 0 for call in program.kernel_calls)
    assert [step.parks for step in _extern_steps(program, "concatenate")] == [False]
    events: list[str] = []
    matmul = np.matmul
    monkeypatch.setattr(threads, "park", lambda: events.append("park"))
    monkeypatch.setattr(np, "matmul", lambda *a, **k: (events.append("numpy matmul"), matmul(*a, **k))[1])
    got = fn(x)
    assert events == ["park", "numpy matmul"]  # the narrow product's; the wide one ran on kiln's kernel
    for g, e in zip(got, f(x), strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-4, atol=1e-4)


_BLAS_TIMEOUT = """
import ctypes, os, sys
first = sys.argv[1]
__import__(first)
import kiln, numpy, threadpoolctl
blas = [c for c in threadpoolctl.ThreadpoolController().lib_controllers if c.internal_api == "openblas"]
read = getattr(blas[0].dynlib, "openblas_thread_timeout", None) if blas else None
if read is not None:
    read.restype = ctypes.c_int
print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), read() if read is not None else "no-openblas")
"""


@pytest.mark.parametrize(
    "first, env, expected",
    [("kiln", None, ("20", "20")), ("kiln", "7", ("7", "7")), ("numpy", None, ("None", "0"))],
)
def test_importing_kiln_before_numpy_shortens_openblas_spinning(first, env, expected):
    """``import kiln`` sets OPENBLAS_THREAD_TIMEOUT=20 before numpy loads OpenBLAS (whose idle
    threads otherwise spin for 2^28 cycles, preempting kiln's kernel threads); a value the user
    set stays, and after numpy it changes nothing (OpenBLAS has read its environment)."""
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if env is not None:
        environ["OPENBLAS_THREAD_TIMEOUT"] = env
    root = Path(kiln.__file__).parent.parent
    out = subprocess.run([sys.executable, "-c", _BLAS_TIMEOUT, first], capture_output=True, text=True,
                         timeout=120, cwd=root, env=environ)  # fmt: skip
    assert out.returncode == 0, out.stderr
    variable, read = out.stdout.split()
    if read == "no-openblas":
        pytest.skip("numpy's BLAS is not OpenBLAS here")
    assert (variable, read) == expected
