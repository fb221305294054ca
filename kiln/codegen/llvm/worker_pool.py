"""The two compile workers (``worker.WORKER`` and ``worker.SPARE``), shared by the threads that compile.

A request of ``SHARE_FROM`` modules or more is split between the two workers where both are free
and a core is idle (``_idle_core``): LLVM compiles each module on its own, so two processes take
about half the time -- a caller waiting for its compile leaves a core free. A second thread (a
compile in the background beside an eager kernel's) is served by the other worker meanwhile
instead of waiting. On a busy machine only ``WORKER`` serves: a second process would take CPU time
from other work and finish no sooner. A ``SPARE`` that cannot start is marked broken and
``WORKER`` does its part; ``OSError`` says that ``WORKER`` cannot start (the caller then compiles
in its own process).
"""

from __future__ import annotations

import os
import threading
import time

from . import worker
from .worker import Worker

#: Modules in one request from which it is shared between the two workers: below, waiting for two
#: processes gains too little.
SHARE_FROM = 4

_released = threading.Condition()  # notified when a worker is released


def _forget_claims() -> None:
    """A forked child has none of the threads that had claimed its parent's workers."""
    global _released
    _released = threading.Condition()
    worker.WORKER.busy = worker.SPARE.busy = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_claims)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _idle_core() -> bool:
    """Whether a core is left idle here (the last minute's load average): only then does a second
    worker make a compile sooner. On a busy machine it would take CPU time from other work -- the
    eager calls running meanwhile, or other processes -- and finish no sooner."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): judge by the cores alone
        load = 0.0
    return load <= _cores() - 1


def _usable() -> list[Worker]:
    """``WORKER``, and ``SPARE`` where it works and a core is idle for it (``_idle_core``)."""
    return [worker.WORKER] + ([worker.SPARE] if not worker.SPARE.broken and _idle_core() else [])


def _claim(share: bool, wait: bool = True) -> list[Worker]:
    """The free workers: one (waiting for one to be free, unless not ``wait``: then maybe none), or
    every free one when ``share``."""
    with _released:
        while True:
            free = [w for w in _usable() if not w.busy]
            if free or not wait:
                taken = free if share else free[:1]
                for w in taken:
                    w.busy = True
                return taken
            _released.wait()


def _release(workers: list[Worker]) -> None:
    with _released:
        for w in workers:
            w.busy = False
        _released.notify_all()


def start_all() -> None:
    """Start every usable worker that is free and not running (``OSError`` when ``WORKER`` cannot
    start; ``SPARE`` that cannot start is marked broken)."""
    workers = _claim(share=True, wait=False)
    try:
        for w in workers:
            try:
                w.start()
            except OSError:
                if w is not worker.SPARE:
                    raise
                worker.SPARE.broken = True
    finally:
        _release(workers)


def compile_in_workers(texts: list[str], timeout: float | None = None) -> list[bytes]:
    """``Worker.compile_many`` on a free worker, or shared between both where the request holds
    ``SHARE_FROM`` modules or more and both are free (the objects come back in order).
    ``OSError`` when ``WORKER`` cannot start (``SPARE`` that cannot start is marked broken; ``WORKER``
    does its part)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    workers = _claim(share=len(texts) >= SHARE_FROM)
    try:
        if len(workers) == 1:
            return _on(workers[0], texts, deadline)
        return _shared(workers[0], workers[1], texts, deadline)
    finally:
        _release(workers)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(1e-3, deadline - time.monotonic())


def _on(chosen: Worker, texts: list[str], deadline: float | None) -> list[bytes]:
    try:
        return chosen.compile_many(texts, _left(deadline))
    except OSError:
        if chosen is not worker.SPARE:
            raise
        worker.SPARE.broken = True  # WORKER serves alone from now on
        return compile_in_workers(texts, _left(deadline))


def _shared(first: Worker, second: Worker, texts: list[str], deadline: float | None) -> list[bytes]:
    """The modules split in two of about equal length, compiled at once by the two workers."""
    ours, theirs = _halves(texts)
    got: dict[str, object] = {}

    def other() -> None:
        try:
            got["objects"] = second.compile_many([texts[i] for i in theirs], _left(deadline))
        except BaseException as error:  # noqa: BLE001 - raised in the calling thread below
            got["error"] = error

    thread = threading.Thread(target=other, daemon=True, name="kiln-compile-share")
    thread.start()
    try:
        objects = dict(zip(ours, first.compile_many([texts[i] for i in ours], _left(deadline)), strict=True))
    finally:
        thread.join()
    error = got.get("error")
    if isinstance(error, OSError) and second is worker.SPARE:  # SPARE did not start: the first worker does its part
        worker.SPARE.broken = True
        got["objects"] = first.compile_many([texts[i] for i in theirs], _left(deadline))
    elif isinstance(error, BaseException):
        raise error
    objects.update(zip(theirs, got["objects"], strict=True))  # type: ignore[call-overload]
    return [objects[i] for i in range(len(texts))]


def _halves(texts: list[str]) -> tuple[list[int], list[int]]:
    """The modules' positions in two groups of about equal text length (longest first, each to the
    lighter group), each in order."""
    groups: tuple[list[int], list[int]] = ([], [])
    sizes = [0, 0]
    for i in sorted(range(len(texts)), key=lambda i: -len(texts[i])):
        lighter = 0 if sizes[0] <= sizes[1] else 1
        groups[lighter].append(i)
        sizes[lighter] += len(texts[i])
    return sorted(groups[0]), sorted(groups[1])
