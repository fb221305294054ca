"""Adam and AdamW (decoupled weight decay), with AMSGrad."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import kiln
from kiln.frontend import fused_steps

from . import _on_arrays
from .optimizer import Optimizer, check_range, step_count

_run_compiled = fused_steps.run_fused


def _check_adam_args(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    check_range("learning rate", lr)
    check_range("epsilon value", eps)
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
    check_range("weight_decay value", weight_decay)


class Adam(Optimizer):
    """PyTorch's ``torch.optim.Adam``; the step count is a 0-d float32 tensor in each parameter's state.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = Adam([w], lr=1e-2, betas=(0.9, 0.99))
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
    numbers = ("lr", "betas", "eps", "weight_decay")
    flags = ("amsgrad", "maximize", "decoupled_weight_decay", "fused", "foreach")  # the last two: the eager path
    zero_skips = ("weight_decay",)

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        # fused / foreach: an eager step updates every parameter of a group in one compiled program
        # (_fused_step); capturable and differentiable are accepted and kept as PyTorch keeps them.
        _check_adam_args(lr, betas, eps, weight_decay)
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
            foreach=foreach, capturable=capturable, differentiable=differentiable, fused=fused,
            decoupled_weight_decay=decoupled_weight_decay or self._decoupled,
        )  # fmt: skip
        super().__init__(params, defaults)

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        state = {"step": step_count(p), "exp_avg": kiln.zeros_like(p), "exp_avg_sq": kiln.zeros_like(p)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = kiln.zeros_like(p)
        return state

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        if self._wants_compiled_step(group):  # else the loop, asked for (``fused=False``, ``foreach=False``)
            if fused_steps.may_run() and self._fused_step(group, scalars):
                return
            if _on_arrays.may_run(()) and self._fused_step(group, scalars, _on_arrays.run_on_arrays):
                return  # (the program is not ready, or eager kernels are off)
        lr, (beta1, beta2), eps = scalars["lr"], scalars["betas"], scalars["eps"]
        amsgrad, gradients = group["amsgrad"], self._gradients(group, scalars)
        # Per group, not per parameter: eager runs these 0-d ops once (a trace's CSE would merge them anyway).
        keep1, keep2 = 1 - beta1, 1 - beta2
        for p, grad, state in gradients:
            step, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
            exp_avg.mul_(beta1).add_(grad * keep1)
            exp_avg_sq.mul_(beta2).add_(grad * grad * keep2)
            # Bias corrections stay in float64 0-d tensors, as PyTorch computes them in Python floats.
            step_size = lr / (1 - beta1**step)
            correction2_sqrt = (1 - beta2**step).sqrt()
            if amsgrad:
                max_sq = state["max_exp_avg_sq"]
                max_sq.copy_(kiln.maximum(max_sq, exp_avg_sq))
                second = max_sq
            else:
                second = exp_avg_sq
            denom = second.sqrt() / correction2_sqrt + eps
            p.sub_(exp_avg / denom * step_size)

    def _fused_step(
        self, group: dict[str, Any], scalars: dict[str, kiln.Tensor], run: Callable = _run_compiled
    ) -> bool:
        """The group's step as one update of all its parameters, the same arithmetic as
        ``_update_group``'s loop: by default one compiled program (``fused_steps``), with
        ``run=_on_arrays.run_on_arrays`` on their arrays; False when the loop must run (see ``run``)."""
        # (``_grad`` and ``_data``: no trace is recording, see ``fused_steps.may_run``; the properties
        # cost a fifth of a small model's step here)
        params = [p for p in group["params"] if p._grad is not None]
        for p in params:
            grad = p._grad
            if grad.is_sparse or grad._dtype is not p._dtype or grad._data.shape != p._data.shape:
                return False
        keys = ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
        rows = []
        for p in params:
            state = self.state[p]
            if not state:
                state.update(kiln.jit.make_state(self._fresh_state, p, group))
            rows.append((p, p._grad, *[state[k] for k in keys]))
        decoupled = group["decoupled_weight_decay"]
        shared = [scalars["lr"], *scalars["betas"], scalars["eps"], scalars["weight_decay"]]
        flags = (group["amsgrad"], group["maximize"], group["weight_decay"] != 0, decoupled)
        return run("adam_step", functools.partial(_adam_update, *flags), shared, rows, flags)


def _adam_update(amsgrad: bool, maximize: bool, decay: bool, decoupled: bool, ops, shared, row) -> list:
    """One parameter's Adam step as graph values (``fused_steps.GraphOps``): the arithmetic of
    ``Adam._update_group`` and ``Optimizer._each_gradient``, op for op, in the same dtypes."""
    lr, beta1, beta2, eps, weight_decay = shared
    p, grad, step, exp_avg, exp_avg_sq = row[:5]
    step = ops.add(step, 1.0)
    new_p = p
    if maximize:
        grad = ops.neg(grad)
    if decay and decoupled:
        new_p = ops.mul(p, ops.sub(1.0, ops.mul(lr, weight_decay)))
    elif decay:
        grad = ops.add(grad, ops.mul(p, weight_decay))
    exp_avg = ops.add(ops.mul(exp_avg, beta1), ops.mul(grad, ops.sub(1.0, beta1)))
    exp_avg_sq = ops.add(ops.mul(exp_avg_sq, beta2), ops.mul(ops.mul(grad, grad), ops.sub(1.0, beta2)))
    # (the float32 step is cast to the betas' float64 by pow, as eager promotes two 0-d operands)
    step_size = ops.div(lr, ops.sub(1.0, ops.pow(beta1, step)))
    correction2_sqrt = ops.sqrt(ops.sub(1.0, ops.pow(beta2, step)))
    second = exp_avg_sq
    new_max = None
    if amsgrad:
        second = new_max = ops.maximum(row[5], exp_avg_sq)
    denom = ops.add(ops.div(ops.sqrt(second), correction2_sqrt), eps)
    new_p = ops.sub(new_p, ops.mul(ops.div(exp_avg, denom), step_size))
    return [new_p, None, step, exp_avg, exp_avg_sq, *([new_max] if amsgrad else [])]


class AdamW(Adam):
    """PyTorch's ``torch.optim.AdamW``: Adam with weight decay applied to the parameters directly.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = AdamW([w], lr=1e-2, weight_decay=0.1)
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
    _decoupled = True

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused)  # fmt: skip
