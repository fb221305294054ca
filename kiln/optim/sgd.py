"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import kiln
from kiln.frontend import fused_steps

from . import _on_arrays
from .optimizer import Optimizer, check_range

_run_compiled = fused_steps.run_fused


class SGD(Optimizer):
    """PyTorch's ``torch.optim.SGD``.

    >>> w = kiln.tensor([1.0], requires_grad=True)
    >>> opt = SGD([w], lr=0.1, momentum=0.9)
    """

    kiln_only = True  # its step calls no user code but a closure (``Optimizer.step``)
    numbers = ("lr", "momentum", "dampening", "weight_decay")
    flags = ("nesterov", "maximize", "fused", "foreach")  # the last two choose the eager path
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
        if self._wants_compiled_step(group):  # else the loop, asked for (``fused=False``, ``foreach=False``)
            if fused_steps.may_run() and self._fused_step(group, scalars):
                return
            if _on_arrays.may_run(()) and self._fused_step(group, scalars, _on_arrays.run_on_arrays):
                return  # (the program is not ready, or eager kernels are off)
        lr = scalars["lr"]
        momentum = scalars["momentum"] if group["momentum"] != 0 else None  # 0: no buffer, as in PyTorch
        undamped = 1 - scalars["dampening"] if momentum is not None else None
        for p, grad, _ in self._gradients(group, scalars):  # no state made: SGD keeps its own buffer
            if momentum is not None:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None and _starts_from_zero(group):
                    buf = _zero_buffer(state, p)
                if buf is None:  # the first step with dampening: PyTorch's buffer is the gradient itself
                    buf = state["momentum_buffer"] = grad.detach().clone()
                else:
                    buf.mul_(momentum).add_(grad * undamped)
                grad = grad + buf * momentum if group["nesterov"] else buf
            p.sub_(grad * lr)

    def _fused_step(
        self, group: dict[str, Any], scalars: dict[str, kiln.Tensor], run: Callable = _run_compiled
    ) -> bool:
        """The group's step as one update of all its parameters, the loop's arithmetic: by default one
        compiled program (``fused_steps``), with ``run=_on_arrays.run_on_arrays`` on their arrays;
        False when the loop must run (see ``run``; the first step with dampening, which makes the
        buffers from the gradients)."""
        params = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse or p.grad.dtype != p.dtype or p.grad.shape != p.shape for p in params):
            return False
        momentum = group["momentum"] != 0
        missing = [p for p in params if momentum and self.state[p].get("momentum_buffer") is None]
        if missing and not _starts_from_zero(group):
            return False
        for p in missing:
            _zero_buffer(self.state[p], p)
        shared = [scalars["lr"], scalars["momentum"], scalars["dampening"], scalars["weight_decay"]]
        rows = [(p, p.grad, *([self.state[p]["momentum_buffer"]] if momentum else [])) for p in params]
        flags = (momentum, group["nesterov"], group["maximize"], group["weight_decay"] != 0)
        return run("sgd_step", functools.partial(_sgd_update, *flags), shared, rows, flags)


def _starts_from_zero(group: dict[str, Any]) -> bool:
    """Whether a first step may start from a zero momentum buffer. PyTorch's first buffer is the
    gradient; ``0 * momentum + grad * (1 - 0)`` is that gradient exactly when dampening is 0 (the
    default), so the first step then runs the arithmetic of every later one: a compiled step traced
    at the first call serves the later calls. With dampening it would be scaled, and the first
    step stores a clone of the gradient (a second trace, for a compiled step)."""
    return group["dampening"] == 0 and math.isfinite(group["momentum"])  # 0 * inf is nan, not 0


def _zero_buffer(state: dict, p: kiln.Tensor) -> kiln.Tensor:
    """``p``'s momentum buffer made as zeros outside any trace (``make_state``): state a compiled
    step reads, not a tensor the traced call made and stored away, which would run that call
    eagerly and cost the next one a second trace."""
    buffer = state["momentum_buffer"] = kiln.jit.make_state(kiln.zeros_like, p)
    return buffer


def _sgd_update(momentum: bool, nesterov: bool, maximize: bool, decay: bool, ops, shared, row) -> list:
    """One parameter's SGD step as graph values (``fused_steps.GraphOps``): ``SGD._update_group``'s
    arithmetic and ``Optimizer._each_gradient``'s, op for op, in the same dtypes."""
    lr, momentum_value, dampening, weight_decay = shared
    p, grad = row[0], row[1]
    if maximize:
        grad = ops.neg(grad)
    if decay:
        grad = ops.add(grad, ops.mul(p, weight_decay))
    buf = None
    if momentum:
        buf = ops.add(ops.mul(row[2], momentum_value), ops.mul(grad, ops.sub(1.0, dampening)))
        grad = ops.add(grad, ops.mul(buf, momentum_value)) if nesterov else buf
    return [ops.sub(p, ops.mul(grad, lr)), None, *([buf] if momentum else [])]
