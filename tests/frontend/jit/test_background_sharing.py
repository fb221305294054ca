"""A compile in the background shares the process with the calls that run meanwhile.

The interpreter (``background.sharing``): a compile thread running Python holds the interpreter's
lock; the caller's thread, back from a BLAS call or a numpy loop (each releases the lock), waits
for it up to the switch interval. While any background compile runs -- a ``kiln.compile``
program's or an eager kernel's -- the interval is ``background.SWITCH_INTERVAL``; it is put back
after the last one, unless changed meanwhile.

The compiles (``background.Job.defers_kernels``): a program's compile goes first -- the traced
call and the calls made while the program compiles queue no eager kernels, for
``background.KERNELS_AFTER_S`` at most; kernels queued by other code do not hold it back.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import kiln
from kiln.frontend import eager_kernels
from kiln.frontend.jit import background, build
from kiln.runtime import threads

from .helpers import array, compiled_calls, state_of

DEFAULT = 0.005  # Python's own switch interval


def _as_kept(seconds: float) -> float:
    """``seconds`` as Python keeps a switch interval (whole microseconds, truncated)."""
    return 1e-6 * int(seconds * 1e6)


SHORT = _as_kept(background.SWITCH_INTERVAL)


@pytest.fixture
def interval():
    """The switch interval at Python's default for the test, put back afterwards."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(DEFAULT)
    yield
    sys.setswitchinterval(before)


@pytest.fixture
def inside(monkeypatch):
    """Each background compile of a program notes the switch interval it runs under, then waits
    for ``release``: ``(release, seen)``."""
    release, seen = threading.Event(), []
    original = build.PendingSpecialization.compile

    def held(self):
        seen.append(sys.getswitchinterval())
        assert release.wait(60), "the test never released the compile"
        return original(self)

    monkeypatch.setattr(build.PendingSpecialization, "compile", held)
    yield release, seen
    release.set()


def _background(fn):
    return kiln.compile(fn, options=kiln.CompileOptions(wait=False))


def _settled(timeout: float = 10.0) -> float:
    """The switch interval once the compile threads have left ``sharing`` (they do so just after
    a job's ``done`` is set)."""
    deadline = time.monotonic() + timeout
    while background._sharing.running and time.monotonic() < deadline:
        time.sleep(0.001)
    return sys.getswitchinterval()


def test_a_program_compiling_in_the_background_shortens_the_switch_interval_until_it_is_done(interval, inside):
    release, seen = inside
    f = _background(lambda x: (x * 2).tanh().sum())
    x = kiln.tensor(np.linspace(-1, 2, 12, dtype=np.float32))
    f(x)  # traced: its compile starts and is held
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert seen == [SHORT]
    assert sys.getswitchinterval() == SHORT, "while it compiles"
    np.testing.assert_allclose(array(f(x)), np.tanh(x.numpy() * 2).sum(), rtol=1e-5)  # eagerly meanwhile
    release.set()
    assert f.wait_compiled(60)
    assert _settled() == _as_kept(DEFAULT), "the interval it found is back"
    np.testing.assert_allclose(array(f(x)), np.tanh(x.numpy() * 2).sum(), rtol=1e-5)
    assert len(state_of(f).specializations) == 1


def test_an_interval_set_while_compiling_stays_and_a_shorter_one_is_not_raised(interval, inside):
    release, seen = inside
    f = _background(lambda x: x + 1)
    f(kiln.ones(3))
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    sys.setswitchinterval(0.002)  # the user's own, meanwhile
    release.set()
    assert f.wait_compiled(60)
    assert _settled() == _as_kept(0.002)
    sys.setswitchinterval(background.SWITCH_INTERVAL / 2)  # already shorter: left as it is
    shorter = sys.getswitchinterval()
    with background.sharing():
        assert sys.getswitchinterval() == shorter
    assert sys.getswitchinterval() == shorter


def test_nested_and_overlapping_compiles_restore_once_the_last_is_done(interval):
    first, second = background.sharing(), background.sharing()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() == SHORT, "one compile still runs"
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == _as_kept(DEFAULT)


