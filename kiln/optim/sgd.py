"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kiln

from .optimizer import Optimizer, check_range


class SGD(Optimizer):
    """PyTorch's ``torch.optim.SGD``.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = SGD([w], lr=0.1, momentum=0.9)
    """

    numbers = ("lr", "momentum", "dampening", "weight_decay")
    flags = ("nesterov", "maximize")
    zero_skips = ("momentum", "weight_decay")
    _counts_steps = False  # the state is the momentum buffer alone

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        check_range("learning rate", lr)
        check_range("momentum value", momentum)
        check_range("weight_decay value", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            foreach=foreach,
            differentiable=differentiable,
            fused=fused,
        )
        super().__init__(params, defaults)

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        lr = scalars["lr"]
        momentum = scalars["momentum"] if group["momentum"] != 0 else None  # 0: no buffer, as in PyTorch
        undamped = 1 - scalars["dampening"] if momentum is not None else None
        for p, grad, _ in self._gradients(group, scalars):  # no state made: SGD keeps its own buffer
            if momentum is not None:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = grad.detach().clone()
                else:
                    buf.mul_(momentum).add_(grad * undamped)
                grad = grad + buf * momentum if group["nesterov"] else buf
            p.sub_(grad * lr)
