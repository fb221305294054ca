"""How each rank of a launched job ended: the records, and the per-rank supervisor that writes them.

``python -m kiln.distributed.run`` starts ``mpiexec``, which starts this file once per rank (by its
path, so that it imports nothing of kiln and starts in milliseconds). It runs the rank's real
process, ``python -m kiln.distributed.bootstrap script.py ...``, as its child, waits for it, and
records how it ended: only a parent learns a process's exit status or the signal that killed it,
and ``mpiexec`` reports neither reliably (a rank ending with ``os._exit(0)`` left it exiting 0).

The records, files in the folder ``KILN_DISTRIBUTED_RUN_DIR`` that the launcher makes:

- ``rank-R.pid``: the rank's process id (the launcher stops it when another rank failed);
- ``rank-R.finished``: written by the bootstrap when the script ran to its end (it returned, or
  called ``sys.exit(0)``); a rank that exits 0 without it ended *early* -- a fault;
- ``rank-R.exit``: written here, ``"<returncode> <unix time>"``; a negative returncode is the
  signal that killed the process;
- ``rank-R.txt``: the traceback of a rank that raised (the bootstrap).

The launcher reads them while the job runs; a rank waiting in a collective reads them too
(``kiln.distributed._mpi.wait_request``), so that it learns a peer has gone instead of waiting
for its timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

RUN_DIR = "KILN_DISTRIBUTED_RUN_DIR"


def record_path(folder: str, rank: int, kind: str) -> str:
    return os.path.join(folder, f"rank-{rank}.{kind}")


def write_record(folder: str, rank: int, kind: str, text: str = "") -> None:
    """Write a record atomically (readers poll the folder while it is written)."""
    path = record_path(folder, rank, kind)
    with open(path + ".tmp", "w") as file:
        file.write(text)
    os.replace(path + ".tmp", path)


def read_exit(folder: str, rank: int) -> tuple[int, float] | None:
    """``(returncode, unix time)`` of a rank that ended, else None."""
    try:
        with open(record_path(folder, rank, "exit")) as file:
            code, when = file.read().split()
    except (OSError, ValueError):
        return None
    return int(code), float(when)


def describe_ending(returncode: int, finished: bool) -> str:
    """How a process ended, in words: ``killed by signal 9 (SIGKILL)``, ``exited with status 3``..."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-returncode} ({name})"
    if returncode == 0 and not finished:
        return "exited with status 0 before its script ended (os._exit, or a library ending the process)"
    return f"exited with status {returncode}" if returncode else "finished its script and exited with status 0"


class PeerWatch:
    """Tells a rank waiting in a collective whether one of its peers (global ranks) has ended."""

    def __init__(self, peers: list[int]) -> None:
        self.folder = os.environ.get(RUN_DIR)
        self.peers = peers

    def ended(self) -> str | None:
        """``"rank R finished its script..."`` for the first peer that ended, else None."""
        if not self.folder:
            return None
        names = set(os.listdir(self.folder))
        for rank in self.peers:
            finished = f"rank-{rank}.finished" in names
            if finished or f"rank-{rank}.exit" in names:
                ended = read_exit(self.folder, rank)
                how = describe_ending(ended[0], finished) if ended else "finished its script"
                return f"rank {rank} {how}"
        return None


def _this_rank() -> int | None:
    """The rank ``mpiexec`` gave this process (MPICH's hydra: PMI_RANK; Open MPI's name too)."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _die_with_parent() -> None:
    """In the child: be killed when the supervisor is (Linux), so that no rank outlives its record."""
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main() -> int:
    command = [sys.executable, "-m", "kiln.distributed.bootstrap", *sys.argv[1:]]
    folder, rank = os.environ.get(RUN_DIR), _this_rank()
    if not folder or rank is None:  # not under kiln's launcher: be the rank itself
        os.execv(sys.executable, command)
    # close_fds=False: the child needs the descriptor through which mpiexec's PMI talks to it.
    child = subprocess.Popen(command, close_fds=False, preexec_fn=_die_with_parent)  # noqa: PLW1509
    write_record(folder, rank, "pid", str(child.pid))
    for stop in (signal.SIGTERM, signal.SIGINT):  # mpiexec or the launcher stopping the job: pass it on
        signal.signal(stop, lambda number, _frame: child.send_signal(number))
    returncode = child.wait()
    write_record(folder, rank, "exit", f"{returncode} {time.time()!r}")
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
