"""The NCCL communicator: collectives on CUDA tensors through ``cupy.cuda.nccl``, one process per GPU.

MPI does the bootstrap (rank 0 makes NCCL's unique id and broadcasts it over ``MPI_COMM_WORLD``),
then every operation is enqueued on the current CUDA stream; its "request" is a CUDA event
recorded after it, so ``Work.wait`` and the timeout work exactly as for MPI. The API is the
same as ``MPICommunicator``'s, on cupy arrays. NCCL has no gather, scatter or receive-from-any:
those raise. (Written against cupy's documented NCCL binding; this machine has no GPU, so it was
not run here: see the README.)
"""

from __future__ import annotations

import os

from ._mpi import MPICommunicator


def _nccl():
    try:
        import cupy  # noqa: PLC0415 - optional, only for the NCCL backend
        from cupy.cuda import nccl  # noqa: PLC0415
    except Exception as error:  # noqa: BLE001 - no cupy, no CUDA, or cupy without NCCL
        raise RuntimeError(f"the NCCL backend needs cupy with NCCL and a CUDA GPU: {error}") from error
    return cupy, nccl


class _EventRequest:
    """Done when the GPU passed the point where the operation was enqueued."""

    source: int  # set by recv, as MPI's status gives the source of a message

    def __init__(self, cupy) -> None:
        self.event = cupy.cuda.Event(block=False, disable_timing=True)
        self.event.record()

    def Test(self) -> bool:  # noqa: N802 - the request protocol is MPI's spelling
        return self.event.done


class NCCLCommunicator:
    def __init__(self, mpi: MPICommunicator, comm) -> None:
        self.mpi = mpi  # the same processes over MPI: bootstrap and splitting
        self.comm = comm
        self.rank, self.size = mpi.rank, mpi.size

    @property
    def control(self) -> MPICommunicator:
        """The MPI communicator of the same processes, for the cross-rank check's messages."""
        return self.mpi

    @classmethod
    def from_mpi(cls, mpi: MPICommunicator, device_id=None) -> NCCLCommunicator:
        cupy, nccl = _nccl()
        index = getattr(device_id, "index", device_id)
        cupy.cuda.Device(int(os.environ.get("LOCAL_RANK", 0)) if index is None else int(index)).use()
        uid = nccl.get_unique_id() if mpi.rank == 0 else None
        uid = mpi.comm.bcast(uid, root=0)
        return cls(mpi, nccl.NcclCommunicator(mpi.size, uid, mpi.rank))

    # ----------------------------------------------------------------- helpers
    @staticmethod
    def _dtype(nccl, array) -> int:
        names = {"float16": "FLOAT16", "float32": "FLOAT32", "float64": "FLOAT64", "int8": "INT8",
                 "uint8": "UINT8", "int32": "INT32", "int64": "INT64", "bool": "UINT8"}  # fmt: skip
        name = names.get(array.dtype.name)
        if name is None:
            raise TypeError(f"NCCL cannot communicate {array.dtype.name} tensors")
        return getattr(nccl, f"NCCL_{name}")

    @staticmethod
    def _op(nccl, op: str) -> int:
        ops = {"sum": "SUM", "product": "PROD", "max": "MAX", "min": "MIN"}
        if op not in ops:
            raise ValueError(f"NCCL has no reduction {op!r}")
        return getattr(nccl, f"NCCL_{ops[op]}")

    def _run(self, enqueue) -> _EventRequest:
        cupy, nccl = _nccl()
        enqueue(nccl, cupy.cuda.get_current_stream().ptr)
        return _EventRequest(cupy)

    # ----------------------------------------------------------------- the communicator API
    def allreduce(self, array, op: str):
        return self._run(lambda nccl, s: self.comm.allReduce(
            array.data.ptr, array.data.ptr, array.size, self._dtype(nccl, array), self._op(nccl, op), s))  # fmt: skip

    def broadcast(self, array, root: int):
        return self._run(lambda nccl, s: self.comm.bcast(array.data.ptr, array.size, self._dtype(nccl, array), root, s))

    def allgather(self, send, recv):
        return self._run(lambda nccl, s: self.comm.allGather(
            send.data.ptr, recv.data.ptr, send.size, self._dtype(nccl, send), s))  # fmt: skip

    def reduce_scatter(self, send, recv, op: str):
        return self._run(lambda nccl, s: self.comm.reduceScatter(
            send.data.ptr, recv.data.ptr, recv.size, self._dtype(nccl, send), self._op(nccl, op), s))  # fmt: skip

    def reduce(self, array, root: int, op: str):
        return self._run(lambda nccl, s: self.comm.reduce(
            array.data.ptr, array.data.ptr, array.size, self._dtype(nccl, array), self._op(nccl, op), root, s))  # fmt: skip

    def barrier(self):
        cupy, _ = _nccl()
        return self.allreduce(cupy.zeros(1, dtype=cupy.float32), "sum")

    def send(self, array, dst: int, tag: int):
        return self._run(lambda nccl, s: self.comm.send(array.data.ptr, array.size, self._dtype(nccl, array), dst, s))

    def recv(self, array, src: int | None, tag: int):
        if src is None:
            raise ValueError("NCCL cannot receive from any source: give src")
        request = self._run(
            lambda nccl, s: self.comm.recv(array.data.ptr, array.size, self._dtype(nccl, array), src, s)
        )
        request.source = src
        return request

    def gather(self, send, recv, root: int):
        raise NotImplementedError("gather on the NCCL backend: use all_gather (NCCL has no gather)")

    def scatter(self, send, recv, root: int):
        raise NotImplementedError("scatter on the NCCL backend: use broadcast and slice (NCCL has no scatter)")

    def alltoall(self, send, recv):
        raise NotImplementedError("all_to_all on the NCCL backend")

    def split(self, color: int | None, key: int) -> NCCLCommunicator | None:
        sub = self.mpi.split(color, key)
        if sub is None:
            return None
        _, nccl = _nccl()
        uid = sub.comm.bcast(nccl.get_unique_id() if sub.rank == 0 else None, root=0)
        return NCCLCommunicator(sub, nccl.NcclCommunicator(sub.size, uid, sub.rank))

    def free(self) -> None:
        self.comm.destroy()
        self.mpi.free()
