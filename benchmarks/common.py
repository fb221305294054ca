"""What every benchmark shares: timing, result records, targets, correctness checks, threads.

A workload is a function ``run(quick: bool) -> list[Result]`` (a module's ``run``, or any function
named in ``benchmarks/run.py``'s registry); its module may list ``TARGETS``. Time one statement
with :func:`measure`::

    timing = measure("x + y", {"x": x, "y": y}, quick=True)
    Result("eager_overhead", "add, 1 element", "kiln", timing)

several side by side with :func:`compare`, and whole implementations (built, warmed up, kiln's
answer checked, then timed) with :func:`side_by_side`. The table and the JSON file are in
``benchmarks/report.py``.

Statements are timed with ``timeit`` (a string statement costs no Python call per iteration,
so a sub-microsecond op is not drowned in the harness), in repeats long enough for the clock,
reporting the median and the interquartile range of the per-call times.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import platform
import statistics
import sys
import time
import timeit
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

import kiln

KILN = "kiln"  # the implementation every ratio is taken of
Statement = str | Callable[[], object]  # source for timeit, or a callable taking no arguments
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "KILN_NUM_THREADS")


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
    blocks: int = 1  # turns each candidate takes when they are not interleaved (see ``compare``)
    idle_s: float = 0.0  # a pause before each block, for the previous candidate's pool to go idle


# 5 blocks, not 3: this shared VM's speed drifts over seconds, so one block of a candidate can run
# 1.6x slower than its others (a kiln GPT block of 135 ms against 76-81 ms, its torch blocks 92-99
# ms, one run). With 3 blocks a long step (GPT: a repeat is one 80 ms call) had 3 draws of that
# drift per candidate; 5 blocks give each candidate more of the same drift (no side is favoured).
FULL = Settings(repeats=15, min_repeat_ns=20_000_000, warmup=2, blocks=5, idle_s=0.25)
QUICK = Settings(repeats=5, min_repeat_ns=2_000_000, warmup=1)


@dataclass
class Options:
    """Run-wide switches, set once per process by ``benchmarks/run.py``."""

    torch_compile: bool = True  # False: every torch.compile reference is skipped (fast smoke runs)
    threads: int | None = None  # None: leave every library's own default
    kiln_backend: str | None = None  # None: kiln.compile's default backend
    busy: bool = False  # True: workloads that can (``eager``) also run beside a process that keeps a core busy


OPTIONS = Options()


def measure(stmt: Statement, namespace: dict | None = None, *, quick: bool = False) -> Timing:
    """Time ``stmt`` (source evaluated in ``namespace``, or a no-argument callable)."""
    return compare({"stmt": (stmt, namespace)}, quick=quick)["stmt"]


def compare(
    candidates: dict[str, tuple[Statement, dict | None]], *, quick: bool = False, interleave: bool = True
) -> dict[str, Timing]:
    """Time several statements, ``{name: (stmt, namespace)}``; return ``{name: Timing}``.

    Interleaved (round-robin) repeats make ratios robust to load that comes and goes while they
    run (other processes, frequency scaling). ``interleave=False`` is for multi-threaded kernels
    from different thread pools: OpenMP workers spin for a while after each parallel region and
    would steal the cores of the next candidate (a BLAS pool, say), and the next candidate's data
    would start cold. The candidates then take turns by blocks of repeats, each block after a
    pause of ``idle_s`` (the previous candidate's workers stop spinning: OpenBLAS's spin for about
    0.1 s by default, longer than a repeat, and numpy's BLAS threads left spinning by kiln's block
    had slowed PyTorch's next block: its NCF step read 3.6 ms after kiln's blocks, 1.9 ms when kiln's
    BLAS threads no longer spun, medians of 4 runs) and a repeat thrown
    away (it warms the caches), so each candidate's repeats still spread over the whole run.
    Either way each round starts with the next candidate (``_rotated``): none always runs right
    after the same other one, whose caches, spinning threads or heat it would inherit.
    """
    settings = QUICK if quick else FULL
    timers = {
        name: timeit.Timer(stmt, timer=time.perf_counter_ns, globals=ns) for name, (stmt, ns) in candidates.items()
    }
    names = list(timers)
    inner = {name: _calibrate(timers[name], settings.min_repeat_ns) for name in names}
    per_call: dict[str, list[float]] = {name: [] for name in names}

    def repeat(name: str) -> float:
        return timers[name].timeit(inner[name]) / inner[name]

    if interleave:
        for round_ in range(settings.warmup + settings.repeats):
            for name in _rotated(names, round_):
                elapsed = repeat(name)
                if round_ >= settings.warmup:
                    per_call[name].append(elapsed)
    else:
        for round_, size in enumerate(_blocks(settings.repeats, settings.blocks)):
            for name in _rotated(names, round_):
                time.sleep(settings.idle_s)
                for _ in range(settings.warmup if len(per_call[name]) == 0 else 1):
                    repeat(name)
                per_call[name] += [repeat(name) for _ in range(size)]
    return {name: _summarize(sorted(times), inner[name]) for name, times in per_call.items()}


def _rotated(names: list[str], round_: int) -> list[str]:
    """``names`` starting at the ``round_``-th (round-robin over rounds)."""
    start = round_ % len(names)
    return names[start:] + names[:start]


def _blocks(repeats: int, blocks: int) -> list[int]:
    """``repeats`` split into ``blocks`` nearly equal blocks (none empty)."""
    blocks = max(1, min(blocks, repeats))
    return [repeats // blocks + (k < repeats % blocks) for k in range(blocks)]


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


def one_shot(samples: list[float]) -> Timing:
    """A Timing of one-shot latencies (one sample each, so ``inner`` is 1)."""
    return _summarize(sorted(samples), inner=1)


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Result:
    """One implementation's timing of one case of a workload; ``timing`` is None when it did not run."""

    workload: str
    case: str
    impl: str  # "kiln", or a reference: "numpy", "torch", "torch.compile", "jax.jit"...
    timing: Timing | None
    note: str = ""  # why it was skipped ("error: ..." when kiln failed), or what to know when reading it
    params: dict = field(default_factory=dict)  # sizes, dtypes, thread counts
    check: str = ""  # kiln's answer against a reference: "ok ..." or "FAIL ..." ("" when not checked)

    @property
    def median_ns(self) -> float | None:
        return None if self.timing is None else self.timing.median_ns

    @property
    def failed(self) -> bool:
        """kiln ran but gave a wrong answer: its speed means nothing."""
        return self.check.startswith("FAIL")


