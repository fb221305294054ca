"""The MPI communicator: kiln's collectives on numpy arrays through mpi4py (imported lazily).

Every operation is started non-blocking (``Iallreduce``, ``Ibcast``...) on the arrays' own memory
(mpi4py reads numpy's buffer interface: no copy) and returns an MPI request; blocking calls are
the same requests waited on with a deadline, so that a peer that stopped answering becomes an
error instead of a hang. Waiting polls ``Test`` (which also drives MPI's progress engine) and
sleeps between polls: a blocking MPI call spins a core, and kiln's workers share their cores.
"""

from __future__ import annotations

import time

import numpy as np

_OPS = {"sum": "SUM", "product": "PROD", "max": "MAX", "min": "MIN", "band": "BAND", "bor": "BOR", "bxor": "BXOR"}


def mpi():
    """The ``mpi4py.MPI`` module, with a clear error when it is missing."""
    try:
        from mpi4py import MPI  # noqa: PLC0415 - optional dependency, imported when first needed
    except ImportError as error:
        raise RuntimeError(
            "kiln.distributed's MPI backend needs mpi4py and an MPI library: pip install 'kiln[distributed]' "
            "(mpi4py and mpich)"
        ) from error
    return MPI


#: How often a long wait looks whether a peer has ended, and how long it keeps driving MPI after it
#: saw one (the peer may have done its part just before it ended: its messages may be in flight).
PEER_LOOK_S, PEER_GRACE_S = 0.2, 5.0

#: Receives waiting for their sender's signature (``_check.CheckedReceive``): every wait advances them.
PENDING: list = []


def wait_request(request, deadline: float | None, what: str, peers=None) -> None:
    """Wait for ``request``; past ``deadline`` (a ``time.monotonic()`` value) raise naming ``what``.
    ``peers`` (a ``supervise.PeerWatch``): raise ``PeerEndedError`` when one of them has ended."""
    pause, start = 0.0, time.monotonic()
    look, gone, gone_at = start + PEER_LOOK_S, None, 0.0
    while not request.Test():
        for receive in PENDING[:]:
            receive.advance()
        now = time.monotonic()
        if deadline is not None and now > deadline:
            raise DistributedTimeoutError(
                f"{what} did not complete within the process group's timeout: a peer process stopped "
                "answering (it died, hangs, or never reached the same collective)"
            )
        if peers is not None and now >= look:
            look = now + PEER_LOOK_S
            if gone is None:
                gone, gone_at = peers.ended(), now
            elif now - gone_at > PEER_GRACE_S:
                raise PeerEndedError(
                    f"{what} cannot complete: {gone} while this rank waits for it here; every rank must "
                    "call the same collectives in the same order"
                )
        # Spin briefly (collectives inside a step are short), then back off to at most 1 ms.
        time.sleep(pause)
        pause = min(1e-3, pause * 2 + 1e-6)


class DistributedTimeoutError(RuntimeError):
    """A collective or point-to-point operation waited longer than its process group's timeout."""


class PeerEndedError(RuntimeError):
    """A collective or receive waits for a peer process that has already ended."""


class ReceiveRequest:
    """A receive's request that keeps its status (``source``: the sender, once complete)."""

    def __init__(self, request) -> None:
        self.request = request
        self.status = mpi().Status()

    def Test(self) -> bool:  # noqa: N802 - the request protocol is MPI's spelling
        return self.request.Test(self.status)

    @property
    def source(self) -> int:
        return self.status.Get_source()


class MPICommunicator:
    """One MPI communicator (the world or a sub-group's); methods take contiguous numpy arrays."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    @property
    def control(self) -> MPICommunicator:
        """The MPI communicator for the ranks' own messages (the cross-rank check): this one."""
        return self

    def dup(self) -> MPICommunicator:
        """A communicator of the same processes whose messages never meet this one's."""
        return MPICommunicator(self.comm.Dup())

    def _op(self, op: str):
        return getattr(mpi(), _OPS[op])

    def allreduce(self, array: np.ndarray, op: str):
        return self.comm.Iallreduce(mpi().IN_PLACE, array, self._op(op))

    def broadcast(self, array: np.ndarray, root: int):
        return self.comm.Ibcast(array, root=root)

    def allgather(self, send: np.ndarray, recv: np.ndarray):
        return self.comm.Iallgather(send, recv)

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str):
        return self.comm.Ireduce_scatter_block(send, recv, self._op(op))

    def reduce(self, array: np.ndarray, root: int, op: str):
        MPI = mpi()
        if self.rank == root:
            return self.comm.Ireduce(MPI.IN_PLACE, array, self._op(op), root=root)
        return self.comm.Ireduce(array, None, self._op(op), root=root)

    def gather(self, send: np.ndarray, recv: np.ndarray | None, root: int):
        return self.comm.Igather(send, recv, root=root)

    def scatter(self, send: np.ndarray | None, recv: np.ndarray, root: int):
        return self.comm.Iscatter(send, recv, root=root)

    def alltoall(self, send: np.ndarray, recv: np.ndarray):
        return self.comm.Ialltoall(send, recv)

    def barrier(self):
        return self.comm.Ibarrier()

    def send(self, array: np.ndarray, dst: int, tag: int):
        return self.comm.Isend(array, dest=dst, tag=tag)

    def recv(self, array: np.ndarray, src: int | None, tag: int) -> ReceiveRequest:
        MPI = mpi()
        return ReceiveRequest(self.comm.Irecv(array, source=MPI.ANY_SOURCE if src is None else src, tag=tag))

    def split(self, color: int | None, key: int) -> MPICommunicator | None:
        MPI = mpi()
        comm = self.comm.Split(MPI.UNDEFINED if color is None else color, key)
        return None if comm == MPI.COMM_NULL else MPICommunicator(comm)

    def free(self) -> None:
        if self.comm != mpi().COMM_WORLD:
            self.comm.Free()
