"""``torch.nn.modules.batchnorm``'s path: the batch-norm layers (defined in normalization.py)."""

from .normalization import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm, _BatchNorm

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "_BatchNorm"]
