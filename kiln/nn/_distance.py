"""Vector distances and rearrangements: normalize, cosine_similarity, pairwise_distance, pdist, pixel/channel
shuffle."""

from __future__ import annotations

import numpy as np

import kiln

from ._utils import new_memory

__all__ = ["normalize", "cosine_similarity", "pairwise_distance", "pdist", "pixel_shuffle", "pixel_unshuffle",
           "channel_shuffle"]  # fmt: skip


def normalize(input, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out=None) -> kiln.Tensor:
    """``input / max(||input||_p, eps)`` along ``dim``.

    >>> import kiln
    >>> normalize(kiln.tensor([[3.0, 4.0]])).tolist()
    [[0.6000000238418579, 0.800000011920929]]
    """
    result = input / kiln.clamp(kiln.norm(input, p, dim=dim, keepdim=True), min=eps)
    return result if out is None else out.copy_(result)


def _clamped_norm(x, dim: int, eps: float):
    # PyTorch clamps the norm in place under no_grad: the value is clamped, its gradient is the norm's.
    norm = kiln.norm(x, 2, dim=dim, keepdim=True)
    return norm + (kiln.clamp(norm, min=eps) - norm).detach()


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8) -> kiln.Tensor:
    """Cosine of the angle between ``x1`` and ``x2`` along ``dim``, after broadcasting them to one shape.

    Each vector is divided by its norm (clamped to >= eps) before the dot product, as PyTorch does.
    """
    shape = np.broadcast_shapes(tuple(x1.shape), tuple(x2.shape))
    x1, x2 = x1.expand(*shape), x2.expand(*shape)
    return ((x1 / _clamped_norm(x1, dim, eps)) * (x2 / _clamped_norm(x2, dim, eps))).sum(dim=dim)


def pairwise_distance(x1, x2, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> kiln.Tensor:
    """``||x1 - x2 + eps||_p`` over the last dim (eps keeps the gradient finite when x1 == x2)."""
    if x1.ndim == 0 or x2.ndim == 0:
        return kiln.abs(x1 - x2 + eps)
    return kiln.norm(x1 - x2 + eps, p, dim=-1, keepdim=keepdim)


def _check_factor(input, factor: int, name: str) -> None:
    if input.ndim < 3:
        raise RuntimeError(f"{name} expects input to have at least 3 dimensions, but got input with "
                           f"{input.ndim} dimension(s)")  # fmt: skip
    if factor <= 0:
        raise RuntimeError(f"{name} expects a positive factor, but got {factor}")


def pixel_shuffle(input, upscale_factor: int) -> kiln.Tensor:
    """(*, C r^2, H, W) -> (*, C, H r, W r): sub-pixel convolution's rearrangement."""
    r = upscale_factor
    _check_factor(input, r, "pixel_shuffle")
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square "
                           f"of upscale_factor, but input.size(-3)={c} is not divisible by {r * r}")  # fmt: skip
    n = len(lead)
    x = input.reshape(*lead, c // (r * r), r, r, h, w)
    x = x.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return new_memory(x.reshape(*lead, c // (r * r), h * r, w * r), input)


def pixel_unshuffle(input, downscale_factor: int) -> kiln.Tensor:
    """(*, C, H r, W r) -> (*, C r^2, H, W), the inverse of ``pixel_shuffle``."""
    r = downscale_factor
    _check_factor(input, r, "pixel_unshuffle")
    *lead, c, h, w = input.shape
    if h % r or w % r:
        raise RuntimeError(f"pixel_unshuffle expects height ({h}) and width ({w}) to be divisible by "
                           f"downscale_factor ({r})")  # fmt: skip
    n = len(lead)
    x = input.reshape(*lead, c, h // r, r, w // r, r)
    x = x.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return new_memory(x.reshape(*lead, c * r * r, h // r, w // r), input)


def channel_shuffle(input, groups: int) -> kiln.Tensor:
    """Interleave the channels (dim 1) of ``groups`` groups: (N, g k, ...) -> (N, k g, ...)."""
    if input.ndim < 3:
        raise RuntimeError(f"channel_shuffle expects input to have at least 3 dimensions, but got input with "
                           f"{input.ndim} dimension(s)")  # fmt: skip
    n, c, *rest = input.shape
    if groups <= 0 or c % groups:
        raise RuntimeError(f"Number of channels must be divisible by groups. Got {c} channels and {groups} groups.")
    return new_memory(input.reshape(n, groups, c // groups, *rest).transpose(1, 2).reshape(n, c, *rest), input)


def pdist(input, p: float = 2) -> kiln.Tensor:
    """p-norm distances between the rows of an (N, M) input, for each pair i < j in row-major order."""
    if input.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {input.ndim}D")
    n = input.shape[0]
    first = [i for i in range(n) for _ in range(i + 1, n)]
    second = [j for i in range(n) for j in range(i + 1, n)]
    if not first:
        return kiln.zeros(0, dtype=input.dtype, device=input.device)
    a = kiln.index_select(input, 0, kiln.tensor(first, dtype=kiln.int64, device=input.device))
    b = kiln.index_select(input, 0, kiln.tensor(second, dtype=kiln.int64, device=input.device))
    return kiln.norm(a - b, p, dim=1)
