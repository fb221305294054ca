"""Adadelta: per-coordinate steps from running averages of squared gradients and squared updates."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kiln

from .optimizer import Optimizer, check_range, step_count


class Adadelta(Optimizer):
    """PyTorch's ``torch.optim.Adadelta``; ``lr`` scales the update and is read through a tensor.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = Adadelta([w], rho=0.95)
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
    numbers = ("lr", "rho", "eps", "weight_decay")
    zero_skips = ("weight_decay",)

    def __init__(
        self,
        params: Iterable,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
        *,
        capturable: bool = False,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        check_range("learning rate", lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        check_range("epsilon value", eps)
        check_range("weight_decay value", weight_decay)
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable)  # fmt: skip
        super().__init__(params, defaults)

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        return {"step": step_count(p), "square_avg": kiln.zeros_like(p), "acc_delta": kiln.zeros_like(p)}

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        lr, rho, eps, gradients = scalars["lr"], scalars["rho"], scalars["eps"], self._gradients(group, scalars)
        keep = 1 - rho
        for p, grad, state in gradients:
            square_avg, acc_delta = state["square_avg"], state["acc_delta"]
            square_avg.mul_(rho).add_(grad * grad * keep)
            # The update is RMS[delta] / RMS[grad] * grad: its units match the parameter's.
            delta = (acc_delta + eps).sqrt() / (square_avg + eps).sqrt() * grad
            acc_delta.mul_(rho).add_(delta * delta * keep)
            p.sub_(delta * lr)
