"""Normalisation layers: ``BatchNorm1d``/``BatchNorm2d`` (running statistics), ``LayerNorm``, ``GroupNorm``."""

from __future__ import annotations

import kiln

from .. import functional as F
from .. import init
from .._batch_norm import count_batch
from ..parameter import Parameter
from .module import Module

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LayerNorm", "GroupNorm", "RMSNorm",
           "LocalResponseNorm"]  # fmt: skip


def _add_affine(module, affine: bool, bias: bool, shape: tuple, device, dtype) -> None:
    """Register the learnable scale (ones) and shift (zeros) of a norm layer, or ``None`` for each."""
    weight = Parameter(kiln.ones(*shape, device=device, dtype=dtype)) if affine else None
    shift = Parameter(kiln.zeros(*shape, device=device, dtype=dtype)) if affine and bias else None
    module.register_parameter("weight", weight)
    module.register_parameter("bias", shift)


class _BatchNorm(Module):
    _dims: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *, bias: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _add_affine(self, affine, bias, (num_features,), device, dtype)
        if track_running_stats:
            self.register_buffer("running_mean", kiln.zeros(num_features, device=device, dtype=dtype))
            self.register_buffer("running_var", kiln.ones(num_features, device=device, dtype=dtype))
            self.register_buffer("num_batches_tracked", kiln.tensor(0, dtype=kiln.int64, device=device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            with kiln.no_grad():
                self.running_mean.zero_()
                self.running_var.fill_(1.0)
                self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def _check_input_dim(self, input) -> None:
        if input.dim() not in self._dims:
            expected = " or ".join(f"{d}D" for d in self._dims)
            raise ValueError(f"expected {expected} input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            count_batch(self.num_batches_tracked)
            if self.momentum is None:  # a cumulative moving average: weight 1/n for the n-th batch,
                # read from the counter as a tensor, so a compiled step reads it on every call
                factor = 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
        use_batch_stats = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return F.batch_norm(
            input,
            self.running_mean if track else None,
            self.running_var if track else None,
            self.weight,
            self.bias,
            use_batch_stats,
            factor,
            self.eps,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) input."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W) input."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    _dims = (4,)


class BatchNorm3d(_BatchNorm):
    """Batch norm over (N, C, D, H, W) input."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    _dims = (5,)


class SyncBatchNorm(_BatchNorm):
    """Batch norm whose statistics PyTorch reduces across processes; in one process it is plain batch norm.

    ``convert_sync_batchnorm`` swaps the batch-norm layers of a model for this class (keeping their state).
    """

    _dims = (2, 3, 4, 5)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None, device=None, dtype=None) -> None:  # fmt: skip
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.process_group = process_group

    def forward(self, input):
        distributed = getattr(kiln, "distributed", None)
        initialized = getattr(distributed, "is_initialized", None)
        if self.training and initialized is not None and initialized() and distributed.get_world_size() > 1:
            raise NotImplementedError("SyncBatchNorm across processes is not supported by kiln; its statistics would "
                                      "be per process. Use BatchNorm, or one process.")  # fmt: skip
        return super().forward(input)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """``module`` with every BatchNorm*d replaced by a SyncBatchNorm holding the same parameters and buffers."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group)  # fmt: skip
            if module.affine:
                converted.weight, converted.bias = module.weight, module.bias
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                setattr(converted, name, getattr(module, name))
            converted.train(module.training)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return converted


class LocalResponseNorm(Module):
    """Local response normalization over neighbouring channels (``F.local_response_norm``)."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, input):
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dims, with elementwise ``weight`` and ``bias``."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None) -> None:  # fmt: skip
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        _add_affine(self, elementwise_affine, bias, self.normalized_shape, device, dtype)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


class GroupNorm(Module):
    """Normalise each of ``num_groups`` groups of channels, with per-channel ``weight`` and ``bias``."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
                 dtype=None, *, bias: bool = True) -> None:  # fmt: skip
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        _add_affine(self, affine, bias, (num_channels,), device, dtype)

    def forward(self, input):
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"bias={self.bias is not None}"
        )


class RMSNorm(Module):
    """Root-mean-square norm over the trailing ``normalized_shape`` dims, with an elementwise ``weight``."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        weight = (
            Parameter(kiln.ones(*self.normalized_shape, device=device, dtype=dtype)) if elementwise_affine else None
        )
        self.register_parameter("weight", weight)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, input):
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
