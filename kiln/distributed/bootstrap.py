"""A worker of ``python -m kiln.distributed.run``: ``python -m kiln.distributed.bootstrap script.py args``.

Sets the environment a PyTorch training script reads (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``) from MPI, runs the script as ``__main__``, and if it raises, prints the
traceback prefixed with the rank (through the launcher, which prints it when the job ended) and
aborts every process of the job (``MPI_Abort``): the others
may be waiting in a collective for this one, and would otherwise wait until their timeout. When
the script ran to its end it records so (``rank-R.finished``, see ``kiln.distributed.supervise``):
the launcher takes a rank that exits without that record for one that ended early.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
import traceback

from . import supervise

#: How long a failing rank waits before it aborts the job: ranks that fail together (a mismatched
#: collective raises on every rank) then all get to report, instead of the first one's abort killing
#: the others mid-report. A rank that fails alone costs the job this much more.
ABORT_DELAY_S = 0.3


def _abort(comm, code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_DELAY_S)
    comm.Abort(code)


def main() -> None:
    from mpi4py import MPI  # noqa: PLC0415 - the launcher needs mpi4py; importing it joins the job

    world = MPI.COMM_WORLD
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    rank = world.Get_rank()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world.Get_size()), LOCAL_RANK=str(local.Get_rank()),
                      LOCAL_WORLD_SIZE=str(local.Get_size()), GROUP_RANK="0")  # fmt: skip
    local.Free()
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m kiln.distributed.bootstrap script.py [args...] (or -m module)")
    as_module = sys.argv[1] == "-m"
    target = sys.argv[2] if as_module else sys.argv[1]
    sys.argv = sys.argv[2:] if as_module else sys.argv[1:]
    try:
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as stop:
        if stop.code in (None, 0):
            _finished(rank)
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if code != 0:
            if not isinstance(stop.code, int):
                _report(f"[rank {rank}] {stop.code}\n", rank)
            _abort(world, code)
        raise
    except BaseException:  # noqa: BLE001 - any failure of the script ends the whole job
        lines = traceback.format_exc().splitlines()
        lines.append(f"kiln.distributed.run: worker {rank} failed; aborting the job")
        _report("\n".join(f"[rank {rank}] {line}" for line in lines) + "\n", rank)
        _abort(world, 1)
    else:
        _finished(rank)


def _finished(rank: int) -> None:
    folder = os.environ.get(supervise.RUN_DIR)
    if folder:
        supervise.write_record(folder, rank, "finished")


def _report(text: str, rank: int) -> None:
    """Where the launcher collects failures, write ``text`` to a file it prints after the job: output
    forwarded through mpiexec can be lost when an abort tears the job down. Else, to stderr."""
    folder = os.environ.get(supervise.RUN_DIR)
    if not folder:
        print(text, end="", file=sys.stderr)
        return
    supervise.write_record(folder, rank, "txt", text)


if __name__ == "__main__":
    main()
