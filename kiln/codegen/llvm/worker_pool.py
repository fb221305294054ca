"""The two compile workers (``worker.WORKER`` and ``worker.SPARE``), shared by the threads that compile.

A request of ``SHARE_FROM`` modules or more is split between the two workers where both are free
and a core is idle (``_idle_core``: by the CPU's idle time since the compile's passes began, else
by the load average), costliest modules first, in chunks that the worker done first takes over
(``_shared``). LLVM compiles each module on its own, so two processes take about half the time --
a caller waiting for its compile leaves a core free. On a busy machine one request is not shared:
a second process would take CPU time from other work and finish no sooner. A second thread (a
compile in the background beside an eager kernel's) is served by ``SPARE`` while ``WORKER`` serves
the first, idle core or not (``_second``). A ``SPARE`` that cannot start is marked broken and
``WORKER`` does its part; ``OSError`` says that ``WORKER`` cannot start (the caller then compiles
in its own process).
"""

from __future__ import annotations

import os
import threading
import time

from . import worker
from .engine import TINY
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
    """Whether a core is left idle here: only then does a second worker make a compile sooner. On a
    busy machine it would take CPU time from other work -- the eager calls running meanwhile, or
    other processes -- and finish no sooner. Judged by the idle time since the last look
    (``_idle_cores_since``: a compile looks when its passes start, in ``start_all``, and again when
    its code goes to LLVM), else by the last minute's load average -- which counts this process's
    own work of that minute as well (a training loop, a trace), though it waits for its compile now."""
    if _cores() < 2:  # this process may run on one core only: a second worker would share it
        return False
    idle = _idle_cores_since()
    if idle is not None:
        return idle >= IDLE_CORES
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): judge by the cores alone
        load = 0.0
    return load <= _cores() - 1


#: Cores idle on average since the last look (``_idle_cores_since``) for a second worker to be worth
#: starting: the looking thread is busy (its passes, its code generator), so on a quiet machine of
#: two cores one is idle, and with another process running none.
IDLE_CORES = 0.5

_CPU_WINDOW = (0.02, 10.0)  # seconds between two looks that say something about now
_last_look: tuple[float, int, int] | None = None  # (_clock(), idle, total) of /proc/stat
_clock = time.monotonic


