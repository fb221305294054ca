"""LLVM compiling a program's first modules while Python generates the rest.

The backend generates a program's kernels one by one (Python, one core) and LLVM compiles their
modules (the compile workers, or this process): one after the other, DCGAN's code generation
(~0.1 s) waited for the end of generation before LLVM's ~0.25 s started. A ``CompileStream`` takes
each module as soon as it is full (``kernel_modules.Modules``) and compiles it on a thread of its
own while the generator goes on: each request is ``engine.compile_many`` of one module, so a time
limit, a worker that cannot start, and in-process compiles behave as in one request. LLVM runs in
C (the worker's pipe read, or llvmlite's calls) without the interpreter lock, so generation and
LLVM overlap on two cores -- where a core is idle (``worth_it``).

>>> stream = CompileStream(timeout=60.0)
>>> stream.submit("define i64 @seven() {\\n  ret i64 7\\n}\\n")
>>> [len(code) > 0 for code in stream.finish()]
[True]
"""

from __future__ import annotations

import threading
import time
from collections import deque

from . import engine, worker, worker_pool


def worth_it() -> bool:
    """Whether to compile while generating: where a core is idle (``worker_pool._idle_core``, by the
    CPU's idle time since the compile began). On a busy machine -- a background compile beside the
    eager calls it runs for, other processes -- LLVM would take CPU time from them and finish no
    sooner: the backend then compiles every module in one request once all are generated, as before."""
    return worker_pool._idle_core()


def _threads() -> int:
    """Threads that compile at once: two (one per compile worker; in-process compiles take turns),
    one where the second worker cannot start or no worker can."""
    return 1 if worker.WORKER.broken or worker.SPARE.broken else 2


class CompileStream:
    """Modules compiled in order of ``submit``, each on the first free thread (of ``threads``; None:
    ``_threads()``), within ``timeout`` seconds of the stream's start (None: no limit); ``finish``
    gives their object code in order."""

    def __init__(self, timeout: float | None, threads: int | None = None) -> None:
        self._count = threads
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._texts: list[str] = []
        self._objects: dict[int, bytes] = {}
        self._queue: deque[int] = deque()  # submitted modules no thread has taken yet
        self._done = False  # no more modules come
        self._errors: list[BaseException] = []
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []

    def submit(self, text: str) -> None:
        """Compile the module ``text`` (LLVM IR; several joined by ``engine.join_modules``) soon."""
        with self._changed:
            assert not self._done, "a module submitted to a finished stream"
            self._texts.append(text)
            self._queue.append(len(self._texts) - 1)
            self._changed.notify()
        if not self._threads:  # the first module: a thread starts now, not before work exists
            self._start_thread()

    def finish(self) -> list[bytes]:
        """Each submitted module's object code, in order, once all are compiled; the first error a
        compile raised (``worker.CompileTimeout`` past the time limit, ``RuntimeError`` where LLVM
        failed), once no thread compiles any more. While the generator ran, one thread compiled
        (the generator has one core, LLVM the other: a second LLVM process would share a core with
        one of them); from now on, ``threads`` do."""
        with self._changed:
            self._done = True
            self._changed.notify_all()
        while self._queue and len(self._threads) < (self._count or _threads()):
            self._start_thread()
        for thread in self._threads:
            thread.join()
        if self._errors:
            raise self._errors[0]
        return [self._objects[k] for k in range(len(self._texts))]

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._serve, daemon=True, name=f"kiln-compile-stream-{len(self._threads)}")
        self._threads.append(thread)
        thread.start()

    def cancel(self) -> None:
        """Compile nothing more (the generator failed): modules not started are dropped; a compile
        under way ends on its own thread (within the time limit), which then releases its worker."""
        with self._changed:
            self._done = True
            self._queue.clear()
            self._changed.notify_all()

    def _serve(self) -> None:
        """One thread's loop: the next module, until none is left and none will come, or one failed."""
        while True:
            with self._changed:
                while not self._queue and not self._done and not self._errors:
                    self._changed.wait()
                if self._errors or not self._queue:
                    return
                k = self._queue.popleft()
            try:
                (code,) = engine.compile_many([self._texts[k]], self._seconds_left())
            except BaseException as error:  # noqa: BLE001 - raised by finish, in the generating thread
                with self._changed:
                    self._errors.append(error)
                    self._changed.notify_all()
                return
            with self._changed:
                self._objects[k] = code

    def _seconds_left(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()
