"""Datasets, samplers and default_collate."""

from collections import OrderedDict, namedtuple

import numpy as np
import pytest

import kiln
from kiln.data import (
    BatchSampler,
    ConcatDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    random_split,
)

Point = namedtuple("Point", "x y")


def test_tensor_dataset_subset_concat():
    ds = TensorDataset(kiln.arange(5.0), kiln.arange(5) * 10)
    assert len(ds) == 5 and [v.item() for v in ds[3]] == [3.0, 30]
    sub = Subset(ds, [4, 0])
    assert len(sub) == 2 and sub[0][1].item() == 40
    cat = ConcatDataset([ds, sub])
    assert len(cat) == 7 and cat[5][1].item() == 40 and cat[-1][1].item() == 0
    with pytest.raises(IndexError, match="out of range"):
        cat[7]
    with pytest.raises(ValueError, match="Size mismatch"):
        TensorDataset(kiln.zeros(3), kiln.zeros(4))


def test_random_split_lengths_fractions_and_generator():
    a, b = random_split(range(10), [7, 3], generator=kiln.Generator().manual_seed(1))
    assert sorted(list(a.indices) + list(b.indices)) == list(range(10)) and len(a) == 7
    c, d = random_split(range(10), [7, 3], generator=kiln.Generator().manual_seed(1))
    assert c.indices == a.indices
    parts = random_split(range(10), [0.5, 0.3, 0.2])
    assert [len(p) for p in parts] == [5, 3, 2]
    assert [len(p) for p in random_split(range(5), [0.5, 0.5])] == [3, 2]  # the remainder goes first
    with pytest.raises(ValueError, match="Sum of input lengths"):
        random_split(range(10), [3, 3])


def test_samplers():
    assert list(SequentialSampler(range(4))) == [0, 1, 2, 3]
    perm = list(RandomSampler(range(20), generator=kiln.Generator().manual_seed(3)))
    assert sorted(perm) == list(range(20)) and perm != list(range(20))
    again = list(RandomSampler(range(20), generator=kiln.Generator().manual_seed(3)))
    assert perm == again
    drawn = list(RandomSampler(range(3), replacement=True, num_samples=50))
    assert len(drawn) == 50 and set(drawn) <= {0, 1, 2}
    assert len(list(RandomSampler(range(4), num_samples=10))) == 10
    with pytest.raises(ValueError, match="num_samples should be a positive integer"):
        RandomSampler(range(3), num_samples=0)
    assert sorted(SubsetRandomSampler([5, 7, 9])) == [5, 7, 9]
    weighted = list(WeightedRandomSampler([0.0, 1.0, 0.0], 6))
    assert weighted == [1] * 6
    assert sorted(WeightedRandomSampler([1.0, 1.0, 1.0], 3, replacement=False)) == [0, 1, 2]
    assert list(BatchSampler(range(5), 2, drop_last=False)) == [[0, 1], [2, 3], [4]]
    assert list(BatchSampler(range(5), 2, drop_last=True)) == [[0, 1], [2, 3]]
    assert len(BatchSampler(range(5), 2, False)) == 3 and len(BatchSampler(range(5), 2, True)) == 2
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        BatchSampler(range(5), 0, False)


def test_default_collate_kinds():
    batch = default_collate([
        {"x": kiln.ones(2), "n": 1, "f": 0.5, "s": "a", "a": np.zeros(2, np.float32), "p": Point(1, 2.0)},
        {"x": kiln.zeros(2), "n": 2, "f": 1.5, "s": "b", "a": np.ones(2, np.float32), "p": Point(3, 4.0)},
    ])  # fmt: skip
    assert batch["x"].shape == (2, 2) and batch["x"].tolist() == [[1, 1], [0, 0]]
    assert batch["n"].dtype == kiln.int64 and batch["n"].tolist() == [1, 2]
    assert batch["f"].dtype == kiln.float64 and batch["f"].tolist() == [0.5, 1.5]
    assert batch["s"] == ["a", "b"]
    assert batch["a"].dtype == kiln.float32 and batch["a"].tolist() == [[0, 0], [1, 1]]
    assert isinstance(batch["p"], Point) and batch["p"].x.tolist() == [1, 3]
    od = default_collate([OrderedDict(a=1), OrderedDict(a=2)])
    assert type(od) is OrderedDict and od["a"].tolist() == [1, 2]
    pairs = default_collate([(1, True), (2, False)])
    assert isinstance(pairs, list) and pairs[1].dtype == kiln.bool
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [1]])
    with pytest.raises(TypeError, match="found <class 'object'>"):
        default_collate([object(), object()])
