"""``DataLoader``: batches from a dataset, in the main process or in worker processes.

With ``num_workers > 0`` the main process draws every index batch from the sampler (so the order is the
one ``num_workers=0`` gives), hands them round-robin to the workers, and yields results in that order.
Workers return tensors through shared memory (see ``_worker``). Waiting polls with a short timeout and
checks the workers are alive: a dead worker becomes a RuntimeError, never a hang.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import queue
import time

from .. import multiprocessing as kmp
from ..frontend.ops.random import randint
from ..ir import dtypes as dt
from . import _worker
from .collate import default_collate, default_convert
from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["DataLoader"]

_POLL_S = 0.1


class _InfiniteConstant:
    """The 'sampler' of an iterable dataset: each task asks a worker for its next batch."""

    def __init__(self, value) -> None:
        self.value = value

    def __iter__(self):
        while True:
            yield self.value


class DataLoader:
    """Iterate over a dataset in batches, as ``torch.utils.data.DataLoader``."""

    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool | None = None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn=None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor: int | None = None, persistent_workers: bool = False):  # fmt: skip
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing. "
                             "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.")  # fmt: skip
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle not in (None, False):
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle={shuffle}"
                )  # noqa: E501
            if sampler is not None or batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified sampler/batch_sampler option")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
                )  # noqa: E501
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is None and not self._iterable:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size, self.drop_last, self.sampler, self.batch_sampler = (
            batch_size,
            drop_last,
            sampler,
            batch_sampler,
        )
        self.num_workers, self.pin_memory, self.timeout = num_workers, pin_memory, timeout
        self.worker_init_fn, self.generator = worker_init_fn, generator
        self.prefetch_factor = 2 if num_workers and prefetch_factor is None else prefetch_factor
        self.persistent_workers = persistent_workers
        self._auto = batch_size is not None or batch_sampler is not None
        self.collate_fn = collate_fn or (default_collate if self._auto else default_convert)
        if isinstance(multiprocessing_context, str):
            multiprocessing_context = multiprocessing.get_context(multiprocessing_context)
        self.multiprocessing_context = multiprocessing_context
        self._iterator = None

    @property
    def _index_sampler(self):
        if self._iterable:
            return _InfiniteConstant(self.batch_size)
        return self.batch_sampler if self._auto else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self._index_sampler)

    def __iter__(self):
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        if self.persistent_workers:
            if self._iterator is None or self._iterator.closed:
                self._iterator = _MultiProcessIter(self)
            else:
                self._iterator.reset()
            return self._iterator
        return _MultiProcessIter(self)


def _base_seed(loader: DataLoader) -> int:
    return int(randint(0, 2**62, (), dtype=dt.int64, generator=loader.generator).item())


class _SingleProcessIter:
    def __init__(self, loader: DataLoader) -> None:
        self._seed = _base_seed(loader)  # drawn as with workers, so both consume the generator alike
        self._fetcher = _worker._Fetcher(loader.dataset, loader._iterable, loader._auto, loader.collate_fn,
                                         loader.drop_last)  # fmt: skip
        self._indices = iter(loader._index_sampler)

    def __iter__(self):
        return self

    def __next__(self):
        return self._fetcher.fetch(next(self._indices))


class _MultiProcessIter:
    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        ctx = loader.multiprocessing_context or multiprocessing.get_context()
        seed = _base_seed(loader)
        self.results = ctx.Queue()
        self.tasks, self.workers = [], []
        for wid in range(loader.num_workers):
            tasks = ctx.Queue()
            args = (wid, loader.num_workers, seed + wid, loader.dataset, loader._iterable, loader._auto,
                    loader.collate_fn, loader.drop_last, loader.worker_init_fn, tasks, self.results)  # fmt: skip
            w = ctx.Process(target=_worker.worker_loop, args=args, daemon=True)
            w.start()
            self.tasks.append(tasks)
            self.workers.append(w)
        self.closed = False
        self.epoch = -1
        self.reset(first=True)

    def reset(self, first: bool = False) -> None:
        """Start an epoch: a fresh index stream; results of an unfinished earlier epoch are discarded."""
        self.epoch += 1
        self.indices = iter(self.loader._index_sampler)
        self.send_idx = self.recv_idx = 0
        self.pending: dict[int, int] = {}  # task idx -> worker id
        self.ready: dict[int, object] = {}
        self.active = [True] * len(self.workers)
        self.next_worker = 0
        if not first and self.loader._iterable:
            for q in self.tasks:
                q.put("reset")
        for _ in range(self.loader.prefetch_factor * len(self.workers)):  # type: ignore[operator]  # set with workers
            self._dispatch()

    def _dispatch(self) -> None:
        n = len(self.workers)
        for _ in range(n):
            wid = self.next_worker
            self.next_worker = (wid + 1) % n
            if self.active[wid]:
                break
        else:
            return
        try:
            indices = next(self.indices)
        except StopIteration:
            return
        self.tasks[wid].put((self.epoch, self.send_idx, indices))
        self.pending[self.send_idx] = wid
        self.send_idx += 1

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self.closed:
                raise StopIteration
            if self.recv_idx in self.ready:
                reply = self.ready.pop(self.recv_idx)
                self.pending.pop(self.recv_idx)
                self.recv_idx += 1
                if isinstance(reply, _worker.StopMarker):
                    continue
                self._dispatch()
                if isinstance(reply, _worker.WorkerError):
                    self._shutdown()
                    reply.reraise()
                return _worker.unpack(*reply)
            if not self.pending:
                if not self.loader.persistent_workers:
                    self._shutdown()
                raise StopIteration
            self._receive()

    def _receive(self) -> None:
        deadline = time.monotonic() + self.loader.timeout if self.loader.timeout else None
        while True:
            try:
                epoch, idx, reply = self.results.get(timeout=_POLL_S)
                break
            except queue.Empty:
                self._check_workers()
                if deadline is not None and time.monotonic() > deadline:
                    self._shutdown()
                    raise RuntimeError(f"DataLoader timed out after {self.loader.timeout} seconds") from None
        if epoch is None:  # a worker failed before its loop (worker_init_fn)
            self._shutdown()
            reply.reraise()
        if epoch != self.epoch:  # a result of an abandoned epoch
            if isinstance(reply, tuple) and reply[0] is not None:
                kmp.unlink(reply[0])
            return
        if isinstance(reply, _worker.StopMarker):
            self.active[self.pending[idx]] = False
        self.ready[idx] = reply

    def _check_workers(self) -> None:
        for wid, w in enumerate(self.workers):
            if not w.is_alive():
                code = w.exitcode
                self._shutdown()
                raise RuntimeError(f"DataLoader worker {wid} (pid {w.pid}) exited unexpectedly with exit code {code}")

    def _shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        for q in self.tasks:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for w in self.workers:
            w.join(timeout=2)
            if w.is_alive():
                w.terminate()
                w.join(timeout=2)
        for q in [*self.tasks, self.results]:
            q.cancel_join_thread()
            q.close()
        for w in self.workers:  # batches never received (prefetched, or a worker killed mid-way)
            for path in glob.glob(os.path.join(kmp.SHM_DIR, kmp.segment_prefix(w.pid) + "*")):
                kmp.unlink(os.path.basename(path))

    def __del__(self) -> None:
        try:
            self._shutdown()
        except Exception:  # noqa: S110 - interpreter shutdown: nothing left to report to
            pass