def skipped(workload: str, case: str, impl: str, why: str) -> Result:
    return Result(workload, case, impl, None, note=why)


def result_from_dict(entry: dict) -> Result:
    """The inverse of ``dataclasses.asdict`` on a Result (extra keys, as the JSON file has, ignored)."""
    timing = entry.get("timing")
    fields = ("median_ns", "q1_ns", "q3_ns", "repeats", "inner")
    return Result(
        entry["workload"], entry["case"], entry["impl"],
        None if timing is None else Timing(**{k: timing[k] for k in fields}),
        entry.get("note", ""), dict(entry.get("params") or {}), entry.get("check", ""),
    )  # fmt: skip


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


def error_note(error: BaseException) -> str:
    """``error: Type: first line`` of an exception, short enough for the table."""
    first = (str(error).strip().splitlines() or [""])[0]
    return f"error: {type(error).__name__}: {first[:160]}"


# ----------------------------------------------------------------------------- targets
#: A target's reference meaning the fastest PyTorch eager variant of the run (a training step's
#: optimizer fused, foreach or for-loop: whichever was fastest this time), as issue 14 asks.
FASTEST_TORCH = "fastest torch eager"
TORCH_EAGER = ("torch", "torch fused", "torch foreach", "torch for-loop")


@dataclass(frozen=True)
class Target:
    """A goal on kiln's median on ``case``: at most ``max_ratio`` times ``reference``'s (same run;
    ``FASTEST_TORCH``: the fastest of the PyTorch eager variants measured), or, with ``reference``
    None, at most ``max_ns`` nanoseconds."""

    workload: str
    case: str
    reference: str | None
    max_ratio: float | None = None
    max_ns: float | None = None

    @property
    def goal(self) -> str:
        if self.reference is None:
            return f"{self.case}: kiln < {format_time(self.max_ns)}"
        return f"{self.case}: kiln/{self.reference} <= {self.max_ratio:.3g}x"


