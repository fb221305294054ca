"""More losses: smooth L1 / Huber, KL divergence, margin and embedding losses, Poisson and Gaussian NLL.

Each follows ``torch.nn.functional``'s formula, defaults and ``reduction`` handling.
"""

from __future__ import annotations

import math

import kiln

from ._distance import pairwise_distance
from ._loss import _check_reduction, _reduce, legacy_reduction

__all__ = ["smooth_l1_loss", "huber_loss", "kl_div", "soft_margin_loss", "margin_ranking_loss",
           "hinge_embedding_loss", "cosine_embedding_loss", "poisson_nll_loss", "gaussian_nll_loss",
           "triplet_margin_loss", "multilabel_soft_margin_loss", "multi_margin_loss", "multilabel_margin_loss"]  # fmt: skip


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0) -> kiln.Tensor:  # fmt: skip
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (L1 when beta is 0)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    diff = input - target
    if beta == 0.0:
        return _reduce(kiln.abs(diff), reduction)
    magnitude = kiln.abs(diff)
    return _reduce(kiln.where(magnitude < beta, 0.5 * diff * diff / beta, magnitude - 0.5 * beta), reduction)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0, weight=None) -> kiln.Tensor:
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta): smooth L1 scaled by delta."""
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    diff = input - target
    magnitude = kiln.abs(diff)
    loss = kiln.where(magnitude < delta, 0.5 * diff * diff, delta * (magnitude - 0.5 * delta))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def kl_div(input, target, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False) -> kiln.Tensor:  # fmt: skip
    """KL(target || exp(input)) pointwise: ``target (log target - input)``; ``input`` holds log-probabilities.

    ``reduction="batchmean"`` divides the sum by the batch size (the mathematically right mean).
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    if log_target:
        loss = kiln.exp(target) * (target - input)
    else:
        positive = target > 0
        # xlogy: 0 log 0 = 0, and the log never sees a zero (so no nan gradient).
        loss = kiln.where(positive, target * kiln.log(kiln.where(positive, target, 1.0)), 0.0) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return _reduce(loss, reduction)


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


def poisson_nll_loss(input, target, log_input: bool = True, full: bool = False, size_average=None,
                     eps: float = 1e-8, reduce=None, reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """Poisson negative log-likelihood of ``target`` counts with rate exp(input) (or input itself)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    loss = kiln.exp(input) - target * input if log_input else input - target * kiln.log(input + eps)
    if full:
        # Stirling's approximation of log(target!), counted only where target > 1 (as in PyTorch).
        safe = kiln.where(target > 1, target, 1.0)
        stirling = safe * kiln.log(safe) - safe + 0.5 * kiln.log(2 * math.pi * safe)
        loss = loss + kiln.where(target > 1, stirling, 0.0)
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """0.5 (log var + (input - target)^2 / var); ``var`` is clamped to >= eps with an identity gradient."""
    _check_reduction(reduction)
    if not isinstance(var, kiln.Tensor):
        var = kiln.full_like(input, float(var))
    if tuple(var.shape) != tuple(input.shape):
        if tuple(input.shape[:-1]) == tuple(var.shape):  # homoscedastic over the last dim
            var = var.unsqueeze(-1)
        elif not (tuple(input.shape[:-1]) == tuple(var.shape[:-1]) and var.shape[-1] == 1):
            raise ValueError("var is of incorrect size")
    if isinstance(var, kiln.Tensor):
        kiln.jit.check_values(var >= 0, ValueError, "var has negative entry/entries")
    # PyTorch clamps a copy under no_grad: the value is clamped, the gradient passes as if it were not.
    var = var + (kiln.clamp(var, min=eps) - var).detach()
    loss = 0.5 * (kiln.log(var) + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
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
