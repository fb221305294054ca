"""ASGD (averaged SGD) and Rprop (sign-based steps with per-coordinate step sizes)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kiln

from .optimizer import Optimizer, check_range, step_count


class ASGD(Optimizer):
    """PyTorch's ``torch.optim.ASGD``; the running average of the parameters is ``state["ax"]``.

    ``eta`` and ``mu`` are 0-d float32 tensors in the state, updated in place each step.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = ASGD([w], lr=1e-2, t0=10)
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
    numbers = ("lr", "lambd", "alpha", "t0", "weight_decay")
    zero_skips = ("weight_decay",)

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-2,
        lambd: float = 1e-4,
        alpha: float = 0.75,
        t0: float = 1e6,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ) -> None:
        check_range("learning rate", lr)
        check_range("weight_decay value", weight_decay)
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, capturable=capturable)  # fmt: skip
        super().__init__(params, defaults)

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        eta = kiln.tensor(float(group["lr"]), dtype=kiln.float32, device=p.device)
        mu = kiln.tensor(1.0, dtype=kiln.float32, device=p.device)
        return {"step": step_count(p), "eta": eta, "mu": mu, "ax": kiln.zeros_like(p)}

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        lr, lambd, alpha, t0 = scalars["lr"], scalars["lambd"], scalars["alpha"], scalars["t0"]
        for p, grad, state in self._gradients(group, scalars):
            step, eta, mu = state["step"], state["eta"], state["mu"]
            eta64 = eta.to(kiln.float64)
            p.mul_(1 - lambd * eta64)
            p.sub_(grad * eta64)
            # With mu == 1 this is ax = p, PyTorch's first branch.
            ax = state["ax"]
            ax.add_((p - ax) * mu)
            step64 = step.to(kiln.float64)
            eta.copy_(lr / (1 + lambd * lr * step64) ** alpha)
            mu.copy_(1 / kiln.clamp(step64 - t0, min=1.0))


class Rprop(Optimizer):
    """PyTorch's ``torch.optim.Rprop``: each coordinate's step grows while its gradient keeps its sign.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = Rprop([w], lr=1e-2, etas=(0.5, 1.2))
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
    numbers = ("etas", "step_sizes")  # lr only sets each parameter's first step size, as in PyTorch
    # no weight decay: it is not one of zero_skips, so _gradients adds none (PyTorch's Rprop has none)

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-2,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-6, 50),
        *,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        check_range("learning rate", lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        defaults = dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes), foreach=foreach, maximize=maximize,
                        differentiable=differentiable, capturable=capturable)  # fmt: skip
        super().__init__(params, defaults)

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        return {
            "step": step_count(p),
            "prev": kiln.zeros_like(p),
            "step_size": kiln.full_like(p.grad, float(group["lr"])),
        }

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        eta_minus, eta_plus = scalars["etas"]
        step_min, step_max = scalars["step_sizes"]
        for p, grad, state in self._gradients(group, scalars):
            prev, step_size = state["prev"], state["step_size"]
            agreement = (grad * prev).sign()
            factor = kiln.where(agreement > 0, eta_plus, kiln.where(agreement < 0, eta_minus, 1.0)).to(p.dtype)
            step_size.copy_(kiln.clamp(step_size * factor, step_min, step_max))
            # After a sign change the coordinate rests for one step (its gradient counts as zero).
            grad = kiln.where(agreement < 0, 0.0, grad).to(p.dtype)
            p.sub_(grad.sign() * step_size)
            prev.copy_(grad)
