"""The launcher: ``python -m kiln.distributed.run --nproc-per-node N script.py [args...]``.

Like ``torchrun`` for one machine: starts N worker processes through ``mpiexec`` (the one next to
this Python, else the first on PATH), each running ``script.py`` as ``__main__`` with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` set, and one thread per worker unless
``OMP_NUM_THREADS`` says otherwise (N workers each using every core would fight over them).
A worker that raises prints its traceback (prefixed with its rank) and aborts the whole job: the
launcher exits with a non-zero status instead of leaving the other workers waiting.

Every rank runs under a supervisor (``kiln.distributed.supervise``) that records how it ended. A
rank that ends while the job still runs -- killed by a signal, exiting non-zero, or exiting 0
before its script ended (``os._exit(0)``) -- makes the launcher stop the other ranks (SIGTERM,
then SIGKILL) and exit non-zero, naming the rank and how it ended. A rank whose script ran to
its end may exit before the others: that is not a fault (but a peer still waiting for it in a
collective is told so, and raises).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import bootstrap, supervise


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
            sys.executable, supervise.__file__, *target, *options.args]  # fmt: skip


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
    nproc = options.nproc_per_node
    with tempfile.TemporaryDirectory(prefix="kiln-distributed-") as folder:
        env[supervise.RUN_DIR] = folder  # the ranks' records, and the tracebacks printed once the job ended
        job = subprocess.Popen(worker_command(options), env=env)
        try:
            while job.poll() is None and not _faults(folder, nproc):
                time.sleep(0.05)
            if job.poll() is None:  # a rank failed: let ranks failing with it report before the stop
                time.sleep(bootstrap.ABORT_DELAY_S)
        finally:
            if job.poll() is None:  # a rank failed (or the launcher itself was interrupted)
                _stop(job, folder, nproc)
        for report in sorted(Path(folder).glob("rank-*.txt")):
            sys.stderr.write(report.read_text())
        status, message = _verdict(folder, nproc, job.returncode)
    sys.stderr.write(message)
    sys.stderr.flush()
    return status


class _Ending:
    """What the records say of how one rank ended (``kiln.distributed.supervise``)."""

    def __init__(self, folder: str, rank: int) -> None:
        exited = supervise.read_exit(folder, rank)
        report = supervise.record_path(folder, rank, "txt")
        self.reported = os.path.exists(report)  # it raised, or sys.exit with a non-zero status
        self.finished = os.path.exists(supervise.record_path(folder, rank, "finished"))
        self.returncode = None if exited is None else exited[0]
        self.time = os.path.getmtime(report) if self.reported else exited[1] if exited is not None else float("inf")

    @property
    def fault(self) -> bool:
        return self.reported or (self.returncode is not None and (self.returncode != 0 or not self.finished))

    def __str__(self) -> str:
        if self.reported:
            stopped = "" if self.returncode in (None, 1) else f" ({supervise.describe_ending(self.returncode, False)})"
            return f"raised (its traceback is above) and aborted the job{stopped}"
        if self.returncode is not None:
            return supervise.describe_ending(self.returncode, self.finished)
        if self.finished:
            return "finished its script, then was stopped with the job"
        return "stopped with the job (no exit status recorded: mpiexec's cleanup killed its supervisor)"


def _faults(folder: str, nproc: int) -> list[int]:
    return [rank for rank in range(nproc) if _Ending(folder, rank).fault]


def _verdict(folder: str, nproc: int, mpiexec_status: int) -> tuple[int, str]:
    """The launcher's exit status and closing message: the first rank that failed, named, and how
    every rank ended; a rank that reported a traceback counts as first (mpiexec's cleanup after an
    abort may record the others' ends before its own)."""
    endings = [_Ending(folder, rank) for rank in range(nproc)]
    failed = [rank for rank in range(nproc) if endings[rank].fault]
    if not failed:
        if all(ending.returncode is not None for ending in endings):
            return mpiexec_status, ""
        missing = [rank for rank in range(nproc) if endings[rank].returncode is None]
        return mpiexec_status or 1, f"kiln.distributed.run: rank(s) {missing} left no record of how they ended\n"
    reported = [rank for rank in failed if endings[rank].reported]
    first = min(reported or failed, key=lambda rank: endings[rank].time)
    lines = [f"kiln.distributed.run: rank {first} {endings[first]}; the job was stopped. How each rank ended:"]
    lines += [f"  rank {rank}: {ending}" for rank, ending in enumerate(endings)]
    code = endings[first].returncode
    return (code if code is not None and code > 0 else 1), "\n".join(lines) + "\n"


def _stop(job: subprocess.Popen, folder: str, nproc: int, grace: float = 3.0) -> None:
    """Stop every rank still running (SIGTERM, then SIGKILL after ``grace`` seconds), then mpiexec."""
    for number in (signal.SIGTERM, signal.SIGKILL):
        for rank in range(nproc):
            if supervise.read_exit(folder, rank) is not None:
                continue  # ended: its process id may be another process's by now
            try:
                os.kill(int(Path(supervise.record_path(folder, rank, "pid")).read_text()), number)
            except (OSError, ValueError):
                pass  # not started yet, or already gone
        end = time.monotonic() + grace
        while job.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        if job.poll() is not None:
            return
    job.kill()
    job.wait()


if __name__ == "__main__":
    sys.exit(main())
