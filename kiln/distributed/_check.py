"""The cross-rank check: the ranks compare their calls before a collective or a message moves data.

MPI and NCCL trust every rank to pass the same count and type. Without a check an ``all_reduce``
of 4 elements on one rank and 8 on another "succeeds" and leaves an unreduced tail, float32
against float64 gives garbage or kills the job inside MPICH. So, before each collective, every
rank encodes its call -- the operation, its reduction and root, the dtype and shape -- as a
*signature* of ``SIGNATURE_SIZE`` int64, and the group all-reduces ``[signature, -signature]``
with MAX: each rank learns the largest and the smallest value of every field, and the ranks
agree exactly when both equal its own. Only when they disagree are the signatures gathered, so
that every rank raises the same ``CollectiveMismatchError`` naming what each rank passed.

A send carries its signature in a message ahead of the payload; the receiver posts its payload
receive only once that signature arrived and matched its own buffer (a receive of the wrong size
would overrun or crash), and raises ``CollectiveMismatchError`` if it did not -- after receiving
the sent payload into a scratch buffer, so that no message is left unmatched (MPICH fails
``MPI_Finalize`` on one) and the sender's send completes. The sender cannot know; the receiver's
failure ends the job through the launcher unless it is caught.

The exchange runs over the group's MPI communicator whatever the backend (an NCCL group keeps
one for this) and waits like the operation itself (the group's timeout). It costs one small
all-reduce per collective: the switch is ``KILN_DISTRIBUTED_DEBUG=OFF`` (see the package's
docstring), read when a process group is made.
"""

from __future__ import annotations

import functools
import os
import time
import zlib
from dataclasses import dataclass

import numpy as np

from . import _mpi

KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
         "reduce_scatter_tensor", "gather", "scatter", "barrier", "send")  # fmt: skip
REDUCTIONS = ("", "sum", "avg", "product", "max", "min", "band", "bor", "bxor")
MAX_DIMS = 6  # dims carried for the error message; the shape's checksum covers any rank
SIGNATURE_SIZE = 8 + MAX_DIMS
_DTYPES = {np.dtype(code).num: np.dtype(code) for code in np.typecodes["All"] if code not in "OUVSa"}


def enabled() -> bool:
    """Whether process groups made now check calls across ranks (``KILN_DISTRIBUTED_DEBUG`` not OFF)."""
    return os.environ.get("KILN_DISTRIBUTED_DEBUG", "").strip().upper() != "OFF"


def agreed_switch(control) -> bool:
    """``enabled()``, checked to be the same on every rank of the group over MPI communicator
    ``control`` (a rank checking while another does not would pair one's signature exchange with
    the other's data). Called once, when a group is made; raises on every rank if they differ."""
    mine = int(enabled())
    both = np.array([mine, -mine], dtype=np.int64)
    control.comm.Allreduce(_mpi.mpi().IN_PLACE, both, _mpi.mpi().MAX)
    if both[0] != -both[1]:
        raise RuntimeError(
            "KILN_DISTRIBUTED_DEBUG differs across the ranks of a process group: the cross-rank check is "
            f"{'on' if mine else 'off'} on rank {control.rank} but not on every rank. Set it the same on every "
            "rank (the launcher passes its environment to all of them), before init_process_group/new_group."
        )
    return bool(mine)


class CollectiveMismatchError(RuntimeError):
    """The ranks of a group called a collective (or a send and its receive) with different tensors."""


@dataclass(frozen=True)
class Call:
    """What one rank passes to an operation: the tensor whose shape and dtype must agree across ranks,
    the reduction and root where the operation has them, and ``extra`` (another size that must agree)."""

    op: str
    dtype: np.dtype | None = None
    shape: tuple[int, ...] = ()
    reduction: str = ""
    root: int = -1
    extra: int = -1

    def encode(self) -> np.ndarray:
        dims = [*self.shape[:MAX_DIMS], *[-1] * (MAX_DIMS - min(len(self.shape), MAX_DIMS))]
        numel = int(np.prod(self.shape, dtype=np.int64))
        fields = [KINDS.index(self.op), REDUCTIONS.index(self.reduction), self.root,
                  -1 if self.dtype is None else np.dtype(self.dtype).num, -1 if self.dtype is None else len(self.shape),
                  numel, zlib.crc32(repr(tuple(self.shape)).encode()), self.extra, *dims]  # fmt: skip
        return np.array(fields, dtype=np.int64)

    @staticmethod
    def decode(signature: np.ndarray) -> str:
        """The call a signature came from, in words: ``all_reduce of float32[4, 2] (op sum)``."""
        kind, reduction, root, dtype, ndim, numel, _, extra, *dims = (int(v) for v in signature)
        text = KINDS[kind] if 0 <= kind < len(KINDS) else f"an unknown operation ({kind})"
        if dtype >= 0:
            shown = [str(d) for d in dims[: min(ndim, MAX_DIMS)]] + (["..."] if ndim > MAX_DIMS else [])
            name = _DTYPES[dtype].name if dtype in _DTYPES else f"dtype #{dtype}"
            text += f" of {name}[{', '.join(shown)}] ({numel} elements)"
        details = [f"op {REDUCTIONS[reduction]}" if reduction > 0 else "", f"root {root}" if root >= 0 else "",
                   f"other tensor {extra} elements" if extra >= 0 else ""]  # fmt: skip
        details = [d for d in details if d]
        return text + (f" ({', '.join(details)})" if details else "")