def test_an_eager_kernel_compiling_in_the_background_shortens_it_too(interval, on, monkeypatch):
    seen = []
    release = threading.Event()
    original = on._compile

    def held(*args):
        seen.append(sys.getswitchinterval())
        assert release.wait(60)
        return original(*args)

    monkeypatch.setattr(on, "_compile", held)
    x = kiln.tensor(np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32))
    np.testing.assert_allclose(array(x.tanh()), np.tanh(x.numpy()), rtol=1e-5)  # numpy meanwhile
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert seen == [SHORT]
    release.set()
    assert on.wait(60)
    assert _settled() == _as_kept(DEFAULT)


def test_the_callers_thread_is_not_held_a_switch_interval_per_release(interval):
    """A compile thread that runs Python without a pause (as the passes do) against a caller whose
    every step releases the interpreter's lock: at Python's 5 ms each release costs the caller up
    to 5 ms (the releases below would take >= 0.2 s); while ``sharing`` a fraction of that."""
    started, stop = threading.Event(), threading.Event()

    def spin():
        started.set()
        while not stop.is_set():
            sum(range(200))

    job = background.submit(spin)
    try:
        assert started.wait(10)
        releases = 40
        begin = time.perf_counter()
        for _ in range(releases):
            time.sleep(0)  # releases the lock, as a BLAS call does
        took = time.perf_counter() - begin
    finally:
        stop.set()
        assert job.wait(10)
    assert took < releases * DEFAULT / 2, f"{releases} releases took {took * 1e3:.1f} ms beside the compile"


def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.002)


@pytest.fixture
def order(on, monkeypatch):
    """Eager kernels on; each primitive kernel's compile notes its start and end and waits for
    ``release`` between them, each program's compile notes its start: ``(notes, release)``."""
    notes, release = [], threading.Event()
    kernel, program = on._compile, build.PendingSpecialization.compile

    def held_kernel(name, *args):
        notes.append(f"kernel {name}")
        assert release.wait(60), "the test never released the kernel"
        entry = kernel(name, *args)
        notes.append("kernel done")
        return entry

    def noted_program(self):
        notes.append("program")
        return program(self)

    monkeypatch.setattr(on, "_compile", held_kernel)
    monkeypatch.setattr(build.PendingSpecialization, "compile", noted_program)
    yield notes, release
    release.set()


def _tanh_input(seed: int):
    return kiln.tensor(np.random.default_rng(seed).standard_normal((64, 128)).astype(np.float32))


def test_the_program_compiles_first_and_the_calls_meanwhile_queue_no_kernels(inside, order):
    notes, _ = order
    release, _ = inside
    g = _background(lambda x: x.tanh() * 2.0)
    x = _tanh_input(2)
    expected = np.tanh(x.numpy()) * 2.0
    queued = eager_kernels.CACHE.queued
    for _ in range(3):  # the traced call, then two that run eagerly while the program compiles
        np.testing.assert_allclose(array(g(x)), expected, rtol=1e-5, atol=1e-6)
    _until(lambda: notes, "the program's compile")
    assert notes == ["program"], "no kernel compiled before the program"
    assert eager_kernels.CACHE.queued == queued, "none queued meanwhile"
    release.set()
    assert g.wait_compiled(60)
    np.testing.assert_allclose(array(g(x)), expected, rtol=1e-5, atol=1e-6)
    assert compiled_calls(g) == [1], "the program ran the call after it was ready"
    assert notes == ["program"]


def test_a_program_still_compiling_after_kernels_after_s_lets_its_calls_queue_kernels(inside, order, monkeypatch):
    notes, release_kernel = order
    release, _ = inside
    monkeypatch.setattr(background, "KERNELS_AFTER_S", 0.0)
    g = _background(lambda x: x.tanh() - 1.0)
    x = _tanh_input(3)
    expected = np.tanh(x.numpy()) - 1.0
    np.testing.assert_allclose(array(g(x)), expected, rtol=1e-5, atol=1e-6)  # traced: never queues
    _until(lambda: notes, "the program's compile")
    np.testing.assert_allclose(array(g(x)), expected, rtol=1e-5, atol=1e-6)  # eagerly, queueing its tanh
    _until(lambda: len(notes) > 1, "the kernel's compile")
    assert notes == ["program", "kernel tanh"]
    release_kernel.set()
    release.set()
    assert g.wait_compiled(60) and eager_kernels.wait(60)
    np.testing.assert_allclose(array(g(x)), expected, rtol=1e-5, atol=1e-6)


