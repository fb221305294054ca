"""The eager kernels' cache and the order its thread compiles the keys in (``eager_kernels``).

A fresh process runs each eager op on numpy until its kernel is compiled, one key at a time on one
background thread, so the time to the steady state is the sum of the compiles that come first. The
thread takes the pending key worth most (``_take``), and compiles nothing a run would not use:

- **worth**: the numpy time a key has cost so far (its fastest numpy run times its calls); keys whose
  numpy run is not timed (a matrix product, a recurrence) first, in the order they came. A fused
  optimizer step's numpy run is its optimizer's loop (``fused_steps.timed_loop``).
  A CNN's 24 kernels came in the order of the first step's ops: its ``maximum``/``where`` calls of a
  few microseconds compiled before its batch normalizations' and its optimizer's.
- **covered**: a key first met inside the numpy run of a composite op whose own kernel is pending, or
  inside its trace on this thread (``covering``), is compiled after it, and not at all once it is
  compiled: its calls stop (a CNN compiled 8 such kernels, 0.45 s of its 2 s of compiles, after
  pooling's and the normalizations' programs).
- **stale**: a key not called for ``STALE_STEPS`` steps (estimated from the keys' calls, at least
  ``STALE_LOOKUPS`` lookups) is not compiled: a composite's numpy backward, or Adam's numpy loop,
  queued it, and their programs run the calls now. The key is parked: its next call queues it again,
  and it is then parked stale only after ``REVIVED_FACTOR`` times as long (a key called every few
  steps, or less often than the estimate of a step says, compiles at its turn rather than being
  parked at every turn; one whose calls stopped after a few more, as a CNN's ``where`` of ReLU's
  backward did while batch normalization still ran on numpy, does not).
- **never worth it**: a key whose numpy run takes under ``MIN_NUMPY_SECONDS`` stays on numpy
  uncompiled (a compiled call's fixed cost alone is about that: ``eager_kernels.trial`` kept numpy
  for every such key of the benchmarks' runs).

While a program compiles in the background (``kiln.compile``'s default: the calls queue kernels once
``background.KERNELS_AFTER_S`` have passed), the keys compile in the order they came, as before
the worth rule: worth put a CNN's composite ops first, whose traces run on this thread, holding the
interpreter the program's compile needs (its program was ready later in 4 of 5 runs, loaded 2-core
machine); the kernels of primitives compile in the LLVM worker, a priority below.

These rules read only counters (lookups, calls, the numpy times the callers note), so a test can set
the entries up and ask ``_take`` what comes next. ``counts`` says how many keys each rule met.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..compiler import program_worker
from .jit import background

#: A key whose fastest numpy run takes less (seconds) stays on numpy without a compile: the trials of
#: the benchmarks' kernels (2-core machine, loaded) kept numpy at 3 us against 9 compiled (tanh,
#: sqrt of 16-32 KB) and at 13-14 us against 14-17 (unfold of 32 KB): a compiled call costs a few
#: microseconds before it reads its inputs.
MIN_NUMPY_SECONDS = 8e-6
#: A key not called for this many steps is stale (``_stale``): most keys are called once a step, some
#: several times (the estimate is then short).
STALE_STEPS = 3
#: ... and for this many lookups at least: a CNN's or DCGAN's step makes 28, a GPT's 56.
STALE_LOOKUPS = 64
#: A key called again after it was parked is stale after this many times as long.
REVIVED_FACTOR = 10


@dataclass
class Entry:
    """One key's state: compiling (``program`` and ``reason`` None), compiled, or on numpy (``reason``)."""

    program: Callable[[list], list] | None = None
    write_backs: tuple[tuple[int, int], ...] = ()  # (output, input) pairs: the input takes the output
    reason: str | None = None
    failed: bool = False  # the reason is a failure (said once per op), not a decline (logged)
    cache: str = ""  # the driver's disk cache: "hit", "miss" or "off"
    seconds: float = 0.0  # how long the compile took
    # the key's ``trial``: its fastest numpy and compiled runs, and how many compiled runs were timed
    numpy_seconds: float = math.inf
    compiled_seconds: float = math.inf
    trials: int = 0
    started: bool = False  # its compile has begun (the worker's, or a caller's: ``KernelCache.now``)
    # the order's counters (``_take``): its lookups, the cache's lookup count at its first and latest
    calls: int = 0
    first_call: int = 0
    last_call: int = 0
    cover: tuple | None = None  # the composite op's key whose numpy run first met it (``covering``)
    parked: bool = False  # taken off the queue uncompiled (stale, covered): its next call queues it
    revived: bool = False  # called again after it was parked: stale only after REVIVED_FACTOR times as long

    def settled(self, made: Entry) -> Entry:
        """``made`` (this key's compile) with what the cache knows of the key's calls carried over."""
        for name in _CARRIED:
            setattr(made, name, getattr(self, name))
        made.started = True
        return made


