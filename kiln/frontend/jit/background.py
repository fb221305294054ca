"""Compiles in the background: a few daemon threads that compile traced calls while calls run eagerly.

``kiln.compile`` (with ``CompileOptions.wait`` false, the default) traces a call while it runs
eagerly, then hands the rest of the work -- the pass pipeline, code generation and loading -- to
this pool and returns the eager result at once. Calls that come meanwhile run eagerly; the
specialization is installed when its compile is done, and later calls run it.

The threads are daemons and LLVM's compile worker dies with its parent (``codegen/llvm/worker.py``),
so a process may exit with compiles pending: they are dropped. ``wait(timeout)`` waits for the
compiles pending now (``kiln.jit.wait_compiled``, as ``jax.block_until_ready`` waits for results).

A compile thread sends a program's passes and code generation to the program worker, a process of
its own (``kiln.compiler.program_worker``), and waits for it without the interpreter's lock: a DCGAN
compile held the lock 320 ms on the thread, 64 ms now (reading the reply, the stages after fusion,
loading; 43 ms of it the first compile's imports). What the worker cannot take compiles on the thread.

A compile thread holds the interpreter's lock for its Python work (the passes, building LLVM IR).
The caller's thread releases that lock in every BLAS call and numpy loop, and waits for it after:
at Python's default switch interval (5 ms) it waits up to 5 ms each time, and an eager step of a
few hundred such calls ran 3-6x slower while a compile held the lock. ``sharing()`` (around each
background compile here and in ``eager_kernels``) lowers the interval to ``SWITCH_INTERVAL`` while
any runs, so the caller waits a fraction of a millisecond instead, and restores it after. It
also runs BLAS on one thread meanwhile: LLVM compiles in a worker process, a priority below the
caller's (``codegen/llvm/worker.py``), and a second BLAS thread took the core it needs, starving
it (a CNN's eager kernels, LLVM-bound, compiled for most of a 200-step run); one BLAS thread
leaves it that core (the run 1.6x faster, loaded 2-core machine: ``_Sharing``).

A program's compile goes first (``Job.defers_kernels``): the traced call and the calls that run
eagerly while the program compiles queue no eager kernels (``eager_kernels.deferred``), for
``KERNELS_AFTER_S`` at most -- the program replaces every op of those calls, and a kernel compiled
meanwhile takes the interpreter and the cores from the program's compile. Letting the kernels go
first (the order before) put the program behind 17-25 kernel compiles (0.5 s and more on a quiet
machine): DCGAN's program was ready at step 131 of 200, the CNN's not within the run, and both
runs were slower than not decorating the step. A program that is not ready after
``KERNELS_AFTER_S`` (a long compile, a busy machine) lets the calls queue their kernels again: they
then run as an undecorated function's would until it is ready, and the kernels whose compile has
not started by then are dropped (``eager_kernels.moot_once``).
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable

from ...compiler import program_worker
from ...runtime import threads

logger = logging.getLogger("kiln")

#: Compiles that run at once. Two: LLVM runs in a worker process without the interpreter's lock, so
#: a second thread can run the passes of another function meanwhile; more would only take cores
#: from the eager calls running in the foreground.
WORKERS = 2
#: How long (seconds from the trace) the calls made while their program compiles run eagerly without
#: queueing eager kernels (``Job.defers_kernels``); a longer compile lets the calls have their kernels
#: meanwhile. DCGAN's and the CNN's programs compile in 0.5-0.6 s waited for, but in 1.0-1.5 s in the
#: background, where the eager calls share the 2 cores: at 1.0 the kernels then came in the middle of the
#: program's compile, and delayed it to 1.6-2.1 s. At 3.0, 200-step background runs (empty cache, quiet
#: 2-core machine, 3-4 runs each): the CNN 1.22-2.27 -> 1.25-1.49 s, DCGAN 1.14-2.13 -> 1.25-1.78,
#: GPT 3.16-4.76 -> 3.34-4.38; the LSTM LM (ready in 0.8 s) and 25 steps of the LSTMCell loop unchanged
#: within noise.
KERNELS_AFTER_S = 3.0
#: The interpreter's switch interval (seconds) while a compile runs in the background: an eager
#: DCGAN step beside a thread running Python took 3.7 ms alone, 22.5 at the default 5 ms, 8.2 at
#: 0.5 ms and 7.8 at 0.1 ms (a CNN step 3.5-7.5 alone, 17-20, 8.5-12, 7.7-7.8). Shorter makes
#: each switch's cost (a few microseconds) show.
SWITCH_INTERVAL = 0.0002


def _set_switch_interval(seconds: float) -> None:
    """Put back an interval ``sys.getswitchinterval`` gave: Python keeps whole microseconds and
    truncates, so the value read back (5000 us as 0.004999...) would lose a microsecond each time."""
    sys.setswitchinterval(seconds + 1e-7)


class _Sharing:
    """Counts the compiles running in the background; the first lowers the switch interval and
    limits BLAS to one thread, the last puts back the interval it found (unless someone set another
    meanwhile, which stays) and BLAS's threads.

    CNN, 200 steps in fresh processes, a loaded 2-core machine, rounds interleaved: eager (kernels
    compiled at their first call) 3.4 / 3.0 / 1.9 s; decorated, before (kernels deferred, 5 ms,
    2 BLAS threads) 7.6 / 8.0 / 7.2 s; now 2.2 / 2.8 / 2.6 s. DCGAN: 2.0 / 1.9 / 1.9; 2.8 / 2.7 /
    2.8; 2.4 / 1.8 / 1.9 s."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.before: float | None = None  # the interval found, while lowered
        self.lowered = 0.0
        self.blas = threads.SmallProducts(0)  # one BLAS thread, the count found put back after

    def __enter__(self) -> None:
        with self.lock:
            self.running += 1
            if self.running > 1:
                return
            self.blas.__enter__()
            if sys.getswitchinterval() > SWITCH_INTERVAL:
                self.before = sys.getswitchinterval()
                sys.setswitchinterval(SWITCH_INTERVAL)
                self.lowered = sys.getswitchinterval()  # as Python keeps it (whole microseconds)

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.running -= 1
            if self.running > 0:
                return
            self.blas.__exit__()
            if self.before is not None:
                if sys.getswitchinterval() == self.lowered:
                    _set_switch_interval(self.before)
                self.before = None


