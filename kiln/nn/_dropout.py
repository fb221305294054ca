"""Channel ("feature") dropout and alpha dropout, as ``torch.nn.functional`` has them.

Feature dropout zeroes whole channels: one Bernoulli draw per (sample, channel), broadcast over
the spatial dims. Alpha dropout keeps SELU's mean and variance: dropped units take SELU's
negative saturation value, then an affine map restores the moments.
"""

from __future__ import annotations

import math

import kiln

__all__ = ["dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]

_SELU_SATURATION = 1.7580993408473766  # -SELU(-inf) = scale * alpha


def _check_p(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _noise(input, p: float, per_channel: bool, generator=None):
    """Bernoulli(1 - p) keep-mask: per element, or per (N, C) broadcast over the remaining dims."""
    shape = tuple(input.shape[:2]) + (1,) * (input.ndim - 2) if per_channel else tuple(input.shape)
    return kiln.bernoulli(kiln.full(shape, 1.0 - p, dtype=input.dtype, device=input.device), generator=generator)


def _apply(input, p: float, training: bool, inplace: bool, per_channel: bool, alpha: bool):
    _check_p(p)
    if not training or p == 0.0:
        return input
    if p == 1.0:
        out = input * 0.0
    else:
        keep = _noise(input, p, per_channel)
        if alpha:
            a = 1.0 / math.sqrt((_SELU_SATURATION**2 * p + 1) * (1 - p))
            shift = (keep - 1) * (_SELU_SATURATION * a) + _SELU_SATURATION * a * p
            out = input * (keep * a) + shift
        else:
            out = input * (keep * (1.0 / (1.0 - p)))
    return input.copy_(out) if inplace else out


def _feature_dropout(input, p, training, inplace, d: int, name: str, alpha: bool = False):
    """Dropout of whole channels of a (N, C, *spatial) or unbatched (C, *spatial) input with ``d`` spatial dims."""
    if input.ndim not in (d + 1, d + 2):
        raise RuntimeError(f"{name}: Expected {d + 1}D or {d + 2}D input, but received a {input.ndim}D input. "
                           f"Note that {name} exists to provide channel-wise dropout on inputs with {d} spatial "
                           "dimension(s), a channel dimension, and an optional batch dimension")  # fmt: skip
    if input.ndim == d + 1:  # unbatched: a batch of one
        out = _apply(input.unsqueeze(0), p, training, False, True, alpha).squeeze(0)
        return input.copy_(out) if inplace and out is not input else out
    return _apply(input, p, training, inplace, True, alpha)


def dropout1d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> kiln.Tensor:
    """Zero whole channels of a (N, C, L) or (C, L) input with probability ``p``; scale the rest by 1/(1-p)."""
    return _feature_dropout(input, p, training, inplace, 1, "dropout1d")


def dropout2d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> kiln.Tensor:
    """Zero whole channels of a (N, C, H, W) or (C, H, W) input with probability ``p``."""
    return _feature_dropout(input, p, training, inplace, 2, "dropout2d")


def dropout3d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> kiln.Tensor:
    """Zero whole channels of a (N, C, D, H, W) or (C, D, H, W) input with probability ``p``."""
    return _feature_dropout(input, p, training, inplace, 3, "dropout3d")


def alpha_dropout(input, p: float = 0.5, training: bool = False, inplace: bool = False) -> kiln.Tensor:
    """Dropout that keeps a SELU network's zero mean and unit variance."""
    return _apply(input, p, training, inplace, False, True)


def feature_alpha_dropout(input, p: float = 0.5, training: bool = False, inplace: bool = False) -> kiln.Tensor:
    """Alpha dropout of whole channels (dim 1) of an input with a batch dim."""
    if input.ndim < 2:
        raise RuntimeError(f"feature_alpha_dropout: expected an input with a batch and a channel dim, got "
                           f"{input.ndim}D")  # fmt: skip
    return _apply(input, p, training, inplace, True, True)
