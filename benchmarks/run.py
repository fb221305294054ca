"""Run the benchmark workloads, print the table and the targets, write JSON.

    python -m benchmarks.run [--quick] [--json PATH] [--threads N] [--no-torch-compile] [--strict] [workload ...]
    python -m benchmarks.run --device cuda [--quick] [workload ...]     # the GPU workloads (issue 13)

Without workload names every registered workload runs. Each workload runs in its own Python
process (so that one workload's thread pools, caches and allocations do not disturb the next),
and inside it every implementation runs side by side; ``--in-process`` runs them all here.
A workload is a function ``run(quick: bool) -> list[Result]``, registered below as
``"module"`` (its ``run``) or ``"module:function"``; the module's ``TARGETS`` are checked, its
``summary(results) -> str`` (if any) is printed after the tables, and its ``CHILD_TIMEOUT_S``
(by ``quick``, if any) replaces the default limit on its child process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common
from .common import KILN, Result, Target, TargetCheck, check_targets, result_from_dict, skipped
from .report import failures, format_table, format_targets, write_json

# name -> module[:function]; imported only when selected, so one workload's missing dependency spares the rest.
WORKLOADS = {
    "gelu": "benchmarks.kernels:run_gelu",
    "softmax": "benchmarks.kernels:run_softmax",
    "layernorm": "benchmarks.kernels:run_layernorm",
    "mlp": "benchmarks.training:run_mlp",
    "lenet": "benchmarks.training:run_lenet",
    "gpt": "benchmarks.training:run_gpt",
    "adam": "benchmarks.training:run_adam",
    "resnet18": "benchmarks.paper_models:run_resnet18",
    "lstm": "benchmarks.paper_models:run_lstm",
    "ncf": "benchmarks.paper_models:run_ncf",
    "compile": "benchmarks.compile_latency:run_compile",
    "overhead": "benchmarks.compile_latency:run_overhead",
    "eager_overhead": "benchmarks.eager_overhead",
    "train_steps": "benchmarks.train_steps",
    "checks": "benchmarks.check_cost",
    "long_programs": "benchmarks.long_programs",
    "eager": "benchmarks.eager_steps",
    "compile_cost": "benchmarks.compile_cost",
    "changing_floats": "benchmarks.changing_floats",
}

# the GPU workloads, run by ``--device cuda`` (each reports itself skipped without a GPU)
CUDA_WORKLOADS = {
    "cuda_overhead": "benchmarks.cuda_bench:run_overhead",
    "cuda_kernels": "benchmarks.cuda_bench:run_kernels",
    "cuda_train": "benchmarks.cuda_bench:run_train",
    "cuda_allocator": "benchmarks.cuda_bench:run_allocator",
    "cuda_async": "benchmarks.cuda_bench:run_async",
}

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = Path(__file__).parent / "results" / "latest.json"
CHILD_TIMEOUT_S = {True: 600, False: 1800}  # per workload, by `quick`


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _load(name: str):
    """(workload function, module) of a registered name."""
    module_name, _, function = {**WORKLOADS, **CUDA_WORKLOADS}[name].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, function or "run"), module


def _targets_for(module, results: list[Result]) -> list[Target]:
    names = {r.workload for r in results}
    return [t for t in getattr(module, "TARGETS", ()) if t.workload in names]


def run_in_process(names: list[str], quick: bool) -> tuple[list[Result], list[TargetCheck]]:
    """Results of every named workload run in this process, and its targets checked against them."""
    results: list[Result] = []
    checks: list[TargetCheck] = []
    for name in names:
        function, module = _load(name)
        found = function(quick=quick)
        results.extend(found)
        checks.extend(check_targets(found, _targets_for(module, found)))
    return results, checks


def run_in_subprocesses(names: list[str], args: argparse.Namespace) -> tuple[list[Result], list[TargetCheck], dict]:
    """Each named workload in a child process (this module with ``--child``); their JSON merged."""
    results: list[Result] = []
    checks: list[TargetCheck] = []
    env_info: dict = {}
    env = {**os.environ, **common.thread_env(args.threads)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        for name in names:
            out = Path(tmp) / f"{name}.json"
            command = [sys.executable, "-m", "benchmarks.run", "--child", "--json", str(out)]
            command += ["--threads", str(args.threads), *_flags(args), name]
            common.progress(f"{name}: running in a child process")
            start = time.perf_counter()
            limit = getattr(_load(name)[1], "CHILD_TIMEOUT_S", CHILD_TIMEOUT_S)[args.quick]
            try:
                proc = subprocess.run(command, env=env, cwd=ROOT, timeout=limit, check=False)
                why = f"error: workload process exited with status {proc.returncode}" if proc.returncode else ""
            except subprocess.TimeoutExpired:
                why = f"error: workload process timed out after {limit} s"
            if why or not out.exists():
                results.append(skipped(name, "(whole workload)", KILN, why or "error: no results written"))
                continue
            data = json.loads(out.read_text())
            found = [result_from_dict(e) for e in data["results"]]
            results.extend(found)
            _, module = _load(name)
            checks.extend(check_targets(found, _targets_for(module, found)))
            env_info = data["environment"]
            common.progress(f"{name}: done in {time.perf_counter() - start:.1f} s")
    return results, checks, env_info


def summaries(names: list[str], results: list[Result]) -> list[str]:
    """Each named workload's module ``summary`` of the results, where it has one and says something."""
    texts = []
    for module in dict.fromkeys(_load(name)[1] for name in names):
        summary = getattr(module, "summary", None)
        text = summary(results) if summary is not None else ""
        if text:
            texts.append(text)
    return texts


