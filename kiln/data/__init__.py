"""``kiln.data``: datasets, samplers and the DataLoader, with PyTorch's names (``torch.utils.data``)."""

from ._worker import WorkerInfo, get_worker_info
from .collate import default_collate, default_convert
from .dataloader import DataLoader
from .dataset import ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split
from .sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "BatchSampler",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "WorkerInfo",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
]
