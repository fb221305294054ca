"""``python -m tests.fuzz``: run a profile of random programs and print a summary.

    python -m tests.fuzz --programs 300                 # the CI profile
    python -m tests.fuzz --programs 10000 --shard 0/2   # half of the large profile
    python -m tests.fuzz --kinds models,optim           # only some kinds of programs (default: all, mixed)
    python -m tests.fuzz --replay 17                    # one program, its source and its finding
    python -m tests.fuzz --repro repro.py               # a printed (shrunk) program, run again

Findings (silent differences, error mismatches and compiled-only crashes) are grouped by signature; each class
prints one shrunk repro. The exit status is 1 when there is any finding. A float32 value difference that the
same program does not show in float64 is a conditioning artefact (tests/fuzz/recheck.py): listed apart, no finding.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

HANG_SECONDS = 180  # a program still running after this is stuck where no signal reaches it
SHRINK_PER_KIND = 8  # findings of one kind shrunk before the rest are classified unshrunk


ERROR_CHECKS = ("error type", "no error")  # differences about exceptions, not values


@dataclass
class KindStats:
    """What one kind of program did: findings, compiled-copy calls, specializations, trace breaks."""

    programs: int = 0
    silent: int = 0  # the compiled copy's result or state differs, without an error
    artefacts: int = 0  # float32 value differences that the program in float64 does not show
    errors: int = 0  # a different exception, no exception, or a compiled-only crash
    calls: Counter = field(default_factory=Counter)
    specializations: int = 0
    breaks: int = 0

    def line(self, kind: str) -> str:
        total = sum(self.calls.values()) or 1
        return (f"  {kind}: {self.programs} programs, {self.silent} silent differences, {self.errors} error "
                f"mismatches, {self.artefacts} float32 artefacts; fallback rate {self.calls.get('fallback', 0) / total:.2%} of {total} calls; "
                f"{self.specializations / max(self.programs, 1):.2f} specializations and "
                f"{self.breaks / max(self.programs, 1):.2f} trace breaks per program")  # fmt: skip


@dataclass
class Summary:
    programs: int = 0
    seconds: float = 0.0
    classes: dict = field(default_factory=dict)  # signature -> [count, first (shrunk) outcome]
    eager_errors: int = 0
    calls: Counter = field(default_factory=Counter)
    fallbacks: Counter = field(default_factory=Counter)
    mismatches: int = 0  # silent differences
    crashes: int = 0  # error mismatches (compiled-only crashes included)
    kinds: dict = field(default_factory=dict)  # kind -> KindStats
    artefacts: list = field(default_factory=list)  # outcomes whose difference is gone in float64

    def add(self, outcome, shrunk=None, artefact: bool = False) -> None:
        """Count ``outcome`` (``artefact``: its finding is a float32 conditioning artefact, no finding)."""
        from .shrink import signature  # noqa: PLC0415

        self.programs += 1
        self.calls.update(outcome.calls)
        self.fallbacks.update(outcome.fallbacks)
        self.eager_errors += outcome.eager_error is not None
        stats = self.kinds.setdefault(outcome.program.kind, KindStats())
        stats.programs += 1
        stats.calls.update(outcome.calls)
        stats.specializations += outcome.specializations
        stats.breaks += outcome.breaks
        if artefact:
            self.artefacts.append(outcome)
            stats.artefacts += 1
            return
        if not outcome.finding:
            return
        silent = outcome.difference is not None and outcome.difference.check not in ERROR_CHECKS
        self.mismatches += silent
        self.crashes += not silent
        stats.silent += silent
        stats.errors += not silent
        shown = shrunk or outcome
        key = signature(shown)
        entry = self.classes.setdefault(key, [0, shown])
        entry[0] += 1
        if len(shown.program.body) < len(entry[1].program.body):
            entry[1] = shown

    def report(self, repros: bool = True) -> str:
        total = sum(self.calls.values()) or 1
        fallback = self.calls.get("fallback", 0)
        lines = [
            f"programs: {self.programs} in {self.seconds:.1f} s ({self.programs / max(self.seconds, 1e-9):.2f} per second)",
            f"silent differences: {self.mismatches} programs; error mismatches (compiled-only crashes included): "
            f"{self.crashes} programs; {len(self.classes)} classes",
            f"programs where eager and compiled raised the same error type: {self.eager_errors}",
            f"compiled-copy calls: {dict(self.calls)}; fallback rate {fallback / total:.2%} "
            f"(calls run eagerly for a reason other than tracing)",
        ]
        lines += [stats.line(kind) for kind, stats in sorted(self.kinds.items())]
        for reason, n in self.fallbacks.most_common(8):
            lines.append(f"  fallback x{n}: {reason}")
        if self.artefacts:
            lines.append(f"float32 conditioning artefacts (not counted above: gone when the program runs in "
                         f"float64): {len(self.artefacts)} programs")  # fmt: skip
            lines += [f"  seed {o.program.seed}, call {o.call}: {o.difference}" for o in self.artefacts[:8]]
        for key, (count, outcome) in sorted(self.classes.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"\n[{count}] {key}")
            finding = outcome.crash or outcome.difference
            lines.append(f"  seed {outcome.program.seed}, call {outcome.call}: {finding}")
            if outcome.crash_trace:  # (also under --quiet: a crash a replay may not bring back)
                lines.extend("    " + line for line in outcome.crash_trace.splitlines())
            if repros:
                lines.extend("    " + line for line in outcome.program.source.splitlines())
        return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300, help="how many programs (before sharding)")
    parser.add_argument("--seed", type=int, default=0, help="the profile's seed")
    parser.add_argument("--shard", default="0/1", help="i/n: run programs whose number is i modulo n")
    parser.add_argument(
        "--kinds",
        default="all",
        help="comma-separated kinds of programs: ops, models, optim, "
        "pystate, loops (tests/fuzz/kinds.py), or all (the default, mixed)",
    )
    parser.add_argument("--backend", choices=("llvm", "interpreter"), default="llvm")
    parser.add_argument("--no-shrink", action="store_true", help="report findings without shrinking them")
    parser.add_argument("--replay", type=int, help="run the program with this seed and print it")
    parser.add_argument("--repro", help="run a program printed by an earlier run (a file with its source)")
    parser.add_argument("--quiet", action="store_true", help="no repro sources in the summary")
    return parser.parse_args(argv)


def program_seeds(programs: int, seed: int, shard: str) -> range:
    i, n = (int(part) for part in shard.split("/"))
    if not 0 <= i < n:
        raise SystemExit(f"--shard: expected i/n with 0 <= i < n, got {shard!r}")
    return range(seed * 1_000_000 + i, seed * 1_000_000 + programs, n)


def _hang(program, summary: Summary) -> None:
    """A program stuck in native code (LLVM's optimizer) cannot be interrupted: report it and stop."""
    print(f"HANG: program {program.seed} ran longer than {HANG_SECONDS} s, inside native code (the compile); "
          f"stopping here.\n{program.source}\n\nSummary so far:\n{summary.report()}", flush=True)  # fmt: skip
    os._exit(3)


def fuzz(
    seeds,
    backend: str = "llvm",
    shrink: bool = True,
    progress=None,
    shrink_per_kind: int = SHRINK_PER_KIND,
    shrink_budget: int = 60,
    kinds: tuple[str, ...] = ("ops",),
) -> Summary:
    from .kinds import generate  # noqa: PLC0415
    from .recheck import is_conditioning_artefact  # noqa: PLC0415
    from .runner import run  # noqa: PLC0415
    from .shrink import kind
    from .shrink import shrink as shrink_outcome  # noqa: PLC0415

    summary = Summary()
    shrunk_kinds: Counter = Counter()
    start = time.perf_counter()
    for k, seed in enumerate(seeds):
        program = generate(seed, kinds)
        watchdog = threading.Timer(HANG_SECONDS, _hang, (program, summary))
        watchdog.daemon = True
        watchdog.start()
        try:
            outcome = run(program, backend)
        finally:
            watchdog.cancel()
        if outcome.finding and is_conditioning_artefact(outcome, backend):
            summary.add(outcome, artefact=True)
            continue
        shrunk = None
        timed_out = outcome.crash is not None and "TimeoutError" in outcome.crash
        if outcome.finding and shrink and not timed_out and shrunk_kinds[kind(outcome)] < shrink_per_kind:
            shrunk_kinds[kind(outcome)] += 1
            shrunk = shrink_outcome(outcome, backend, shrink_budget)
        summary.add(outcome, shrunk)
        if progress and (k + 1) % 100 == 0:
            progress(f"{k + 1} programs, {summary.mismatches} mismatches, {summary.crashes} crashes, "
                     f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    summary.seconds = time.perf_counter() - start
    return summary


def main(argv: list[str] | None = None) -> int:
    from .kinds import parse_kinds  # noqa: PLC0415

    args = parse(argv)
    os.environ["KILN_JIT_STRICT"] = "1"  # a backend failure raises instead of falling back
    cache = tempfile.mkdtemp(prefix="kiln-fuzz-cache-")
    os.environ["KILN_CACHE_DIR"] = cache
    try:
        if args.replay is not None or args.repro:
            from .kinds import from_source, generate  # noqa: PLC0415
            from .runner import run  # noqa: PLC0415

            if args.repro:
                with open(args.repro) as file:
                    program = from_source(file.read())
            else:
                program = generate(args.replay, parse_kinds(args.kinds))
            from .recheck import is_conditioning_artefact  # noqa: PLC0415

            outcome = run(program, args.backend)
            print(outcome.program.source)
            print(f"finding: {outcome.crash or outcome.difference or 'none'} (call {outcome.call}); "
                  f"calls {dict(outcome.calls)}; eager error: {outcome.eager_error}")  # fmt: skip
            if outcome.finding and is_conditioning_artefact(outcome, args.backend):
                print("a float32 conditioning artefact, not a finding: the program in float64 shows no difference")
                return 0
            return int(outcome.finding)
        seeds = program_seeds(args.programs, args.seed, args.shard)
        summary = fuzz(
            seeds,
            args.backend,
            not args.no_shrink,
            progress=lambda s: print(s, file=sys.stderr),
            kinds=parse_kinds(args.kinds),
        )
        print(summary.report(repros=not args.quiet))
        return int(bool(summary.classes))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