def _cpu_times() -> tuple[int, int] | None:
    """Linux's idle and total CPU time over every core (``/proc/stat``, in clock ticks), or None.
    The time the compile workers have run counts as idle: they are this compile's, and while the
    passes run they are starting (Python and llvmlite, ~0.1 s of CPU: on a quiet machine of two
    cores, most of the core the passes leave idle). A worker that ended meanwhile takes its time
    with it: the window then looks busier than it was, which at worst compiles as before."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = stat.readline().split()
        ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    if fields[:1] != [b"cpu"] or len(ticks) < 5:
        return None
    return ticks[3] + ticks[4] + _worker_ticks(), sum(ticks)


def _worker_ticks() -> int:
    """The CPU time (clock ticks, user and system) the compile workers running now have used."""
    total = 0
    for chosen in (worker.WORKER, worker.SPARE):
        process = chosen._process
        if process is None:
            continue
        try:
            with open(f"/proc/{process.pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()  # after the command's name
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, ValueError, IndexError):  # it ended meanwhile
            continue
    return total


def _idle_cores_since() -> float | None:
    """The cores idle on average since the last look (None: no /proc/stat, no earlier look, or one
    too old to tell, ``_CPU_WINDOW``). A look too soon after the last one (a thread that waited for a
    worker, an eager kernel's compile) says nothing and keeps the last look for the next."""
    global _last_look
    now, times = _clock(), _cpu_times()
    if times is None:
        return None
    last = _last_look
    if last is not None and now - last[0] < _CPU_WINDOW[0]:
        return None
    _last_look = (now, *times)
    if last is None or now - last[0] > _CPU_WINDOW[1] or times[1] <= last[2]:
        return None
    return (times[0] - last[1]) / (times[1] - last[2]) * (os.cpu_count() or 1)


def look() -> None:
    """Start a window of ``_idle_core``'s measure now (a compile begins)."""
    _idle_cores_since()


def _usable() -> list[Worker]:
    """``WORKER``, and ``SPARE`` where it works and a core is idle for it (``_idle_core``)."""
    return [worker.WORKER] + ([worker.SPARE] if not worker.SPARE.broken and _idle_core() else [])


def _claim(share: bool, wait: bool = True) -> list[Worker]:
    """The free workers: one (waiting for one to be free, unless not ``wait``: then maybe none), or
    every free one when ``share``. A request not shared takes ``SPARE`` while ``WORKER`` serves
    another thread, however busy the machine (``_second``)."""
    with _released:
        while True:
            free = [w for w in _usable() if not w.busy] or _second(share)
            if free or not wait:
                taken = free if share else free[:1]
                for w in taken:
                    w.busy = True
                return taken
            _released.wait()


def _second(share: bool) -> list[Worker]:
    """``[SPARE]`` for a request not ``share``d while ``WORKER`` serves another thread, where it
    works and is free. On a busy machine too: the two requests are different compiles, and waiting
    would put a small one (an eager kernel's module, 10-40 ms of LLVM) behind a whole program's
    (DCGAN's 63 modules, 2-3 s on a loaded 2-core machine) -- its kernel then came no sooner than the
    program did. Sharing the cores, the small one is done in a fraction of that time."""
    spare = worker.SPARE
    if share or spare.broken or spare.busy or not worker.WORKER.busy:
        return []
    return [spare]


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
    """The modules compiled by the two workers at once, each taking the next chunk (``_chunks``: the
    costliest first) when it is done with its last: the one that finishes early takes more, instead
    of waiting for the other's fixed half (the two halves of a DCGAN finished 10% apart). A
    ``SPARE`` that cannot start puts its chunk back for the first worker."""
    chunks = _chunks(texts)
    objects: dict[int, bytes] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def serve(chosen: Worker) -> None:
        while True:
            with lock:
                if errors or not chunks:
                    return
                chunk = chunks.pop(0)
            try:
                compiled = chosen.compile_many([texts[i] for i in chunk], _left(deadline))
            except OSError as error:
                with lock:
                    if chosen is worker.SPARE:  # it did not start: WORKER serves alone from now on
                        worker.SPARE.broken = True
                        chunks.insert(0, chunk)
                    else:
                        errors.append(error)
                return
            except BaseException as error:  # noqa: BLE001 - raised in the calling thread below
                with lock:
                    errors.append(error)
                return
            with lock:
                objects.update(zip(chunk, compiled, strict=True))

    thread = threading.Thread(target=serve, args=(second,), daemon=True, name="kiln-compile-share")
    thread.start()
    try:
        serve(first)
    finally:
        thread.join()
    if errors:
        raise errors[0]
    if chunks:  # what a SPARE that could not start put back after the first worker was done
        serve(first)
        if errors:
            raise errors[0]
    return [objects[i] for i in range(len(texts))]


#: Chunks a shared request is cut into per worker: a few, so that the worker that finishes first
#: takes over the rest, each holding several modules, so that the round trips stay few.
CHUNKS_PER_WORKER = 4


def _chunks(texts: list[str]) -> list[list[int]]:
    """The modules' positions in ``2 * CHUNKS_PER_WORKER`` chunks (or fewer), costliest first by
    ``_cost``: each chunk takes the next modules in that order, each in order."""
    order = sorted(range(len(texts)), key=lambda i: -_cost(texts[i]))
    size = -(-len(texts) // (2 * CHUNKS_PER_WORKER))
    return [sorted(order[k : k + size]) for k in range(0, len(order), size)]


def _cost(text: str) -> float:
    """A module's LLVM time, roughly: its length, a tenth of it for a ``TINY`` one (LLVM's fast path)."""
    return len(text) / 10 if text.startswith(TINY) else len(text)
