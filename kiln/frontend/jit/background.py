"""Compiles in the background: a few daemon threads that compile traced calls while calls run eagerly.

``kiln.compile`` (with ``CompileOptions.wait`` false, the default) traces a call while it runs
eagerly, then hands the rest of the work -- the pass pipeline, code generation and loading -- to
this pool and returns the eager result at once. Calls that come meanwhile run eagerly; the
specialization is installed when its compile is done, and later calls run it.

The threads are daemons and LLVM's compile worker dies with its parent (``codegen/llvm/worker.py``),
so a process may exit with compiles pending: they are dropped. ``wait(timeout)`` waits for the
compiles pending now (``kiln.jit.wait_compiled``, as ``jax.block_until_ready`` waits for results).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("kiln")

#: Compiles that run at once. Two: LLVM runs in a worker process without the interpreter's lock, so
#: a second thread can run the passes of another function meanwhile; more would only take cores
#: from the eager calls running in the foreground.
WORKERS = 2


class Job:
    """One compile handed to the pool: ``done`` is set when ``run`` has returned or raised."""

    __slots__ = ("run", "done", "pid")

    def __init__(self, run: Callable[[], None]) -> None:
        self.run = run
        self.done = threading.Event()
        self.pid = os.getpid()

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
    pending compiles stay pending there: such calls run eagerly in the child)."""
    global _pool
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def submit(run: Callable[[], None]) -> Job:
    """Run ``run()`` on a compile thread; it must catch and report its own errors."""
    return _pool.submit(run)


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
