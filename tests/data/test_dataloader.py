"""DataLoader: batching, shuffling, and worker processes returning batches through shared memory."""

import os

import numpy as np
import pytest

import kiln
from kiln.data import DataLoader, Dataset, IterableDataset, TensorDataset, get_worker_info


def _segments():
    return {f for f in os.listdir("/dev/shm") if f.startswith("kiln_")}


class Squares(Dataset):
    def __len__(self):
        return 13

    def __getitem__(self, i):
        return {"x": kiln.full((3,), float(i)), "y": i * i, "seed": get_worker_info().seed if get_worker_info() else -1}


class Failing(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError("bad index five")
        return i


class Dying(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 6:
            os._exit(3)
        return i


class Stream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, 10, step))

    def __len__(self):
        return 10


def _init(worker_id):
    np.random.seed(get_worker_info().seed % 2**32)


def test_batches_shuffle_drop_last():
    ds = TensorDataset(kiln.arange(10.0))
    assert [b[0].tolist() for b in DataLoader(ds, batch_size=4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(DataLoader(ds, batch_size=4, drop_last=True)) == 2
    seen = [v for (b,) in DataLoader(ds, batch_size=3, shuffle=True) for v in b.tolist()]
    assert sorted(seen) == list(range(10))
    unbatched = list(DataLoader(ds, batch_size=None))
    assert len(unbatched) == 10 and unbatched[2][0].item() == 2.0
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(ds, sampler=range(10), shuffle=True)
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        DataLoader(ds, num_workers=-1)


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_workers_match_single_process_and_leave_no_segments(context):
    before = _segments()
    g = kiln.Generator()
    g.manual_seed(5)
    expected = list(DataLoader(Squares(), batch_size=3, shuffle=True, generator=g))
    g.manual_seed(5)
    loader = DataLoader(Squares(), batch_size=3, shuffle=True, generator=g, num_workers=2,
                        multiprocessing_context=context, worker_init_fn=_init, prefetch_factor=3)  # fmt: skip
    got = list(loader)
    assert len(got) == len(expected) == 5
    for a, b in zip(got, expected, strict=True):
        assert a["x"].tolist() == b["x"].tolist() and a["y"].tolist() == b["y"].tolist()
    seeds = {s for batch in got for s in batch["seed"].tolist()}
    assert len(seeds) == 2 and max(seeds) - min(seeds) == 1  # base_seed + worker_id
    assert _segments() == before


def test_abandoned_iterator_is_cleaned_up():
    before = _segments()
    it = iter(DataLoader(Squares(), batch_size=1, num_workers=2, prefetch_factor=4))
    first = next(it)
    assert first["y"].tolist() == [0]
    workers = it.workers
    del it  # prefetched batches are waiting in shared memory: they must go with the iterator
    assert not any(w.is_alive() for w in workers)
    assert _segments() == before


def test_worker_exception_reraised_with_traceback():
    with pytest.raises(KeyError, match=r"(?s)Caught KeyError in DataLoader worker process 1.*bad index five"):
        list(DataLoader(Failing(), batch_size=1, num_workers=2))


def test_dead_worker_reported_not_hung():
    # batch [6, 7] is the 4th: round-robin gives it to worker 1
    with pytest.raises(RuntimeError, match=r"DataLoader worker 1 \(pid \d+\) exited unexpectedly with exit code 3"):
        list(DataLoader(Dying(), batch_size=2, num_workers=2))


def test_iterable_dataset_with_workers():
    single = sorted(v for b in DataLoader(Stream(), batch_size=3) for v in b.tolist())
    multi = [b.tolist() for b in DataLoader(Stream(), batch_size=3, num_workers=2)]
    assert single == list(range(10))
    assert multi == [[0, 2, 4], [1, 3, 5], [6, 8], [7, 9]]  # round-robin, each worker's own shard
    dropped = [b.tolist() for b in DataLoader(Stream(), batch_size=3, num_workers=2, drop_last=True)]
    assert dropped == [[0, 2, 4], [1, 3, 5]]


def test_persistent_workers_reused_across_epochs():
    loader = DataLoader(Stream(), batch_size=4, num_workers=2, persistent_workers=True)
    first = [b.tolist() for b in loader]
    pids = [w.pid for w in loader._iterator.workers]
    second = [b.tolist() for b in loader]
    assert first == second == [[0, 2, 4, 6], [1, 3, 5, 7], [8], [9]]
    assert [w.pid for w in loader._iterator.workers] == pids
    loader._iterator._shutdown()
