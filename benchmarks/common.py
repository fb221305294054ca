"""What every benchmark shares: timing, result records, targets, the table and the JSON file.

A workload module exposes ``run(quick: bool) -> list[Result]`` (and, optionally, ``TARGETS``);
``benchmarks/run.py`` runs the registered ones. Time one statement with :func:`measure`::

    timing = measure("x + y", {"x": x, "y": y}, quick=True)
    Result("eager_overhead", "add, 1 element", "kiln", timing)

and several side by side with :func:`compare`, which interleaves their repeats.

Statements are timed with ``timeit`` (a string statement costs no Python call per iteration,
so a sub-microsecond op is not drowned in the harness), in repeats long enough for the clock,
reporting the median and the interquartile range of the per-call times.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

import kiln

KILN = "kiln"  # the implementation every ratio is taken of
Statement = str | Callable[[], object]  # source for timeit, or a callable taking no arguments


@dataclass(frozen=True)
class Timing:
    """Per-call times of one statement, in nanoseconds."""

    median_ns: float
    q1_ns: float
    q3_ns: float
    repeats: int
    inner: int  # calls per repeat, chosen so one repeat lasts long enough for the clock

    @property
    def iqr_ns(self) -> float:
        return self.q3_ns - self.q1_ns


@dataclass(frozen=True)
class Settings:
    """How long to measure: ``QUICK`` for smoke runs and tests, ``FULL`` for numbers to report."""

    repeats: int
    min_repeat_ns: int  # each repeat runs the statement this long at least
    warmup: int  # repeats run and thrown away after calibration


FULL = Settings(repeats=15, min_repeat_ns=20_000_000, warmup=2)
QUICK = Settings(repeats=5, min_repeat_ns=2_000_000, warmup=1)


def measure(stmt: Statement, namespace: dict | None = None, *, quick: bool = False) -> Timing:
    """Time ``stmt`` (source evaluated in ``namespace``, or a no-argument callable)."""
    return compare({"stmt": (stmt, namespace)}, quick=quick)["stmt"]


def compare(
    candidates: dict[str, tuple[Statement, dict | None]], *, quick: bool = False, interleave: bool = True
) -> dict[str, Timing]:
    """Time several statements, ``{name: (stmt, namespace)}``; return ``{name: Timing}``.

    Interleaved (round-robin) repeats make ratios robust to load that comes and goes while they
    run (other processes, frequency scaling). Pass ``interleave=False`` for multi-threaded
    kernels from different thread pools: OpenMP workers spin for a while after each parallel
    region and would steal the cores of the next candidate (a BLAS pool, say).
    """
    settings = QUICK if quick else FULL
    timers = {
        name: timeit.Timer(stmt, timer=time.perf_counter_ns, globals=ns) for name, (stmt, ns) in candidates.items()
    }
    schedule = [list(timers)] if interleave else [[name] for name in timers]
    timings: dict[str, Timing] = {}
    for group in schedule:
        inner = {name: _calibrate(timers[name], settings.min_repeat_ns) for name in group}
        per_call: dict[str, list[float]] = {name: [] for name in group}
        for round_ in range(settings.warmup + settings.repeats):
            for name in group:
                elapsed = timers[name].timeit(inner[name])
                if round_ >= settings.warmup:
                    per_call[name].append(elapsed / inner[name])
        timings.update({name: _summarize(sorted(times), inner[name]) for name, times in per_call.items()})
    return timings


def _calibrate(timer: timeit.Timer, min_ns: int) -> int:
    """The number of calls whose total time reaches ``min_ns`` (the first calls also warm up)."""
    inner = 1
    while True:
        elapsed = timer.timeit(inner)
        if elapsed >= min_ns:
            return inner
        # Aim 20% past the goal, growing at most 10x a step so one slow call can't overshoot far.
        wanted = math.ceil(inner * 1.2 * min_ns / max(elapsed, 1))
        inner = max(inner + 1, min(inner * 10, wanted))


def _summarize(per_call: list[float], inner: int) -> Timing:
    if len(per_call) == 1:
        only = per_call[0]
        return Timing(only, only, only, 1, inner)
    q1, median, q3 = statistics.quantiles(per_call, n=4, method="inclusive")
    return Timing(median, q1, q3, len(per_call), inner)


@dataclass(frozen=True)
class Result:
    """One implementation's timing of one case of a workload; ``timing`` is None when skipped."""

    workload: str
    case: str
    impl: str  # "kiln", or a reference: "numpy", "torch", "torch.compile", "jax.jit"...
    timing: Timing | None
    note: str = ""  # why it was skipped, or what to know when reading the number
    params: dict = field(default_factory=dict)  # sizes, dtypes, thread counts

    @property
    def median_ns(self) -> float | None:
        return None if self.timing is None else self.timing.median_ns


