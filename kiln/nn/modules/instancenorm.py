"""Instance normalization layers: ``InstanceNorm1d/2d/3d`` (PyTorch's defaults: no affine, no running stats)."""

from __future__ import annotations

import warnings

import kiln

from .. import functional as F
from .module import Module
from .normalization import _add_affine

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]


class _InstanceNorm(Module):
    _spatial = 0

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                 track_running_stats: bool = False, device=None, dtype=None, *, bias: bool = True) -> None:  # fmt: skip
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

    def forward(self, input):
        d = self._spatial
        if input.dim() not in (d + 1, d + 2):
            raise ValueError(f"expected {d + 1}D or {d + 2}D input (got {input.dim()}D input)")
        batched = input.dim() == d + 2
        channels = input.shape[1 if batched else 0]
        if channels != self.num_features:
            if self.affine:
                raise ValueError(f"expected input's size at dim={1 if batched else 0} to match num_features "
                                 f"({self.num_features}), but got: {channels}.")  # fmt: skip
            warnings.warn(f"input's size at dim={1 if batched else 0} does not match num_features. You can silence "
                          "this warning by not passing in num_features, which is not used because affine=False",
                          stacklevel=2)  # fmt: skip
        x = input if batched else input.unsqueeze(0)
        out = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                              self.training or not self.track_running_stats,
                              0.0 if self.momentum is None else self.momentum, self.eps)  # fmt: skip
        return out if batched else out.squeeze(0)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")  # fmt: skip


class InstanceNorm1d(_InstanceNorm):
    """Instance norm over (N, C, L) or unbatched (C, L) input."""

    _spatial = 1


class InstanceNorm2d(_InstanceNorm):
    """Instance norm over (N, C, H, W) or unbatched (C, H, W) input."""

    _spatial = 2


class InstanceNorm3d(_InstanceNorm):
    """Instance norm over (N, C, D, H, W) or unbatched (C, D, H, W) input."""

    _spatial = 3
