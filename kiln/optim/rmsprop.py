"""RMSprop, optionally centered and with momentum."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kiln

from .optimizer import Optimizer, check_range, step_count


class RMSprop(Optimizer):
    """PyTorch's ``torch.optim.RMSprop``.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = RMSprop([w], lr=1e-2, centered=True)
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
    numbers = ("lr", "alpha", "eps", "weight_decay", "momentum")
    flags = ("centered", "maximize")
    zero_skips = ("momentum", "weight_decay")  # momentum <= 0: no buffer, as in PyTorch

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        check_range("learning rate", lr)
        check_range("epsilon value", eps)
        check_range("momentum value", momentum)
        check_range("weight_decay value", weight_decay)
        check_range("alpha value", alpha)
        defaults = dict(
            lr=lr,
            alpha=alpha,
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            centered=centered,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
        )
        super().__init__(params, defaults)

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        state = {"step": step_count(p), "square_avg": kiln.zeros_like(p)}
        if group["momentum"] > 0:
            state["momentum_buffer"] = kiln.zeros_like(p)
        if group["centered"]:
            state["grad_avg"] = kiln.zeros_like(p)
        return state

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        lr, alpha, eps, gradients = scalars["lr"], scalars["alpha"], scalars["eps"], self._gradients(group, scalars)
        momentum = scalars["momentum"] if group["momentum"] > 0 else None
        keep = 1 - alpha
        for p, grad, state in gradients:
            square_avg = state["square_avg"]
            square_avg.mul_(alpha).add_(grad * grad * keep)
            if group["centered"]:
                grad_avg = state["grad_avg"]
                grad_avg.mul_(alpha).add_(grad * keep)
                avg = (square_avg - grad_avg * grad_avg).sqrt() + eps
            else:
                avg = square_avg.sqrt() + eps
            if momentum is not None:
                buf = state["momentum_buffer"]
                buf.mul_(momentum).add_(grad / avg)
                p.sub_(buf * lr)
            else:
                p.sub_(grad / avg * lr)