@functools.lru_cache(maxsize=256)
def _both(call: Call) -> np.ndarray:
    """``[signature, -signature]`` of ``call``: a training loop repeats the same few calls, and
    encoding one costs about as much as the rest of the check's local work (measured: 9 us of 20)."""
    mine = call.encode()
    both = np.concatenate([mine, -mine])
    both.flags.writeable = False
    return both


def _array_module(array):
    """numpy for a numpy array, else cupy (a CUDA tensor's memory)."""
    if isinstance(array, np.ndarray):
        return np
    import cupy  # noqa: PLC0415 - only CUDA tensors get here

    return cupy


def _deadline(pg) -> float:
    return time.monotonic() + pg.timeout.total_seconds()


def check_collective(pg, call: Call) -> None:
    """Raise ``CollectiveMismatchError`` on every rank of ``pg`` unless all of them made the same call."""
    if not pg.check_calls:
        return
    expected = _both(call)
    both = expected.copy()
    what = f"{call.op} (the ranks' check of their shapes and dtypes)"
    _mpi.wait_request(pg.control.allreduce(both, "max"), _deadline(pg), what, pg.peers)
    if (both == expected).all():  # every rank's field is at most and at least this rank's
        return
    mine = expected[:SIGNATURE_SIZE]
    everyone = np.empty((pg.size(), SIGNATURE_SIZE), dtype=np.int64)
    _mpi.wait_request(pg.control.allgather(mine, everyone), _deadline(pg), what, pg.peers)
    calls = "\n".join(f"  rank {pg.ranks[r]}: {Call.decode(s)}" for r, s in enumerate(everyone))
    raise CollectiveMismatchError(
        f"{call.op}: the ranks of the group called it with different arguments (this is rank "
        f"{pg.ranks[pg.rank()]}); each rank passed:\n{calls}\nEvery rank must call the same collective, in the "
        "same order, with tensors of the same shape and dtype and the same op and src/dst. "
        "(Checked because KILN_DISTRIBUTED_DEBUG is not OFF.)"
    )


def send_signature(pg, call: Call, dst: int, tag: int):
    """Start sending this rank's signature of a send to group rank ``dst``; returns its request."""
    return pg.messages.send(call.encode(), dst, tag)


class CheckedReceive:
    """A receive whose payload is posted once the sender's signature arrived and matched ``call``.

    Every wait of this process advances it (``_mpi.PENDING``): a receive started with ``irecv``
    must get its payload posted even while the process waits on something else (a send in a
    ring), or a large message would never be matched."""

    def __init__(self, pg, call: Call, array, src: int | None, tag: int) -> None:
        self.pg, self.call, self.array, self.tag = pg, call, array, tag
        self.signature = np.empty(SIGNATURE_SIZE, dtype=np.int64)
        self.header = pg.messages.recv(self.signature, src, tag)
        self.payload = None
        self.error: str | None = None
        _mpi.PENDING.append(self)

    def advance(self) -> None:
        """Post the payload's receive once the signature came (never raises: errors wait for Test)."""
        if self.payload is not None or self.error is not None or not self.header.Test():
            return
        _mpi.PENDING.remove(self)
        mine = self.call.encode()
        if np.array_equal(self.signature, mine):
            self.payload = self.pg.communicator.recv(self.array, self.header.source, self.tag)
            return
        _, _, _, dtype, _, numel, *_ = (int(v) for v in self.signature)
        if dtype in _DTYPES:  # receive what was sent, and drop it
            scratch = _array_module(self.array).empty(numel, dtype=_DTYPES[dtype])
            self.payload = self.pg.communicator.recv(scratch, self.header.source, self.tag)
        sender, me = self.pg.ranks[self.header.source], self.pg.ranks[self.pg.rank()]
        self.error = (
            f"recv: the message from rank {sender} (tag {self.tag}) does not fit this rank's tensor (this is "
            f"rank {me}):\n  rank {sender} sent: {Call.decode(self.signature)}\n  rank {me} expected: "
            f"{Call.decode(mine)}\nThe sender must send a tensor of the receiving tensor's shape and dtype. "
            "(Checked because KILN_DISTRIBUTED_DEBUG is not OFF.)"
        )

    def Test(self) -> bool:  # noqa: N802 - the request protocol is MPI's spelling
        self.advance()
        if self.error is not None:
            if self.payload is not None:  # the dropped payload: it is on its way (the header came first)
                _mpi.wait_request(self.payload, _deadline(self.pg), "recv of a mismatched message", self.pg.peers)
            raise CollectiveMismatchError(self.error)
        return self.payload is not None and self.payload.Test()

    @property
    def source(self) -> int:
        return self.header.source