def test_kernels_its_calls_queued_are_dropped_once_the_program_is_ready(inside, order, monkeypatch):
    """Past ``KERNELS_AFTER_S`` a call queues its kernels; those whose compile has not started when
    the program is ready are not compiled (nothing would run them), and their keys are forgotten."""
    notes, release_kernels = order
    release, _ = inside
    monkeypatch.setattr(background, "KERNELS_AFTER_S", 0.0)
    g = _background(lambda x: x.tanh().exp())
    x = _tanh_input(5)
    expected = np.exp(np.tanh(x.numpy()))
    g(x)  # traced
    _until(lambda: notes, "the program's compile")
    np.testing.assert_allclose(array(g(x)), expected, rtol=1e-5)  # eagerly: queues tanh, then exp
    _until(lambda: len(notes) > 1, "the tanh kernel's compile")
    release.set()
    _until(lambda: state_of(g).specializations, "the program")
    release_kernels.set()
    assert eager_kernels.wait(60)
    assert notes == ["program", "kernel tanh", "kernel done"], "exp's compile was dropped"
    assert [key[0] for key in eager_kernels.CACHE.entries] == ["tanh"]
    np.testing.assert_allclose(array(g(x)), expected, rtol=1e-5)
    assert compiled_calls(g) == [1]
    np.testing.assert_allclose(array(x.exp()), np.exp(x.numpy()), rtol=1e-5)  # an eager call queues it again
    assert eager_kernels.wait(60)
    assert notes[3:] == ["kernel exp", "kernel done"]


def test_kernels_queued_by_other_calls_do_not_hold_the_program_back(order):
    notes, release = order
    x = _tanh_input(4)
    np.testing.assert_allclose(array(x.tanh()), np.tanh(x.numpy()), rtol=1e-5)  # undecorated: queues its kernel
    _until(lambda: notes, "the kernel's compile")
    g = _background(lambda x: x.tanh() + 1.0)
    g(x)
    _until(lambda: state_of(g).specializations, "the program, while the kernel is still held", timeout=30.0)
    assert notes == ["kernel tanh", "program"]
    np.testing.assert_allclose(array(g(x)), np.tanh(x.numpy()) + 1.0, rtol=1e-5, atol=1e-6)
    assert compiled_calls(g) == [1]
    release.set()


@pytest.fixture
def two_blas_threads():
    """BLAS on two threads for the test (where the BLAS lets kiln set its threads), put back after."""
    blas = threads._blas
    if not blas.found:
        threads._find_blas()
    if blas.get_threads is None or blas.set_threads is None:
        pytest.skip("no BLAS whose threads kiln sets (OpenBLAS)")
    before = blas.get_threads()
    blas.set_threads(2)
    yield blas.get_threads
    blas.set_threads(before)


def test_blas_runs_on_one_thread_while_a_program_compiles_in_the_background(interval, inside, two_blas_threads):
    """The compile's LLVM worker then has a core the caller's second BLAS thread took."""
    release, seen = inside
    blas_threads = two_blas_threads
    f = _background(lambda a, b: (a @ b).relu())
    rng = np.random.default_rng(4)
    a = kiln.tensor(rng.standard_normal((96, 64)).astype(np.float32))
    b = kiln.tensor(rng.standard_normal((64, 80)).astype(np.float32))
    expected = np.maximum(a.numpy() @ b.numpy(), 0)
    np.testing.assert_allclose(array(f(a, b)), expected, rtol=1e-4, atol=1e-5)
    _until(lambda: seen, "the compile to start")
    assert blas_threads() == 1, "while it compiles"
    np.testing.assert_allclose(array(f(a, b)), expected, rtol=1e-4, atol=1e-5)  # eagerly, on one thread
    release.set()
    assert f.wait_compiled(60)
    _settled()
    assert blas_threads() == 2, "the count it found is back"
    np.testing.assert_allclose(array(f(a, b)), expected, rtol=1e-4, atol=1e-5)


def test_with_eager_kernels_off_the_program_compiles_at_once():
    """The suite runs with them off."""
    g = _background(lambda x: x * 2.0 + 1.0)
    x = kiln.tensor(np.arange(5, dtype=np.float32))
    np.testing.assert_allclose(array(g(x)), x.numpy() * 2.0 + 1.0)
    _until(lambda: state_of(g).specializations, "the program", timeout=30.0)
    np.testing.assert_allclose(array(g(x)), x.numpy() * 2.0 + 1.0)
    assert compiled_calls(g) == [1]
