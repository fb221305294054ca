# mypy: disable-error-code="operator,assignment"
# reason: p.grad is typed Tensor | None (step skips None grads); numbers extends the base tuple by one name
"""NAdam (Nesterov momentum in Adam) and RAdam (Adam with its variance rectified in early steps)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kiln

from .adam import _check_adam_args
from .optimizer import Optimizer, check_range, step_count


class _AdamFamily(Optimizer):
    """Shared constructor and state of NAdam and RAdam (first and second moments, a step count)."""

    numbers = ("lr", "betas", "eps", "weight_decay")
    flags = ("maximize", "decoupled_weight_decay")
    zero_skips = ("weight_decay",)

    def __init__(self, params: Iterable, defaults: dict[str, Any]) -> None:
        _check_adam_args(defaults["lr"], defaults["betas"], defaults["eps"], defaults["weight_decay"])
        super().__init__(params, defaults)

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        return {"step": step_count(p), "exp_avg": kiln.zeros_like(p), "exp_avg_sq": kiln.zeros_like(p)}

    @staticmethod
    def _advance_moments(state: dict[str, kiln.Tensor], grad: kiln.Tensor, scalars: dict[str, kiln.Tensor]) -> None:
        """Move both moments of one parameter towards ``grad`` (its gradient after weight decay)."""
        beta1, beta2 = scalars["betas"]
        state["exp_avg"].add_((grad - state["exp_avg"]) * (1 - beta1))
        state["exp_avg_sq"].mul_(beta2).add_(grad * grad * (1 - beta2))


class NAdam(_AdamFamily):
    """PyTorch's ``torch.optim.NAdam``; the momentum schedule's running product is state (``mu_product``).

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = NAdam([w], lr=2e-3, momentum_decay=4e-3)
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
    numbers = (*_AdamFamily.numbers, "momentum_decay")

    def __init__(
        self,
        params: Iterable,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum_decay: float = 4e-3,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        check_range("momentum_decay value", momentum_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, momentum_decay=momentum_decay,
                        decoupled_weight_decay=decoupled_weight_decay, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable)  # fmt: skip
        super().__init__(params, defaults)

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        mu_product = kiln.tensor(1.0, dtype=kiln.float32, device=p.device)
        return {"step": step_count(p), "mu_product": mu_product, "exp_avg": kiln.zeros_like(p),
                "exp_avg_sq": kiln.zeros_like(p)}  # fmt: skip

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        lr, (beta1, beta2), eps, decay = scalars["lr"], scalars["betas"], scalars["eps"], scalars["momentum_decay"]
        for p, grad, state in self._gradients(group, scalars):
            self._advance_moments(state, grad, scalars)
            step64 = state["step"].to(kiln.float64)
            mu = beta1 * (1.0 - 0.5 * 0.96 ** (step64 * decay))
            mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((step64 + 1) * decay))
            mu_product = state["mu_product"]
            mu_product.mul_(mu)
            product = mu_product.to(kiln.float64)
            denom = (state["exp_avg_sq"] / (1 - beta2**step64)).sqrt() + eps
            p.sub_(grad / denom * (lr * (1 - mu) / (1 - product)))
            p.sub_(state["exp_avg"] / denom * (lr * mu_next / (1 - product * mu_next)))


class RAdam(_AdamFamily):
    """PyTorch's ``torch.optim.RAdam``: plain momentum SGD until the variance estimate is tractable.

    The switch (rho_t > 5) is a ``where`` on tensors, so a compiled step needs no branch.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = RAdam([w], lr=1e-3)
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=decoupled_weight_decay, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable)  # fmt: skip
        super().__init__(params, defaults)

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        lr, (beta1, beta2), eps = scalars["lr"], scalars["betas"], scalars["eps"]
        rho_inf = 2 / (1 - beta2) - 1  # from this call's beta2, as everything derived from the numbers
        for p, grad, state in self._gradients(group, scalars):
            self._advance_moments(state, grad, scalars)
            step64 = state["step"].to(kiln.float64)
            correction1 = 1 - beta1**step64
            correction2 = 1 - beta2**step64
            corrected_avg = state["exp_avg"] / correction1
            rho_t = rho_inf - 2 * step64 * beta2**step64 / correction2
            tractable = rho_t > 5
            # Clamped so the branch not taken stays finite (its sqrt would be of a negative number).
            safe_rho = kiln.where(tractable, rho_t, 5.0 + 1.0)
            rect = ((safe_rho - 4) * (safe_rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * safe_rho)).sqrt()
            adaptive = correction2.sqrt() / (state["exp_avg_sq"].sqrt() + eps)
            scale = kiln.where(tractable, rect, 0.0)
            rectified = corrected_avg * lr * adaptive * scale.to(p.dtype)
            plain = corrected_avg * lr
            p.sub_(kiln.where(tractable, rectified, plain))
