"""Run the registered benchmark workloads, print the table and the targets, write JSON.

    python -m benchmarks.run [--quick] [--json PATH] [--strict] [workload ...]

Without workload names every registered workload runs. A workload is a module exposing
``run(quick: bool) -> list[Result]`` and, optionally, ``TARGETS`` (a list of ``Target``);
register a new one by adding its module to ``WORKLOADS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .common import Result, TargetCheck, check_targets, format_table, format_targets, write_json

# name -> module; imported only when selected, so one workload's missing dependency spares the rest.
WORKLOADS = {
    "eager_overhead": "benchmarks.eager_overhead",
    "train_steps": "benchmarks.train_steps",
    "compile": "benchmarks.compile_latency",
}

DEFAULT_JSON = Path(__file__).parent / "results" / "latest.json"


def run_workloads(names: list[str], quick: bool) -> tuple[list[Result], list[TargetCheck]]:
    """Results of every named workload, and its targets checked against them."""
    results: list[Result] = []
    checks: list[TargetCheck] = []
    for name in names:
        module = importlib.import_module(WORKLOADS[name])
        found = module.run(quick=quick)
        results.extend(found)
        checks.extend(check_targets(found, getattr(module, "TARGETS", ())))
    return results, checks


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument(
        "workloads", nargs="*", metavar="workload", help=f"any of: {', '.join(WORKLOADS)} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats (a smoke run, noisier numbers)")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"where to write results (default: {DEFAULT_JSON})"
    )
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(args.workloads)) or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; expected any of: {', '.join(WORKLOADS)}")
    results, checks = run_workloads(names, args.quick)
    print(format_table(results))
    if checks:
        print()
        print(format_targets(checks))
    path = write_json(args.json, results, checks)
    print(f"\nwrote {path}")
    missed = [c for c in checks if c.status == "MISSED"]
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
