"""Collectives and point-to-point operations on kiln tensors, with PyTorch's names and signatures.

Each operation is started non-blocking on the tensors' own memory; ``async_op=True`` returns a
``Work`` whose ``wait()`` finishes it (and whatever the operation owes afterwards: AVG's division,
copying a non-contiguous tensor's staged values back), otherwise the call waits itself. Waits end
in ``DistributedTimeoutError`` after the group's timeout. Inside ``kiln.compile`` the blocking
``all_reduce`` becomes a graph node (``kiln.distributed.traced``); the others stop the trace.

Before any data moves, the ranks compare their calls (``kiln.distributed._check``): a collective
called with different shapes, dtypes, ops or roots raises ``CollectiveMismatchError`` on every
rank, a receive whose sender sent another shape or dtype raises it on the receiver.
"""

from __future__ import annotations

import time

from kiln.frontend.jit import state as _jit

from . import process_group as pg_mod
from ._check import Call, CheckedReceive, check_collective, send_signature
from ._mpi import wait_request
from .process_group import ReduceOp

_TAG_DEFAULT = 0


class Work:
    """The handle of an operation started with ``async_op=True``."""

    def __init__(self, requests, pg, what: str, finish=None) -> None:
        self._requests = list(requests)
        self._deadline = time.monotonic() + pg.timeout.total_seconds() if pg is not None else None
        self._peers = pg.peers if pg is not None else None
        self._what = what
        self._finish = finish
        self._done = not self._requests and finish is None
        self._result = None

    def is_completed(self) -> bool:
        """Whether the operation finished (finishing it if its requests did)."""
        if self._done:
            return True
        if all(r.Test() for r in self._requests):
            self.wait()
        return self._done

    def is_success(self) -> bool:
        return self._done

    def wait(self, timeout=None) -> bool:
        """Block until the operation finished; ``timeout`` (a timedelta) shortens the group's."""
        if self._done:
            return True
        deadline = self._deadline
        if timeout is not None:
            deadline = min(deadline or float("inf"), time.monotonic() + timeout.total_seconds())
        for request in self._requests:
            wait_request(request, deadline, self._what, self._peers)
        if self._finish is not None:
            self._result = self._finish()
        self._done = True
        return True

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        raise NotImplementedError("Work.get_future: kiln's Work has no futures; call wait()")


def _finish(work: Work, async_op: bool):
    if async_op:
        return work
    work.wait()
    return None


def _array(tensor, what: str):
    """The memory an operation reads and writes: the tensor's own when contiguous, else a staged copy."""
    from kiln.frontend.tensor import Tensor  # noqa: PLC0415

    if not isinstance(tensor, Tensor):
        raise TypeError(f"{what}: expected a kiln Tensor, got {type(tensor).__name__}")
    data = tensor._data
    if data.flags.c_contiguous:
        return data, None
    staged = data.copy()
    return staged, staged


def _written(tensor, staged) -> None:
    """The operation wrote into ``tensor``: copy a staged buffer back, bump the version (in-place op)."""
    if staged is not None:
        tensor._data[...] = staged
    tensor._version[0] += 1


def _check_calls(pg, op: str, tensor=None, reduction: str = "", root: int = -1, extra: int = -1) -> None:
    """Compare this call with the other ranks' (``_check``); raises on every rank if they differ."""
    dtype, shape = (None, ()) if tensor is None else (tensor._data.dtype, tuple(tensor.shape))
    check_collective(pg, Call(op, dtype, shape, reduction, root, extra))


def _check_op(op, tensor, what: str) -> str:
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{what}: expected op as a kiln.distributed.ReduceOp, got {op!r}")
    if op is ReduceOp.AVG and not tensor.dtype.is_floating_point:
        raise TypeError(f"{what}: ReduceOp.AVG needs a floating-point tensor, got {tensor.dtype}")
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and tensor.dtype.is_floating_point:
        raise TypeError(f"{what}: {op.name} needs an integer or bool tensor, got {tensor.dtype}")
    return "sum" if op is ReduceOp.AVG else op.value


def _untraceable(what: str) -> None:
    _jit.unsafe(f"kiln.distributed.{what} inside a compiled call (only all_reduce becomes a graph node)")