@dataclass(frozen=True)
class TargetCheck:
    target: Target
    ratio: float | None  # kiln/reference, or kiln's median in ns for an absolute target; None: not run
    kiln_failed: bool = False  # kiln's answer was wrong: the target cannot be met
    kiln_error: str = ""  # kiln did not run: why

    @property
    def status(self) -> str:
        if self.kiln_failed:
            return "FAIL (wrong result)"
        if self.kiln_error:
            return "error"
        if self.ratio is None:
            return "skipped"
        limit = self.target.max_ns if self.target.reference is None else self.target.max_ratio
        return "met" if self.ratio <= limit else "MISSED"

    @property
    def value(self) -> str:
        if self.ratio is None:
            return ""
        return format_time(self.ratio) if self.target.reference is None else f"{self.ratio:.2f}x"

    @property
    def by(self) -> str:
        """How far off a missed target is, as a factor of the limit."""
        if self.status != "MISSED":
            return ""
        limit = self.target.max_ns if self.target.reference is None else self.target.max_ratio
        return f"{self.ratio / limit:.2f}x over"


def reference_impl(target: Target, found: dict[tuple[str, str, str], float]) -> str | None:
    """The implementation ``target`` compares with in a run (``found``: ``ratios``): its reference,
    or for ``FASTEST_TORCH`` the PyTorch eager variant with the fastest median (kiln's largest ratio)."""
    if target.reference != FASTEST_TORCH:
        return target.reference
    measured = [impl for impl in TORCH_EAGER if (target.workload, target.case, impl) in found]
    return max(measured, key=lambda impl: found[target.workload, target.case, impl], default=None)


def check_targets(results: Iterable[Result], targets: Iterable[Target]) -> list[TargetCheck]:
    results = list(results)
    found = ratios(results)
    kiln_rows = {(r.workload, r.case): r for r in results if r.impl == KILN}
    checks = []
    for t in targets:
        own = kiln_rows.get((t.workload, t.case))
        impl = reference_impl(t, found)
        value = own.median_ns if t.reference is None and own else found.get((t.workload, t.case, impl or ""))
        error = own.note if own is not None and own.timing is None and own.note.startswith("error") else ""
        checks.append(TargetCheck(t, value, bool(own and own.failed), error))
    return checks


