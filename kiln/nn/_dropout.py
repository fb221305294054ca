"""Channel ("feature") dropout and alpha dropout, as ``torch.nn.functional`` has them.

Feature dropout zeroes whole channels: one Bernoulli draw per (sample, channel), broadcast over
the spatial dims. Alpha dropout keeps SELU's mean and variance: dropped units take SELU's
negative saturation value, then an affine map restores the moments.
"""

from __future__ import annotations

import math
import warnings

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


def dropout1d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> kiln.Tensor:
    """Zero whole channels of a (N, C, L) or (C, L) input with probability ``p``; scale the rest by 1/(1-p)."""
    if input.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D input. Note that "
                           "dropout1d exists to provide channel-wise dropout on inputs with 1 spatial dimension(s), "
                           "a channel dimension, and an optional batch dimension")  # fmt: skip
    if input.ndim == 3:
        return _channels_dropout(input, p, training, inplace, "dropout1d")
    return _unbatched(input, p, training, inplace, "dropout1d")


def dropout2d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> kiln.Tensor:
    """Zero whole channels of a (N, C, H, W) input with probability ``p``, as PyTorch does: a 3-D input
    is taken as (N, C, L) (PyTorch's historical reading, with its warning), and any other rank warns
    and drops per (dim 0, dim 1) entry -- elementwise for a 2-D input."""
    if input.ndim not in (3, 4):
        warnings.warn(f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is deprecated in PyTorch; "
                      "use dropout instead (dropout2d is channel-wise dropout of 3D or 4D inputs)", stacklevel=2)  # fmt: skip
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout "
                      "behavior is desired - input is interpreted as shape (N, C, L), as PyTorch does; use "
                      "dropout1d to say so", stacklevel=2)  # fmt: skip
    return _channels_dropout(input, p, training, inplace, "dropout2d")


def dropout3d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> kiln.Tensor:
    """Zero whole channels of a (N, C, D, H, W) or (C, D, H, W) input with probability ``p``; another
    rank warns and is read as unbatched, as PyTorch does."""
    if input.ndim not in (4, 5):
        warnings.warn(f"dropout3d: Received a {input.ndim}-D input to dropout3d, which is deprecated in PyTorch; "
                      "use dropout instead (dropout3d is channel-wise dropout of 4D or 5D inputs)", stacklevel=2)  # fmt: skip
    if input.ndim == 5:
        return _channels_dropout(input, p, training, inplace, "dropout3d")
    return _unbatched(input, p, training, inplace, "dropout3d")


def _unbatched(input, p: float, training: bool, inplace: bool, name: str) -> kiln.Tensor:
    """Channel dropout of an input without its batch dim, as a batch of one."""
    out = _channels_dropout(input.unsqueeze(0), p, training, False, name).squeeze(0)
    return input.copy_(out) if inplace and out is not input else out


def _channels_dropout(input, p: float, training: bool, inplace: bool, name: str) -> kiln.Tensor:
    """Dropout per (dim 0, dim 1) entry, broadcast over the rest (PyTorch's ``feature_dropout``)."""
    if input.ndim < 2:
        raise RuntimeError(f"{name}: feature dropout requires at least 2 dimensions in the input, got {input.ndim}")
    return _apply(input, p, training, inplace, True, False)


def alpha_dropout(input, p: float = 0.5, training: bool = False, inplace: bool = False) -> kiln.Tensor:
    """Dropout that keeps a SELU network's zero mean and unit variance."""
    return _apply(input, p, training, inplace, False, True)


def feature_alpha_dropout(input, p: float = 0.5, training: bool = False, inplace: bool = False) -> kiln.Tensor:
    """Alpha dropout of whole channels (dim 1) of an input with a batch dim."""
    if input.ndim < 2:
        raise RuntimeError(f"feature_alpha_dropout: expected an input with a batch and a channel dim, got "
                           f"{input.ndim}D")  # fmt: skip
    return _apply(input, p, training, inplace, True, True)
