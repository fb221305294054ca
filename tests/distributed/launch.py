"""Start a worker script of ``tests/distributed/workers`` through ``python -m kiln.distributed.run``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"


def require_mpi() -> None:
    """Skip unless mpi4py imports and an ``mpiexec`` is at hand (next to Python or on PATH)."""
    pytest.importorskip("mpi4py")
    from kiln.distributed.run import find_mpiexec  # noqa: PLC0415

    try:
        find_mpiexec()
    except SystemExit as error:
        pytest.skip(str(error))


def launch(script: str, nproc: int, *args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``workers/<script>`` on ``nproc`` processes; returns the finished process and its seconds."""
    require_mpi()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "kiln.distributed.run", "--nproc-per-node", str(nproc),
               str(WORKERS / script), *args]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return done, time.monotonic() - start


def passed(done: subprocess.CompletedProcess, rank: int, checks: int) -> None:
    """The job exited 0 and ``rank`` printed ``rank R passed N checks`` with the expected N (a
    worker raises at its first failed check; the count shows that none was skipped)."""
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert f"rank {rank} passed {checks} checks" in done.stdout, done.stdout + done.stderr