def format_time(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale * 0.9995:  # 999.6 us reads "1 ms", not "1e+03 us"
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


# ----------------------------------------------------------------------------- correctness
def close(actual, expected, *, rtol: float, atol: float) -> str:
    """``ok ...`` when ``|actual - expected| <= atol + rtol * |expected|`` everywhere (nan where
    expected has nan), else ``FAIL ...`` saying how many elements are off and by how much."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return f"FAIL: shape {a.shape}, expected {e.shape}"
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - e)
        within = np.where(np.isinf(e), a == e, err <= atol + rtol * np.abs(e))  # inf must match exactly
    bad = ~within & ~(np.isnan(a) & np.isnan(e))
    finite = err[np.isfinite(err)]
    worst = float(finite.max()) if finite.size else 0.0
    tolerance = f"rtol={rtol:g}, atol={atol:g}"
    if bad.any():
        return f"FAIL: {int(bad.sum())} of {bad.size} off, max |err| {worst:.3g} ({tolerance})"
    return f"ok: max |err| {worst:.2g} ({tolerance})"


def merge_checks(checks: Iterable[str]) -> str:
    """One verdict from several: the first FAIL, else the first ok."""
    checks = list(checks)
    return next((c for c in checks if c.startswith("FAIL")), checks[0] if checks else "")


# ----------------------------------------------------------------------------- side by side
Builder = Callable[[], Callable[[], object]]  # builds an implementation, returns the call to time


def side_by_side(
    workload: str,
    case: str,
    builders: dict[str, Builder | str],
    *,
    quick: bool,
    verify: Callable[[Callable[[], object]], str] | None = None,
    params: dict | None = None,
    notes: Callable[[str, Timing], str] | None = None,
    warmup_calls: int = 3,
) -> list[Result]:
    """Build every implementation (a string instead of a builder: skipped, that string says why),
    call each ``warmup_calls`` times (kiln's compile happens there), check kiln's answer with
    ``verify(kiln_call) -> "ok ..."/"FAIL ..."``, then time them by turns of several repeats (not
    interleaved call by call: different libraries' thread pools; see ``compare``). Any failure of
    kiln is reported as ``error: ...``, a reference's as a skip; the others still run."""
    params = dict(params or {}, threads=OPTIONS.threads)
    calls: dict[str, Callable[[], object]] = {}
    results: dict[str, Result] = {}
    check = ""
    for impl, build in builders.items():
        if isinstance(build, str):
            results[impl] = skipped(workload, case, impl, build)
            continue
        try:
            call = build()
            for _ in range(warmup_calls):
                call()
            if impl == KILN and verify is not None:
                check = verify(call)
        except Exception as error:  # noqa: BLE001 - report it, go on with the others
            note = error_note(error)
            if impl == KILN:
                traceback.print_exc(file=sys.stderr)
            results[impl] = skipped(workload, case, impl, note if impl == KILN else "failed: " + note[7:])
            continue
        calls[impl] = call
    timings = compare({impl: (call, None) for impl, call in calls.items()}, quick=quick, interleave=False)
    for impl, t in timings.items():
        note = notes(impl, t) if notes else ""
        results[impl] = Result(workload, case, impl, t, note, params, check if impl == KILN else "")
    return [results[impl] for impl in builders]


def kiln_compile(fn: Callable) -> Callable:
    """``kiln.compile(fn)``, on the backend chosen with ``--kiln-backend`` when one was, and waiting
    for its compiles where kiln can compile in the background (``wait=True``): a benchmark times
    the compiled program, not the eager calls made while it compiles."""
    extra = {"wait": True} if "wait" in inspect.signature(kiln.compile).parameters else {}
    if OPTIONS.kiln_backend is None:
        return kiln.compile(fn, **extra)
    return kiln.compile(fn, options=kiln.CompileOptions(backend=OPTIONS.kiln_backend), **extra)


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- environment
def optional_import(name: str) -> ModuleType | None:
    """The module, or None when it is not installed (its reference is then skipped)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def torch_compile_or_why(torch) -> str:
    """Empty when torch.compile references should run, else why they are skipped."""
    if torch is None:
        return "torch is not installed"
    if not OPTIONS.torch_compile:
        return "skipped: --no-torch-compile"
    return ""


def thread_env(threads: int) -> dict[str, str]:
    """Environment variables that size every native thread pool (OpenMP, MKL, OpenBLAS, kiln)."""
    return {name: str(threads) for name in THREAD_ENV}


def configure_threads(threads: int | None) -> None:
    """Give torch and kiln ``threads`` threads (numpy's BLAS takes them from the environment)."""
    OPTIONS.threads = threads
    if threads is None:
        return
    torch = sys.modules.get("torch") or optional_import("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    setter = getattr(kiln, "set_num_threads", None)
    if setter is not None:
        setter(threads)


def kiln_num_threads() -> int:
    """Threads kiln's kernels may use: the configured count, kiln's own setting, else numpy's BLAS pool."""
    if OPTIONS.threads is not None:
        return OPTIONS.threads
    if hasattr(kiln, "get_num_threads"):
        return int(kiln.get_num_threads())
    threadpoolctl = optional_import("threadpoolctl")
    if threadpoolctl is not None:
        for pool in threadpoolctl.threadpool_info():
            if pool.get("user_api") == "blas" and "numpy" in pool.get("filepath", ""):
                return int(pool["num_threads"])
    return os.cpu_count() or 1


def kiln_backend() -> str:
    if OPTIONS.kiln_backend is not None:
        return OPTIONS.kiln_backend
    options = getattr(kiln, "CompileOptions", None)
    backend = getattr(options(), "backend", "?") if options is not None else "?"
    return "from the device" if backend is None else str(backend)


def environment() -> dict:
    versions = {}
    for name in ("numpy", "torch", "jax", "llvmlite"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "kiln_threads": kiln_num_threads(),
        "kiln_backend": kiln_backend(),
        "torch_compile": OPTIONS.torch_compile,
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
