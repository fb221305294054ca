"""Adamax: Adam with the infinity norm in place of the second moment."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kiln

from .adam import _check_adam_args
from .optimizer import Optimizer, step_count


class Adamax(Optimizer):
    """PyTorch's ``torch.optim.Adamax``.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = Adamax([w], lr=2e-3)
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
    numbers = ("lr", "betas", "eps", "weight_decay")
    zero_skips = ("weight_decay",)

    def __init__(
        self,
        params: Iterable,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ) -> None:
        _check_adam_args(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize,
                        foreach=foreach, differentiable=differentiable, capturable=capturable)  # fmt: skip
        super().__init__(params, defaults)

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        return {"step": step_count(p), "exp_avg": kiln.zeros_like(p), "exp_inf": kiln.zeros_like(p)}

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        lr, (beta1, beta2), eps = scalars["lr"], scalars["betas"], scalars["eps"]
        gradients = self._gradients(group, scalars)
        keep1 = 1 - beta1
        for p, grad, state in gradients:
            step, exp_avg, exp_inf = state["step"], state["exp_avg"], state["exp_inf"]
            exp_avg.add_((grad - exp_avg) * keep1)
            exp_inf.copy_(kiln.maximum(exp_inf * beta2, grad.abs() + eps))
            p.sub_(exp_avg / exp_inf * (lr / (1 - beta1**step)))
