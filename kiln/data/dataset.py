"""Datasets: anything with ``__getitem__`` and ``__len__`` (map-style) or ``__iter__`` (iterable)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from ..frontend.ops.random import randperm
from ..frontend.tensor import Tensor

__all__ = ["ConcatDataset", "Dataset", "IterableDataset", "Subset", "TensorDataset", "random_split"]


class Dataset:
    """A map-style dataset: subclasses define ``__getitem__`` (and usually ``__len__``)."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples: subclasses define ``__iter__``. With workers, each worker iterates its own
    copy; use ``kiln.data.get_worker_info()`` to split the stream between them."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")

    def __add__(self, other):
        raise TypeError("IterableDataset does not support +; chain the iterables instead")


class TensorDataset(Dataset):
    """Samples are the ``index``-th rows of tensors sharing their first dimension."""

    def __init__(self, *tensors: Tensor) -> None:
        if not tensors:
            raise ValueError("TensorDataset expected at least one tensor")
        sizes = [t.shape[0] if t.ndim else None for t in tensors]
        if None in sizes or len(set(sizes)) != 1:
            raise ValueError(f"Size mismatch between tensors: first dimensions are {sizes}")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """Map-style datasets one after another."""

    def __init__(self, datasets) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = []
        total = 0
        for d in self.datasets:
            total += len(d)
            self.cumulative_sizes.append(total)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx += len(self)
        which = bisect.bisect_right(self.cumulative_sizes, idx)
        if which == len(self.datasets):
            raise IndexError(f"index {idx} is out of range for a ConcatDataset of length {len(self)}")
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][idx - start]


def _split_lengths(lengths: Sequence[int | float], n: int) -> list[int]:
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1 and not all(isinstance(x, int) for x in lengths):
        for frac in lengths:
            if not 0 <= frac <= 1:
                raise ValueError(f"Fraction at index {lengths.index(frac)} is not between 0 and 1")
        counts = [int(math.floor(n * frac)) for frac in lengths]
        for i in range(n - sum(counts)):  # the remainder goes round-robin, as in PyTorch
            counts[i % len(counts)] += 1
        return counts
    if sum(lengths) != n:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    return [int(x) for x in lengths]


def random_split(dataset: Dataset, lengths: Sequence[int | float], generator=None) -> list[Subset]:
    """Split into non-overlapping random subsets of the given lengths (or fractions summing to 1)."""
    counts = _split_lengths(list(lengths), len(dataset))  # type: ignore[arg-type]  # map-style: has __len__
    order = randperm(sum(counts), generator=generator).tolist()
    out, start = [], 0
    for count in counts:
        out.append(Subset(dataset, order[start : start + count]))
        start += count
    return out
