"""Samplers: iterables of dataset indices (or, for BatchSampler, of lists of indices)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from ..frontend.ops.creation import as_tensor
from ..frontend.ops.generator import Generator
from ..frontend.ops.random import multinomial, randint, randperm
from ..ir import dtypes as dt

__all__ = [
    "BatchSampler",
    "DistributedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]


class Sampler:
    """Base class: subclasses define ``__iter__`` (and ``__len__`` where the length is known)."""

    def __init__(self, data_source=None) -> None:
        pass

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


def _fresh_generator(generator: Generator | None) -> Generator:
    """The given generator, or (as PyTorch) a new one seeded by a draw from the default generator."""
    if generator is not None:
        return generator
    seed = int(randint(0, 2**62, (), dtype=dt.int64).item())
    return Generator().manual_seed(seed)


class RandomSampler(Sampler):
    """A random permutation of the indices, or ``num_samples`` draws with replacement."""

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None, generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        gen = _fresh_generator(self.generator)
        if self.replacement:
            for start in range(0, self.num_samples, 32):
                yield from randint(0, n, (min(32, self.num_samples - start),), generator=gen).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from randperm(n, generator=gen).tolist()
        yield from randperm(n, generator=gen).tolist()[: self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order."""

    def __init__(self, indices: Sequence[int], generator=None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        for i in randperm(len(self.indices), generator=self.generator).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """``num_samples`` indices drawn with probabilities proportional to ``weights``."""

    def __init__(self, weights, num_samples: int, replacement: bool = True, generator=None) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got replacement={replacement}")
        weights = as_tensor(weights, dtype=dt.float64)
        if weights.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape {tuple(weights.shape)}")
        self.weights = weights
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        drawn = multinomial(self.weights, self.num_samples, self.replacement, generator=self.generator)
        yield from drawn.tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Group another sampler's indices into lists of ``batch_size``."""

    def __init__(self, sampler: Sampler | Iterable[int], batch_size: int, drop_last: bool) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]  # batches, as PyTorch's BatchSampler
        batch = []
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]  # TypeError for a sampler without one, as in PyTorch
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class DistributedSampler(Sampler):
    """Each of ``num_replicas`` processes gets its own ``len(dataset) / num_replicas`` indices.

    The indices (shuffled by a generator seeded with ``seed + epoch``: call ``set_epoch`` at the
    start of each epoch, and give every process the same ``seed``) are padded by repeating the
    first ones until every process gets equally many (or, with ``drop_last``, trimmed), and
    process ``rank`` takes every ``num_replicas``-th from position ``rank``, as in PyTorch. The
    shuffled order is kiln's ``randperm`` (Philox), so it differs from PyTorch's for the same seed;
    without shuffling the indices are PyTorch's exactly.

    >>> [list(DistributedSampler(range(5), num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)]
    [[0, 2, 4], [1, 3, 0]]
    """

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:  # fmt: skip
        if num_replicas is None or rank is None:
            import kiln.distributed as dist  # noqa: PLC0415 - only samplers that ask the process group need it

            if not dist.is_initialized():
                raise RuntimeError("DistributedSampler: give num_replicas and rank, or call "
                                   "kiln.distributed.init_process_group first")  # fmt: skip
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"DistributedSampler: num_replicas must be at least 1, got {num_replicas}")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.seed = seed
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = -(-(n - num_replicas) // num_replicas)  # drop the tail so all get equally many
        else:
            self.num_samples = -(-n // num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            indices = randperm(n, generator=Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            indices = list(range(n))
        if self.drop_last:
            indices = indices[: self.total_size]
        elif self.total_size > n:
            repeats = -(-(self.total_size - n) // n)
            indices += (indices * repeats)[: self.total_size - n]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (every process must call it with the same number)."""
        self.epoch = epoch
