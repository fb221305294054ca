"""Adagrad with learning-rate decay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kiln

from .optimizer import Optimizer, check_range, weight_decay_of


class Adagrad(Optimizer):
    """PyTorch's ``torch.optim.Adagrad``; state is created eagerly, as PyTorch does.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = Adagrad([w], lr=0.1, lr_decay=0.01)
    """

    numbers = ("lr", "lr_decay", "weight_decay", "eps")  # initial_accumulator_value: read once, here
    zero_skips = ("weight_decay",)

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        check_range("learning rate", lr)
        check_range("lr_decay value", lr_decay)
        check_range("weight_decay value", weight_decay)
        check_range("initial_accumulator_value value", initial_accumulator_value)
        check_range("epsilon value", eps)
        defaults = dict(
            lr=lr,
            lr_decay=lr_decay,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            eps=eps,
            maximize=maximize,
            foreach=foreach,
            differentiable=differentiable,
            fused=fused,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["step"] = kiln.tensor(0.0, dtype=kiln.float32, device=p.device)
                state["sum"] = kiln.full_like(p, group["initial_accumulator_value"])

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        lr, lr_decay, eps = scalars["lr"], scalars["lr_decay"], scalars["eps"]
        weight_decay = weight_decay_of(group, scalars)
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = -p.grad if group["maximize"] else p.grad
            state = self.state[p]
            step = state["step"]
            step.add_(1)
            if weight_decay is not None:
                grad = grad + p * weight_decay
            clr = lr / (1 + (step - 1) * lr_decay)
            state["sum"].add_(grad * grad)
            std = state["sum"].sqrt() + eps
            p.sub_(grad / std * clr)