def all_reduce(tensor, op: ReduceOp = ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce ``tensor`` over the group's processes, in place on every one of them."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    if _jit.tracing and _jit.current.get() is not None:
        from .traced import traced_all_reduce  # noqa: PLC0415

        # A node of the program: done when the program reaches it (an async handle is then complete).
        if traced_all_reduce(tensor, op, pg):
            return Work([], pg, "all_reduce") if async_op else None
        _untraceable(f"all_reduce(op={op.name})")
    name = _check_op(op, tensor, "all_reduce")
    array, staged = _array(tensor, "all_reduce")
    _check_calls(pg, "all_reduce", tensor, op.value)
    request = pg.communicator.allreduce(array, name)

    def finish():
        if op is ReduceOp.AVG:
            array[...] /= pg.size()
        _written(tensor, staged)

    return _finish(Work([request], pg, "all_reduce", finish), async_op)


def broadcast(tensor, src: int | None = None, group=None, async_op: bool = False, group_src: int | None = None):
    """Copy ``tensor`` from the process ``src`` (a global rank) to every process of the group."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("broadcast")
    root = group_src if group_src is not None else pg.group_rank(0 if src is None else src, "broadcast")
    array, staged = _array(tensor, "broadcast")
    _check_calls(pg, "broadcast", tensor, root=root)
    request = pg.communicator.broadcast(array, root)
    return _finish(Work([request], pg, "broadcast", lambda: _written(tensor, staged)), async_op)


def _same_shape(tensors, like, what: str) -> None:
    for t in tensors:
        if tuple(t.shape) != tuple(like.shape) or t.dtype != like.dtype:
            raise ValueError(f"{what}: every tensor must have the shape and dtype of the input "
                             f"({tuple(like.shape)}, {like.dtype}), got {tuple(t.shape)}, {t.dtype}")  # fmt: skip


def all_gather(tensor_list, tensor, group=None, async_op: bool = False):
    """Fill ``tensor_list[r]`` with rank ``r``'s ``tensor``."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("all_gather")
    if len(tensor_list) != pg.size():
        raise ValueError(f"all_gather: expected a list of {pg.size()} tensors (one per rank), got {len(tensor_list)}")
    _same_shape(tensor_list, tensor, "all_gather")
    send, _ = _array(tensor, "all_gather")
    _check_calls(pg, "all_gather", tensor)
    xp = _xp(send)
    recv = xp.empty((pg.size(), *send.shape), dtype=send.dtype)
    request = pg.communicator.allgather(send, recv)

    def finish():
        for r, t in enumerate(tensor_list):
            t._data[...] = recv[r]
            t._version[0] += 1

    return _finish(Work([request], pg, "all_gather", finish), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """Concatenate the ranks' ``input_tensor`` along dim 0 (or stack them) into ``output_tensor``."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("all_gather_into_tensor")
    n = input_tensor.numel() * pg.size()
    if output_tensor.numel() != n or output_tensor.dtype != input_tensor.dtype:
        raise ValueError(f"all_gather_into_tensor: output must hold world_size * input elements ({n} of "
                         f"{input_tensor.dtype}), got {output_tensor.numel()} of {output_tensor.dtype}")  # fmt: skip
    send, _ = _array(input_tensor, "all_gather_into_tensor")
    _check_calls(pg, "all_gather_into_tensor", input_tensor, extra=output_tensor.numel())
    recv, staged = _array(output_tensor, "all_gather_into_tensor")
    request = pg.communicator.allgather(send, recv)
    return _finish(Work([request], pg, "all_gather_into_tensor", lambda: _written(output_tensor, staged)), async_op)


def reduce_scatter_tensor(output, input, op: ReduceOp = ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce ``input`` over the ranks and give rank ``r`` the ``r``-th of its ``world_size`` equal parts."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("reduce_scatter_tensor")
    name = _check_op(op, output, "reduce_scatter_tensor")
    if input.numel() != output.numel() * pg.size() or input.dtype != output.dtype:
        raise ValueError(f"reduce_scatter_tensor: input must hold world_size * output elements "
                         f"({output.numel() * pg.size()}), got {input.numel()}")  # fmt: skip
    send, _ = _array(input, "reduce_scatter_tensor")
    _check_calls(pg, "reduce_scatter_tensor", output, op.value, extra=input.numel())
    recv, staged = _array(output, "reduce_scatter_tensor")
    request = pg.communicator.reduce_scatter(send, recv, name)

    def finish():
        if op is ReduceOp.AVG:
            recv[...] /= pg.size()
        _written(output, staged)

    return _finish(Work([request], pg, "reduce_scatter_tensor", finish), async_op)


def reduce_scatter(output, input_list, op: ReduceOp = ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce the ranks' ``input_list`` elementwise and give rank ``r`` entry ``r`` of the result."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("reduce_scatter")
    if len(input_list) != pg.size():
        raise ValueError(
            f"reduce_scatter: expected a list of {pg.size()} tensors (one per rank), got {len(input_list)}"
        )
    _same_shape(input_list, output, "reduce_scatter")
    name = _check_op(op, output, "reduce_scatter")
    _check_calls(pg, "reduce_scatter", output, op.value)
    xp = _xp(output._data)
    send = xp.stack([t._data for t in input_list])
    recv, staged = _array(output, "reduce_scatter")
    request = pg.communicator.reduce_scatter(send, recv, name)

    def finish():
        if op is ReduceOp.AVG:
            recv[...] /= pg.size()
        _written(output, staged)

    return _finish(Work([request], pg, "reduce_scatter", finish), async_op)


def reduce(tensor, dst: int | None = None, op: ReduceOp = ReduceOp.SUM, group=None, async_op: bool = False,
           group_dst: int | None = None):  # fmt: skip
    """Reduce ``tensor`` over the ranks into the process ``dst`` (others' tensors are left as they were)."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("reduce")
    root = group_dst if group_dst is not None else pg.group_rank(0 if dst is None else dst, "reduce")
    name = _check_op(op, tensor, "reduce")
    array, staged = _array(tensor, "reduce")
    _check_calls(pg, "reduce", tensor, op.value, root)
    request = pg.communicator.reduce(array, root, name)

    def finish():
        if pg.rank() == root:
            if op is ReduceOp.AVG:
                array[...] /= pg.size()
            _written(tensor, staged)

    return _finish(Work([request], pg, "reduce", finish), async_op)


def gather(tensor, gather_list=None, dst: int | None = None, group=None, async_op: bool = False):
    """Collect every rank's ``tensor`` into ``gather_list`` on the process ``dst``."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("gather")
    root = pg.group_rank(0 if dst is None else dst, "gather")
    send, _ = _array(tensor, "gather")
    recv = None
    if pg.rank() == root:
        if gather_list is None or len(gather_list) != pg.size():
            raise ValueError(f"gather: the destination needs a gather_list of {pg.size()} tensors")
        _same_shape(gather_list, tensor, "gather")
        recv = _xp(send).empty((pg.size(), *send.shape), dtype=send.dtype)
    elif gather_list:
        raise ValueError("gather: gather_list must be given only on the destination rank")
    _check_calls(pg, "gather", tensor, root=root)
    request = pg.communicator.gather(send, recv, root)

    def finish():
        if recv is not None:
            for r, t in enumerate(gather_list):
                t._data[...] = recv[r]
                t._version[0] += 1

    return _finish(Work([request], pg, "gather", finish), async_op)


def scatter(tensor, scatter_list=None, src: int | None = None, group=None, async_op: bool = False):
    """Give rank ``r`` the tensor ``scatter_list[r]`` of the process ``src``."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("scatter")
    root = pg.group_rank(0 if src is None else src, "scatter")
    send = None
    if pg.rank() == root:
        if scatter_list is None or len(scatter_list) != pg.size():
            raise ValueError(f"scatter: the source needs a scatter_list of {pg.size()} tensors")
        _same_shape(scatter_list, tensor, "scatter")
        send = _xp(tensor._data).stack([t._data for t in scatter_list])
    elif scatter_list:
        raise ValueError("scatter: scatter_list must be given only on the source rank")
    recv, staged = _array(tensor, "scatter")
    _check_calls(pg, "scatter", tensor, root=root)
    request = pg.communicator.scatter(send, recv, root)
    return _finish(Work([request], pg, "scatter", lambda: _written(tensor, staged)), async_op)


def barrier(group=None, async_op: bool = False, device_ids=None):
    """Wait until every process of the group reached this barrier."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("barrier")
    _check_calls(pg, "barrier")
    return _finish(Work([pg.communicator.barrier()], pg, "barrier"), async_op)


def isend(tensor, dst: int, group=None, tag: int = _TAG_DEFAULT):
    """Start sending ``tensor`` to the process ``dst`` (a global rank); returns a Work."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("isend")
    array, _ = _array(tensor, "isend")
    peer = pg.group_rank(dst, "isend")
    requests = [send_signature(pg, Call("send", array.dtype, tuple(tensor.shape)), peer, tag)] if pg.check_calls else []
    requests.append(pg.communicator.send(array, peer, tag))
    return Work(requests, pg, f"isend to rank {dst}")


def irecv(tensor, src: int | None = None, group=None, tag: int = _TAG_DEFAULT):
    """Start receiving into ``tensor`` from the process ``src`` (any process when None); returns a Work
    whose ``result()`` is the sender's global rank."""
    pg = pg_mod.resolve(group)
    if pg is None:
        return None
    _untraceable("irecv")
    array, staged = _array(tensor, "irecv")
    source = None if src is None else pg.group_rank(src, "irecv")
    if pg.check_calls:  # the payload is received once the sender's signature matched this tensor
        call = Call("send", array.dtype, tuple(tensor.shape))
        request = CheckedReceive(pg, call, array, source, tag)
    else:
        request = pg.communicator.recv(array, source, tag)

    def finish():
        _written(tensor, staged)
        return pg.ranks[request.source] if source is None else src

    return Work([request], pg, f"irecv from rank {'any' if src is None else src}", finish)


def send(tensor, dst: int, group=None, tag: int = _TAG_DEFAULT) -> None:
    """Send ``tensor`` to the process ``dst``; returns when the message left this process's hands."""
    isend(tensor, dst, group, tag).wait()


def recv(tensor, src: int | None = None, group=None, tag: int = _TAG_DEFAULT) -> int:
    """Receive into ``tensor`` from ``src`` (any when None); returns the sender's global rank."""
    work = irecv(tensor, src, group, tag)
    return -1 if work is None else work.result()


def _xp(array):
    import numpy as np  # noqa: PLC0415

    if isinstance(array, np.ndarray):
        return np
    import cupy  # noqa: PLC0415 - only CUDA tensors get here

    return cupy
