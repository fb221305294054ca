"""Adagrad with learning-rate decay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kiln

from .optimizer import Optimizer, check_range, step_count


class Adagrad(Optimizer):
    """PyTorch's ``torch.optim.Adagrad``; state is created eagerly, as PyTorch does.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = Adagrad([w], lr=0.1, lr_decay=0.01)
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
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
                self.state[p].update(self._fresh_state(p, group))

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        return {"step": step_count(p), "sum": kiln.full_like(p, group["initial_accumulator_value"])}

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        lr, lr_decay, eps = scalars["lr"], scalars["lr_decay"], scalars["eps"]
        for p, grad, state in self._gradients(group, scalars):
            clr = lr / (1 + (state["step"] - 1) * lr_decay)
            state["sum"].add_(grad * grad)
            std = state["sum"].sqrt() + eps
            p.sub_(grad / std * clr)
