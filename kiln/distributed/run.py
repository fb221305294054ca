"""The launcher: ``python -m kiln.distributed.run --nproc-per-node N script.py [args...]``.

Like ``torchrun`` for one machine: starts N worker processes through ``mpiexec`` (the one next to
this Python, else the first on PATH), each running ``script.py`` as ``__main__`` with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` set, and one thread per worker unless
``OMP_NUM_THREADS`` says otherwise (N workers each using every core would fight over them).
A worker that raises prints its traceback (prefixed with its rank) and aborts the whole job: the
launcher exits with a non-zero status instead of leaving the other workers waiting.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def find_mpiexec() -> str:
    """``mpiexec`` of this Python's environment (pip's mpich), else the first on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise SystemExit(
            "kiln.distributed.run: no mpiexec found next to the Python interpreter or on PATH; "
            "install an MPI library (pip install 'kiln[distributed]' brings mpich)"
        )
    return found


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kiln.distributed.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, help="worker processes to start")
    parser.add_argument(
        "--nnodes", default="1", help="machines in the job (only 1 here; use mpiexec's host files beyond)"
    )
    parser.add_argument("--standalone", action="store_true", help="accepted for torchrun command lines; no effect")
    parser.add_argument("-m", "--module", action="store_true", help="run the target as a module, as python -m does")
    parser.add_argument("--mpiexec-args", default="", help="extra arguments passed to mpiexec, as one string")
    parser.add_argument("script", help="the training script (or module with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    options = parser.parse_args(argv)
    if options.nproc_per_node < 1:
        parser.error(f"--nproc-per-node must be at least 1, got {options.nproc_per_node}")
    if str(options.nnodes) not in ("1", "1:1"):
        parser.error("--nnodes: this launcher starts one machine's workers; run mpiexec with a host file for more")
    return options


def worker_command(options: argparse.Namespace) -> list[str]:
    target = ["-m", options.script] if options.module else [options.script]
    return [find_mpiexec(), "-n", str(options.nproc_per_node), *options.mpiexec_args.split(),
            sys.executable, "-m", "kiln.distributed.bootstrap", *target, *options.args]  # fmt: skip


def worker_environment() -> dict[str, str]:
    env = dict(os.environ)
    # The workers import the same kiln as this launcher, and find mpiexec's helpers beside it.
    kiln_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (kiln_root, env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, "1")
    return env


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    env = worker_environment()
    with tempfile.TemporaryDirectory(prefix="kiln-distributed-") as failures:
        env["KILN_DISTRIBUTED_FAILURES"] = failures  # the workers' tracebacks, printed once the job ended
        completed = subprocess.run(worker_command(options), env=env, check=False)
        for report in sorted(Path(failures).glob("rank-*.txt")):
            sys.stderr.write(report.read_text())
    sys.stderr.flush()
    return completed.returncode


if __name__ == "__main__":
    sys.exit(main())