def skipped(workload: str, case: str, impl: str, why: str) -> Result:
    return Result(workload, case, impl, None, note=why)


def ratios(results: Iterable[Result]) -> dict[tuple[str, str, str], float]:
    """kiln's median over each reference's median, keyed by (workload, case, reference)."""
    results = list(results)
    kiln = {(r.workload, r.case): r.median_ns for r in results if r.impl == KILN and r.median_ns}
    out = {}
    for r in results:
        own = kiln.get((r.workload, r.case))
        if r.impl != KILN and own and r.median_ns:
            out[(r.workload, r.case, r.impl)] = own / r.median_ns
    return out


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """A goal: kiln's median on ``case`` at most ``max_ratio`` times ``reference``'s, in one run."""

    workload: str
    case: str
    reference: str
    max_ratio: float


@dataclass(frozen=True)
class TargetCheck:
    target: Target
    ratio: float | None  # None when kiln or the reference did not run

    @property
    def status(self) -> str:
        if self.ratio is None:
            return "skipped"
        return "met" if self.ratio <= self.target.max_ratio else "MISSED"


def check_targets(results: Iterable[Result], targets: Iterable[Target]) -> list[TargetCheck]:
    found = ratios(results)
    return [TargetCheck(t, found.get((t.workload, t.case, t.reference))) for t in targets]


# ----------------------------------------------------------------------------- printing
def format_time(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def format_table(results: Iterable[Result]) -> str:
    """One line per result: median, IQR, and kiln's ratio to it (for references)."""
    results = list(results)
    found = ratios(results)
    rows = [("workload", "case", "impl", "median", "IQR", "kiln/impl", "note")]
    for r in results:
        ratio = found.get((r.workload, r.case, r.impl))
        timing = r.timing
        rows.append((
            r.workload, r.case, r.impl,
            "skipped" if timing is None else format_time(timing.median_ns),
            "" if timing is None else format_time(timing.iqr_ns),
            "" if ratio is None else f"{ratio:.2f}x",
            r.note,
        ))  # fmt: skip
    return _columns(rows)


def format_targets(checks: Iterable[TargetCheck]) -> str:
    rows = [("workload", "target", "ratio", "status")]
    for c in checks:
        t = c.target
        goal = f"{t.case}: kiln/{t.reference} <= {t.max_ratio:g}x"
        rows.append((t.workload, goal, "" if c.ratio is None else f"{c.ratio:.2f}x", c.status))
    return _columns(rows)


def _columns(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- JSON
def to_json(results: Iterable[Result], checks: Iterable[TargetCheck] = ()) -> dict:
    results = list(results)
    found = ratios(results)
    entries = []
    for r in results:
        entry = asdict(r)
        entry["iqr_ns"] = None if r.timing is None else r.timing.iqr_ns
        entry["kiln_ratio"] = found.get((r.workload, r.case, r.impl))
        entries.append(entry)
    targets = [{**asdict(c.target), "ratio": c.ratio, "status": c.status} for c in checks]
    return {"environment": environment(), "results": entries, "targets": targets}


def write_json(path: str | os.PathLike, results: Iterable[Result], checks: Iterable[TargetCheck] = ()) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(results, checks), indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- environment
def optional_import(name: str) -> ModuleType | None:
    """The module, or None when it is not installed (its reference is then skipped)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def kiln_num_threads() -> int:
    """Threads kiln's kernels may use: kiln's own setting once it has one, else numpy's BLAS pool."""
    if hasattr(kiln, "get_num_threads"):
        return int(kiln.get_num_threads())
    threadpoolctl = optional_import("threadpoolctl")
    if threadpoolctl is not None:
        for pool in threadpoolctl.threadpool_info():
            if pool.get("user_api") == "blas" and "numpy" in pool.get("filepath", ""):
                return int(pool["num_threads"])
    return os.cpu_count() or 1


def environment() -> dict:
    versions = {}
    for name in ("numpy", "torch", "jax"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "kiln_threads": kiln_num_threads(),
        "versions": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


@contextmanager
def torch_with_kiln_threads() -> Iterator[tuple[ModuleType | None, int]]:
    """Yield (torch or None, kiln's thread count), with torch set to that many threads meanwhile,
    so that every ratio compares the same amount of hardware."""
    threads = kiln_num_threads()
    torch = optional_import("torch")
    previous = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(threads)
    try:
        yield torch, threads
    finally:
        if torch is not None:
            torch.set_num_threads(previous)