#: What an ``Entry`` knows of its key's calls, carried over to the entry its compile makes.
_CARRIED = ("numpy_seconds", "calls", "first_call", "last_call", "cover", "revived")


_thread = threading.local()  # this thread's ``deferred``/``moot_once``/``covering`` (``eager_kernels``)


@contextlib.contextmanager
def in_this_thread(name: str, value):
    """``_thread.<name>`` set to ``value`` in this thread, and what it was put back after."""
    before = getattr(_thread, name, None)
    setattr(_thread, name, value)
    try:
        yield
    finally:
        setattr(_thread, name, before)


@contextlib.contextmanager
def covering(key: tuple):
    """In this thread, keys met for the first time are covered by ``key`` (see the module docstring):
    the numpy run of the composite op of ``key`` while its kernel is pending, and the trace its compile
    runs. The outermost cover stays (a composite op calling another)."""
    if getattr(_thread, "cover", None) is not None:
        yield
        return
    with in_this_thread("cover", key):
        yield


def cover_from_here(key: tuple) -> tuple | None:
    """Cover by ``key`` the keys this thread meets for the first time from now on (``covering`` from a
    point inside a call: an optimizer's update, once its fused step has missed its program), until
    ``set_cover`` puts back the cover this returns (an outer cover stays)."""
    before = getattr(_thread, "cover", None)
    if before is None:
        _thread.cover = key
    return before


def set_cover(cover: tuple | None) -> None:
    """This thread's cover set to ``cover`` (what ``cover_from_here`` returned)."""
    _thread.cover = cover


def _done(entry: Entry) -> bool:
    return entry.started or entry.program is not None or entry.reason is not None


class KernelCache:
    """The keys met so far, least recently used first, and the thread that compiles the misses."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[tuple, Entry] = OrderedDict()
        self.said: set[str] = set()  # ops whose failure was said
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: dict[tuple, tuple[Callable[[], Entry], Callable[[], bool] | None]] = {}  # in queue order
        self._unfinished = 0  # pending or compiling
        self._worker: threading.Thread | None = None
        self.synchronous = False  # compile in the caller's thread, at the miss (KILN_EAGER_KERNELS=sync)
        self.lookups = 0  # every lookup so far: the clock of ``_stale``
        self.counts: Counter[str] = Counter()  # "queued", "compiled", "parked", "declined", "dropped"

    @property
    def queued(self) -> int:
        """Compiles queued so far."""
        return self.counts["queued"]

    def lookup(self, key: tuple, make: Callable[[], Entry], shared: bool = False) -> Entry | None:
        """The entry of ``key``; None on a miss, which queues ``make()`` (the compile) for the worker
        -- but not while ``deferred()``, unless the kernel is ``shared`` with compiled programs."""
        entries = self.entries
        deferring = not shared and getattr(_thread, "on", False)
        with self._lock:
            self.lookups += 1
            entry = entries.get(key)
            if entry is not None:
                entries.move_to_end(key)
                entry.calls += 1
                entry.last_call = self.lookups
                if entry.cover is not None and getattr(_thread, "cover", None) != entry.cover:
                    entry.cover = None  # called outside its composite op too: compiled for its own calls
                if entry.parked and not deferring:
                    entry.parked, entry.revived = False, True
                    self._push(key, make)
                return entry
            if deferring:
                return None
            entries[key] = Entry(started=self.synchronous, calls=1, first_call=self.lookups,
                                 last_call=self.lookups, cover=getattr(_thread, "cover", None))  # fmt: skip
            while len(entries) > self.capacity:
                entries.popitem(last=False)
            if not self.synchronous:
                self._push(key, make)
        if self.synchronous:  # outside the lock: a compile may run ops that look up keys of their own
            made = make()
            with self._lock:
                entries[key] = made
            return made
        return None

    def _push(self, key: tuple, make: Callable[[], Entry]) -> None:
        """Queue ``key``'s compile (holding the lock), starting the worker thread if none runs."""
        if key not in self._pending:  # (an evicted key met again before its turn: queued once)
            self._unfinished += 1
            self.counts["queued"] += 1
        self._pending[key] = (make, getattr(_thread, "moot", None))
        self._wake.notify()
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._compile_loop, name="kiln-eager-kernels", daemon=True)
            self._worker.start()

    def now(self, key: tuple, make: Callable[[], Entry]) -> Entry:
        """The entry of ``key`` compiled by the time this returns: made in the caller's thread on a miss
        or while it waits in the worker's queue (behind other keys, maybe many), waited for while the
        worker compiles it."""
        while True:
            with self._lock:
                entry = self.entries.get(key)
                if entry is None:
                    self.entries[key] = entry = Entry(started=True)
                    break
                self.entries.move_to_end(key)
                if entry.program is not None or entry.reason is not None:
                    return entry
                if not entry.started:  # queued (or parked): the worker skips it once this has made it
                    entry.started = True
                    break
            time.sleep(0.001)
        try:
            made = make()
        except Exception as error:  # noqa: BLE001 - as in the worker: the op stays on numpy, said once
            made = Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
        with self._lock:
            self.entries[key] = made = entry.settled(made)
        return made

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every queued compile is done (True), or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._unfinished:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def clear(self) -> None:
        """Forget every key and what was said (the disk cache stays)."""
        self.wait()
        with self._lock:
            self.entries.clear()
            self.said.clear()

    def _take(self) -> tuple[tuple, Callable[[], Entry], Callable[[], bool] | None] | None:
        """The pending key to compile next and its ``make`` and ``moot``, taken off the queue (holding
        the lock); the keys passed over on the way are parked, declined or dropped (see the module
        docstring). None when nothing is left to compile."""
        step = _step_estimate(self.entries.values())
        in_order = background.busy()  # a program compiles: see the module docstring
        best: tuple[float, tuple] | None = None
        for key in list(self._pending):
            entry = self.entries.get(key)
            verdict = "dropped" if entry is None or _done(entry) else _verdict(entry, self.entries, self.lookups, step)
            if verdict is None and entry is not None:
                worth = 0.0 if in_order else _worth(entry, self.entries)
                if best is None or worth > best[0]:
                    best = (worth, key)
                continue
            del self._pending[key]
            self._unfinished -= 1
            self.counts[verdict or "dropped"] += 1
            if entry is not None and verdict == "parked":
                entry.parked = True
            elif entry is not None and verdict == "declined":
                entry.reason = f"numpy takes {entry.numpy_seconds * 1e6:.1f} us: a compiled call is no faster"
        if best is None:
            return None
        key = best[1]
        make, moot = self._pending.pop(key)
        self.entries[key].started = True
        return key, make, moot

    def _compile_loop(self) -> None:
        while True:
            with self._wake:
                taken = self._take()
                while taken is None:
                    self._wake.wait()
                    taken = self._take()
            key, make, moot = taken
            try:
                self._compile_one(key, make, moot)
            finally:
                with self._lock:
                    self._unfinished -= 1

    def _compile_one(self, key: tuple, make: Callable[[], Entry], moot: Callable[[], bool] | None) -> None:
        if moot is not None and moot():
            with self._lock:  # forgotten: its next call queues it again
                entry = self.entries.get(key)
                if entry is not None and entry.program is None and entry.reason is None:
                    del self.entries[key]
            return
        try:
            # the caller's thread waits less for the interpreter; a kernel's passes and code generation
            # run in the program worker where one runs (12 ms of this thread each, DCGAN's kernels)
            # covering: a composite's trace runs its ops eagerly here; they are its own (``covering``)
            with background.sharing(), program_worker.on_this_thread(if_started=True), covering(key):
                made = make()
        except Exception as error:  # noqa: BLE001 - a bug of kiln's: the op stays on numpy, said once
            made = Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
        with self._lock:
            compiling = self.entries.get(key)
            if compiling is not None:  # not evicted meanwhile
                self.entries[key] = compiling.settled(made)
                self.counts["compiled"] += 1


