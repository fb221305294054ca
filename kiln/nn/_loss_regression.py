"""Regression losses, between real-valued predictions and targets: mse_loss, l1_loss,
smooth_l1_loss, huber_loss, and the negative log-likelihoods of Poisson and Gaussian targets.

Each follows ``torch.nn.functional``'s formula, defaults and ``reduction`` handling.
"""

from __future__ import annotations

import math

import kiln
from kiln.frontend.autocast import FLOAT32, autocast_op

from ._loss_arrays import pointwise_eager
from ._loss_reduction import _check_reduction, _reduce, legacy_reduction
from ._utils import saves_target

__all__ = ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "poisson_nll_loss", "gaussian_nll_loss"]


@autocast_op(FLOAT32)
def mse_loss(input, target, size_average=None, reduce=None, reduction: str = "mean") -> kiln.Tensor:
    """Mean squared error; ``input`` and ``target`` broadcast against each other."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    diff = input - target
    return saves_target(_reduce(diff * diff, reduction), target, "mse_loss")


@autocast_op(FLOAT32)
def l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean") -> kiln.Tensor:
    """Mean absolute error; ``input`` and ``target`` broadcast against each other."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    return _reduce(kiln.abs(input - target), reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0) -> kiln.Tensor:  # fmt: skip
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (L1 when beta is 0)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    if beta == 0.0:
        return _reduce(kiln.abs(input - target), reduction)
    loss = pointwise_eager("smooth_l1", input, target, beta, lambda x, t: _smooth_l1(x, t, beta))
    if loss is not None:  # one node, which keeps the target as PyTorch's does
        return _reduce(loss, reduction)
    loss = _reduce(_smooth_l1(input, target, beta), reduction)
    return saves_target(loss, target, "smooth_l1_loss")  # PyTorch's keeps it (its beta=0 form, l1_loss, not)


def _smooth_l1(input, target, beta: float) -> kiln.Tensor:
    diff = input - target
    magnitude = kiln.abs(diff)
    return kiln.where(magnitude < beta, 0.5 * diff * diff / beta, magnitude - 0.5 * beta)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0, weight=None) -> kiln.Tensor:
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta): smooth L1 scaled by delta."""
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    loss = pointwise_eager("huber", input, target, delta, lambda x, t: _huber(x, t, delta))
    keeps_target = loss is not None  # one node, which keeps the target as PyTorch's does
    if loss is None:
        loss = _huber(input, target, delta)
    if weight is not None:
        loss = loss * weight
    loss = _reduce(loss, reduction)
    return loss if keeps_target else saves_target(loss, target, "huber_loss")


def _huber(input, target, delta: float) -> kiln.Tensor:
    diff = input - target
    magnitude = kiln.abs(diff)
    return kiln.where(magnitude < delta, 0.5 * diff * diff, delta * (magnitude - 0.5 * delta))


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
