"""Margin and embedding losses: soft margin (two-class and multi-label), margin ranking, hinge
embedding, cosine embedding, triplet margin, multi-class and multi-label margin.

Each follows ``torch.nn.functional``'s formula, defaults and ``reduction`` handling.
"""

from __future__ import annotations

import kiln

from ._distance import pairwise_distance
from ._loss_reduction import _reduce, legacy_reduction

__all__ = [
    "soft_margin_loss",
    "margin_ranking_loss",
    "hinge_embedding_loss",
    "cosine_embedding_loss",
    "triplet_margin_loss",
    "triplet_margin_with_distance_loss",
    "multilabel_soft_margin_loss",
    "multi_margin_loss",
    "multilabel_margin_loss",
]


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction: str = "mean") -> kiln.Tensor:
    """log(1 + exp(-y x)) for labels y in {-1, 1}."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    return _reduce(kiln.softplus(-target * input), reduction)


def margin_ranking_loss(input1, input2, target, margin: float = 0.0, size_average=None, reduce=None,
                        reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """max(0, -y (x1 - x2) + margin)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    return _reduce(kiln.clamp(-target * (input1 - input2) + margin, min=0.0), reduction)


def hinge_embedding_loss(input, target, margin: float = 1.0, size_average=None, reduce=None,
                         reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """x where y == 1, max(0, margin - x) where y == -1 (PyTorch adds both terms for other labels)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    margin_part = kiln.where(target != 1, kiln.clamp(margin - input, min=0.0), 0.0)
    self_part = kiln.where(target != -1, input, 0.0)
    return _reduce(margin_part + self_part, reduction)


def cosine_embedding_loss(input1, input2, target, margin: float = 0.0, size_average=None, reduce=None,
                          reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """1 - cos(x1, x2) where y == 1, max(0, cos(x1, x2) - margin) where y == -1."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    eps = 1e-12
    dot = (input1 * input2).sum(dim=-1)
    cos = dot / kiln.sqrt(((input1 * input1).sum(dim=-1) + eps) * ((input2 * input2).sum(dim=-1) + eps))
    loss = kiln.where(target == 1, 1 - cos, 0.0) + kiln.where(target == -1, kiln.clamp(cos - margin, min=0.0), 0.0)
    return _reduce(loss, reduction)


def triplet_margin_loss(anchor, positive, negative, margin: float = 1.0, p: float = 2, eps: float = 1e-6,
                        swap: bool = False, size_average=None, reduce=None,
                        reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """max(0, margin + d(a, p) - d(a, n)) with d the pairwise p-distance."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = kiln.minimum(d_neg, pairwise_distance(positive, negative, p, eps))
    return _reduce(kiln.clamp(margin + d_pos - d_neg, min=0.0), reduction)


def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None, margin: float = 1.0,
                                      swap: bool = False, reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """max(0, margin + d(a, p) - d(a, n)) for any ``distance_function`` (pairwise_distance by default)."""
    if margin <= 0:
        raise ValueError(f"triplet_margin_with_distance_loss: expected margin to be greater than 0, got {margin}")
    distance = pairwise_distance if distance_function is None else distance_function
    d_pos, d_neg = distance(anchor, positive), distance(anchor, negative)
    if swap:
        d_neg = kiln.minimum(d_neg, distance(positive, negative))
    loss = kiln.clamp(margin + d_pos - d_neg, min=0.0)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None,
                                reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """Per-class logistic loss averaged over the C classes of an (N, C) input."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    # log sigmoid(x) = -softplus(-x)
    loss = target * kiln.softplus(-input) + (1 - target) * kiln.softplus(input)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss.sum(dim=-1) / input.shape[-1], reduction)


def multi_margin_loss(input, target, p: int = 1, margin: float = 1.0, weight=None, size_average=None,
                      reduce=None, reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """sum over classes i != y of max(0, margin - x[y] + x[i])^p / C, times weight[y]."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    x = input if input.ndim == 2 else input.reshape(1, -1)
    y = target.reshape(-1, 1).to(kiln.int64)
    picked = kiln.gather(x, 1, y)
    hinge = kiln.clamp(margin - picked + x, min=0.0)
    if p == 2:
        hinge = hinge * hinge
    if weight is not None:
        hinge = hinge * kiln.index_select(weight, 0, y.reshape(-1)).reshape(-1, 1)
    others = kiln.arange(x.shape[1], device=x.device).reshape(1, -1) != y
    loss = kiln.where(others, hinge, 0.0).sum(dim=1) / x.shape[1]
    return _reduce(loss if input.ndim == 2 else loss.reshape(()), reduction)


def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction: str = "mean") -> kiln.Tensor:
    """sum over target classes j and non-target classes i of max(0, 1 - (x[j] - x[i])) / C.

    ``target`` holds class indices per sample, ended by the first -1 (the rest is ignored).
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    x = input if input.ndim == 2 else input.reshape(1, -1)
    y = target.reshape(x.shape).to(kiln.int64)
    classes = x.shape[1]
    # Positions before the first -1 hold targets.
    valid = kiln.cumsum((y < 0).to(kiln.int64), dim=1) == 0
    safe = kiln.where(valid, y, 0)
    hits = (safe.unsqueeze(2) == kiln.arange(classes, device=x.device).reshape(1, 1, -1)) & valid.unsqueeze(2)
    is_target = hits.any(dim=1)  # (N, C)
    picked = kiln.gather(x, 1, safe)  # (N, K): x at each target
    hinge = kiln.clamp(1 - picked.unsqueeze(2) + x.unsqueeze(1), min=0.0)  # (N, K, C)
    mask = valid.unsqueeze(2) & ~is_target.unsqueeze(1)
    loss = kiln.where(mask, hinge, 0.0).sum(dim=(1, 2)) / classes
    return _reduce(loss if input.ndim == 2 else loss.reshape(()), reduction)