def _verdict(entry: Entry, entries: OrderedDict[tuple, Entry], lookups: int, step: float) -> str | None:
    """Why a pending key is not compiled now ("parked", "declined"), or None: it may be."""
    if _stale(entry, lookups, step):
        return "parked"
    cover = entries.get(entry.cover) if entry.cover is not None else None
    if cover is not None and cover.program is not None:
        return "parked"
    if entry.numpy_seconds < MIN_NUMPY_SECONDS:
        return "declined"
    return None


def _worth(entry: Entry, entries: OrderedDict[tuple, Entry]) -> float:
    """What compiling a key is worth now: the numpy time it has cost so far (inf: untimed, first); a
    key whose cover is still pending (or compiling) comes after every other (-1)."""
    cover = entries.get(entry.cover) if entry.cover is not None else None
    if cover is not None and cover.reason is None:
        return -1.0
    return entry.numpy_seconds * entry.calls


def _step_estimate(entries) -> float:
    """Lookups per step, as the keys called more than twice say: the median of their mean gaps between
    calls (most keys are called once a step; the mean gap of a key called rarely is no step's)."""
    gaps = sorted((e.last_call - e.first_call) / (e.calls - 1) for e in entries if e.calls > 2)
    return gaps[len(gaps) // 2] if gaps else 0.0


def _stale(entry: Entry, lookups: int, step: float) -> bool:
    """Whether a key has not been called for ``STALE_STEPS`` steps (and ``STALE_LOOKUPS`` lookups), or
    ``REVIVED_FACTOR`` times as long if it was parked before."""
    factor = REVIVED_FACTOR if entry.revived else 1
    return lookups - entry.last_call > factor * max(STALE_STEPS * step, STALE_LOOKUPS)