def _flags(args: argparse.Namespace) -> list[str]:
    flags = (["--quick"] if args.quick else []) + ([] if args.torch_compile else ["--no-torch-compile"])
    flags += ["--device", args.device] + (["--busy"] if args.busy else [])
    return flags + (["--kiln-backend", args.kiln_backend] if args.kiln_backend else [])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument(
        "workloads", nargs="*", metavar="workload", help=f"any of: {', '.join(WORKLOADS)} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, few short repeats (a smoke run)")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"where to write results (default: {DEFAULT_JSON})"
    )
    parser.add_argument(
        "--threads", type=int, default=_default_threads(), help="threads for every library (default: all cores)"
    )
    parser.add_argument(
        "--no-torch-compile", dest="torch_compile", action="store_false", help="skip the torch.compile references"
    )
    parser.add_argument("--kiln-backend", help="kiln.compile's backend (default: kiln's default)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help=f"cpu (default) or cuda: the GPU workloads {', '.join(CUDA_WORKLOADS)}")  # fmt: skip
    parser.add_argument("--in-process", action="store_true", help="run every workload in this process")
    parser.add_argument("--busy", action="store_true",
                        help="eager: time every program again while another process keeps one core busy")  # fmt: skip
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one workload, JSON only
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    known = CUDA_WORKLOADS if args.device == "cuda" else WORKLOADS
    names = list(dict.fromkeys(args.workloads)) or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        device = " (with --device cuda)" if args.device == "cuda" else ""
        parser.error(f"unknown workload(s) {', '.join(unknown)}; expected any of{device}: {', '.join(known)}")
    common.OPTIONS.torch_compile = args.torch_compile
    common.OPTIONS.kiln_backend = args.kiln_backend
    common.OPTIONS.busy = args.busy
    if args.child or args.in_process:
        common.configure_threads(args.threads)
        results, checks = run_in_process(names, args.quick)
        env_info = None
    else:
        results, checks, env_info = run_in_subprocesses(names, args)
    path = write_json(args.json, results, checks, env_info)
    if args.child:
        return 0
    print(format_table(results, checks))
    if checks:
        print()
        print(format_targets(checks))
    for text in summaries(names, results):
        print()
        print(text)
    for line in failures(results):
        print(line)
    print(f"\nwrote {path}")
    missed = [c for c in checks if c.status not in ("met", "skipped")]
    return 1 if args.strict and (missed or failures(results)) else 0


if __name__ == "__main__":
    sys.exit(main())
