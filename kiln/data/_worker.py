"""The DataLoader's worker process: fetch and collate batches, return them through shared memory.

A batch travels as its structure with every tensor replaced by ``_Shm(offset, shape, dtype, requires_grad)``
and the name of one segment holding all the tensors' bytes; the main process maps it and unlinks it.
"""

from __future__ import annotations

import queue
import random
import traceback
from dataclasses import dataclass

import numpy as np

from .. import multiprocessing as kmp
from ..frontend.ops.creation import from_numpy
from ..frontend.ops.generator import manual_seed
from ..frontend.tensor import Tensor
from ..ir import dtypes as dt

_ALIGN = 64
_POLL_S = 0.2


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker process."""

    id: int
    num_workers: int
    seed: int
    dataset: object


_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """The current worker's id, count, seed and dataset copy; None in the main process."""
    return _info


class StopMarker:
    """An iterable-dataset worker has no more batches."""


class WorkerError:
    """An exception raised in a worker, carried to the main process as its type name and traceback text."""

    def __init__(self, worker_id: int, exc: BaseException) -> None:
        self.exc_type = type(exc)
        self.text = "".join(traceback.format_exception(exc))
        self.worker_id = worker_id

    def reraise(self):
        msg = f"Caught {self.exc_type.__name__} in DataLoader worker process {self.worker_id}.\n"
        msg += f"Original Traceback (most recent call last):\n{self.text}"
        try:
            err = self.exc_type(msg)
        except Exception:
            err = RuntimeError(msg)
        raise err


@dataclass(frozen=True)
class _Shm:
    offset: int
    shape: tuple
    dtype: str
    requires_grad: bool


def _tensors(obj, out: list) -> None:
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _tensors(v, out)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors(v, out)


def _replace(obj, fn):
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, _Shm):
        return fn(obj)
    if isinstance(obj, list):
        return [_replace(v, fn) for v in obj]
    if isinstance(obj, tuple):
        items = [_replace(v, fn) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, dict):
        out = {k: _replace(v, fn) for k, v in obj.items()}
        return out if type(obj) is dict else type(obj)(out)
    return obj


def pack(batch):
    """(segment name or None, structure): every tensor's bytes copied into one new segment."""
    tensors: list[Tensor] = []
    _tensors(batch, tensors)
    if not tensors:
        return None, batch
    offsets, total = {}, 0
    for t in tensors:
        if id(t) not in offsets:
            offsets[id(t)] = total
            total += -(-t._data.nbytes // _ALIGN) * _ALIGN
    name, base = kmp.create_segment(total, own=False)
    for t in tensors:
        data = np.asarray(t._host())
        start = offsets[id(t)]
        base[start : start + data.nbytes].view(data.dtype).reshape(data.shape)[...] = data
    del base  # the name stays until the main process unlinks it; our mapping can go
    return name, _replace(batch, lambda t: _Shm(offsets[id(t)], tuple(t.shape), t.dtype.name, t.requires_grad))


def unpack(name: str | None, structure):
    """Map a packed batch's segment, unlink its name, and wrap its tensors (no copy)."""
    if name is None:
        return structure
    base = kmp.attach_segment(name)
    kmp.unlink(name)
    kmp._segments.pop(name, None)  # unlinked: another process could not map it, so pickle these as copies

    def build(s: _Shm) -> Tensor:
        kind = dt.BY_NAME[s.dtype]
        nbytes = int(np.prod(s.shape, dtype=np.int64)) * kind.itemsize
        array = base[s.offset : s.offset + nbytes].view(kind.np).reshape(s.shape)
        return from_numpy(array).requires_grad_(s.requires_grad)

    return _replace(structure, build)


class _Fetcher:
    def __init__(self, dataset, iterable: bool, auto_collation: bool, collate_fn, drop_last: bool) -> None:
        self.dataset, self.iterable, self.auto = dataset, iterable, auto_collation
        self.collate_fn, self.drop_last = collate_fn, drop_last
        self.reset()

    def reset(self) -> None:
        self.iterator = iter(self.dataset) if self.iterable else None
        self.ended = False

    def fetch(self, indices):
        """A batch for map-style ``indices``; for an iterable dataset (``indices`` = batch size or None)
        the next batch of its stream; raises StopIteration at its end."""
        if not self.iterable:
            data = [self.dataset[i] for i in indices] if self.auto else self.dataset[indices]
            return self.collate_fn(data)
        if self.ended:
            raise StopIteration
        if not self.auto:
            return self.collate_fn(next(self.iterator))
        data = []
        for _ in range(indices):
            try:
                data.append(next(self.iterator))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.ended and self.drop_last):
            raise StopIteration
        return self.collate_fn(data)


def worker_loop(worker_id, num_workers, seed, dataset, iterable, auto, collate_fn, drop_last, init_fn, tasks, results):
    """The worker's main: ``tasks`` brings (epoch, idx, indices), 'reset' or None (stop)."""
    global _info
    import multiprocessing  # noqa: PLC0415

    parent = multiprocessing.parent_process()
    _info = WorkerInfo(worker_id, num_workers, seed, dataset)
    manual_seed(seed)
    random.seed(seed)
    try:
        if init_fn is not None:
            init_fn(worker_id)
        fetcher = _Fetcher(dataset, iterable, auto, collate_fn, drop_last)
    except Exception as e:
        results.put((None, None, WorkerError(worker_id, e)))
        return
    while True:
        try:
            task = tasks.get(timeout=_POLL_S)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return
            continue
        if task is None:
            return
        if task == "reset":
            fetcher.reset()
            continue
        epoch, idx, indices = task
        try:
            reply = pack(fetcher.fetch(indices))
        except StopIteration:
            reply = StopMarker()
        except Exception as e:
            reply = WorkerError(worker_id, e)
        results.put((epoch, idx, reply))