_sharing = _Sharing()


def sharing() -> _Sharing:
    """A context for a compile running beside the caller's thread: while any such compile runs, the
    interpreter switches threads every ``SWITCH_INTERVAL`` seconds (see the module's docstring)."""
    return _sharing


class Job:
    """One compile handed to the pool: ``done`` is set when ``run`` has returned or raised."""

    __slots__ = ("run", "done", "pid", "submitted")

    def __init__(self, run: Callable[[], None]) -> None:
        self.run = run
        self.done = threading.Event()
        self.pid = os.getpid()
        self.submitted = time.monotonic()

    def defers_kernels(self) -> bool:
        """Whether the calls that run eagerly while this compile is pending should queue no eager
        kernels (``eager_kernels.deferred``): until it is done, or ``KERNELS_AFTER_S`` have passed
        since it was submitted (see the module's docstring). Never in a forked child, where it never
        finishes."""
        if self.done.is_set() or self.pid != os.getpid():
            return False
        return time.monotonic() - self.submitted < KERNELS_AFTER_S

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the compile finished within ``timeout`` seconds (None: wait as long as it takes).
        In a forked child a compile of its parent's never finishes (no thread runs it): False at once
        (its calls run eagerly there)."""
        if self.pid != os.getpid():
            return self.done.is_set()
        return self.done.wait(timeout)


class _Pool:
    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.pending: set[Job] = set()
        self.lock = threading.Lock()

    def submit(self, run: Callable[[], None]) -> Job:
        job = Job(run)
        with self.lock:
            self.pending.add(job)
            if len(self.threads) < min(WORKERS, len(self.pending)):
                thread = threading.Thread(target=self._work, name=f"kiln-compile-{len(self.threads)}", daemon=True)
                self.threads.append(thread)
                thread.start()
        self.queue.put(job)
        return job

    def _work(self) -> None:
        while True:
            job = self.queue.get()
            try:
                with _sharing, program_worker.on_this_thread():
                    job.run()
            except BaseException:  # a job says its own errors; this keeps the thread serving
                logger.exception("kiln: a background compile raised")
            finally:
                with self.lock:
                    self.pending.discard(job)
                job.done.set()


_pool = _Pool()


def _forget_after_fork() -> None:
    """A forked child has none of its parent's threads: it starts a pool of its own (the parent's
    pending compiles stay pending there: such calls run eagerly in the child), and the switch
    interval and BLAS threads its parent had before its compiles changed them."""
    global _pool, _sharing
    _pool = _Pool()
    if _sharing.running:
        _sharing.blas.__exit__()
    if _sharing.before is not None and sys.getswitchinterval() == _sharing.lowered:
        _set_switch_interval(_sharing.before)
    _sharing = _Sharing()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def submit(run: Callable[[], None]) -> Job:
    """Run ``run()`` on a compile thread; it must catch and report its own errors."""
    return _pool.submit(run)


def busy() -> bool:
    """Whether a compile is pending or running in the background now."""
    return bool(_pool.pending)


def wait(jobs=None, timeout: float | None = None) -> bool:
    """Wait for ``jobs`` (default: every compile pending now); whether all finished within ``timeout``."""
    with _pool.lock:
        waiting = list(_pool.pending if jobs is None else jobs)
    deadline = None if timeout is None else time.monotonic() + timeout
    for job in waiting:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not job.wait(left):
            return False
    return True
