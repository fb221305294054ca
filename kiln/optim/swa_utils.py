"""Weight averaging, as ``torch.optim.swa_utils``: ``AveragedModel`` (SWA or EMA of a model's weights),
``SWALR`` (anneal to a constant SWA learning rate) and ``update_bn`` (recompute BatchNorm statistics).

>>> import kiln
>>> model = kiln.nn.Linear(2, 1)
>>> ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
>>> ema.update_parameters(model)
>>> int(ema.n_averaged)
1
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from typing import Any

import kiln

from ..nn.modules.module import Module
from ..nn.modules.normalization import _BatchNorm
from ._lr_base import LRScheduler, _per_group
from .optimizer import Optimizer

__all__ = ["AveragedModel", "SWALR", "update_bn", "get_ema_multi_avg_fn", "get_swa_multi_avg_fn", "get_ema_avg_fn",
           "get_swa_avg_fn"]  # fmt: skip


def get_ema_multi_avg_fn(decay: float = 0.999) -> Callable:
    """In place on lists: averaged <- averaged + (1 - decay) (current - averaged)."""

    def ema_update(averaged: list, current: list, num_averaged) -> None:
        for a, c in zip(averaged, current, strict=True):
            a.lerp_(c, 1 - decay)

    return ema_update


def get_swa_multi_avg_fn() -> Callable:
    """In place on lists: the running mean, averaged <- averaged + (current - averaged) / (n + 1)."""

    def swa_update(averaged: list, current: list, num_averaged) -> None:
        for a, c in zip(averaged, current, strict=True):
            a.add_((c - a) / (num_averaged + 1))

    return swa_update


def get_ema_avg_fn(decay: float = 0.999) -> Callable:
    def ema_update(averaged, current, num_averaged):
        return decay * averaged + (1 - decay) * current

    return ema_update


def get_swa_avg_fn() -> Callable:
    def swa_update(averaged, current, num_averaged):
        return averaged + (current - averaged) / (num_averaged + 1)

    return swa_update


class AveragedModel(Module):
    """A copy of ``model`` whose parameters (and buffers with ``use_buffers``) are averaged by ``update_parameters``.

    Averaging is the running mean by default (SWA), or ``avg_fn`` / ``multi_avg_fn`` (EMA, for one).
    """

    def __init__(self, model: Module, device=None, avg_fn: Callable | None = None,
                 multi_avg_fn: Callable | None = None, use_buffers: bool = False) -> None:  # fmt: skip
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise AssertionError("Only one of avg_fn and multi_avg_fn should be provided")
        self.module = copy.deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", kiln.tensor(0, dtype=kiln.int64, device=device))
        self.avg_fn, self.multi_avg_fn, self.use_buffers = avg_fn, multi_avg_fn, use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _averaged(self, module: Module) -> list:
        if self.use_buffers:
            return [*module.parameters(), *module.buffers()]
        return list(module.parameters())

    def update_parameters(self, model: Module) -> None:
        """Fold ``model``'s current weights into the average."""
        mine = [p.detach() for p in self._averaged(self.module)]
        theirs = [p.detach().to(a.device) for p, a in zip(self._averaged(model), mine, strict=True)]
        count = int(self.n_averaged)
        with kiln.no_grad():
            if count == 0:
                for a, c in zip(mine, theirs, strict=True):
                    a.copy_(c)
            elif self.avg_fn is not None:
                for a, c in zip(mine, theirs, strict=True):
                    a.copy_(self.avg_fn(a, c, self.n_averaged.to(a.device)))
            else:
                # Floating tensors are averaged; integer ones (a BatchNorm's batch count) are not, as in PyTorch.
                floating = [(a, c) for a, c in zip(mine, theirs, strict=True) if a.dtype.is_floating_point]
                update = self.multi_avg_fn or get_swa_multi_avg_fn()
                if floating:
                    update(
                        [a for a, _ in floating], [c for _, c in floating], self.n_averaged.to(floating[0][0].device)
                    )
            if not self.use_buffers:
                # The buffers follow the source model (its BatchNorm statistics, for one).
                for b_mine, b_theirs in zip(self.module.buffers(), model.buffers(), strict=True):
                    b_mine.copy_(b_theirs.detach().to(b_mine.device))
            self.n_averaged.add_(1)


def update_bn(loader: Iterable, model: Module, device=None) -> None:
    """One pass over ``loader`` in training mode, recomputing every BatchNorm's running statistics as plain
    averages over the whole pass (momentum None); the model's mode and momenta are restored."""
    momenta: dict[Any, Any] = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    with kiln.no_grad():
        for batch in loader:
            if isinstance(batch, list | tuple):
                batch = batch[0]
            if device is not None:
                batch = batch.to(device)
            model(batch)
    for module, momentum in momenta.items():
        module.momentum = momentum
    model.train(was_training)


class SWALR(LRScheduler):
    """Anneal each group's lr to ``swa_lr`` over ``anneal_epochs`` epochs (cosine or linear), then hold it."""

    def __init__(self, optimizer: Optimizer, swa_lr: float | list[float], anneal_epochs: int = 10,
                 anneal_strategy: str = "cos", last_epoch: int = -1) -> None:  # fmt: skip
        for lr, group in zip(_per_group("swa_lr", optimizer, swa_lr), optimizer.param_groups, strict=True):
            group["swa_lr"] = lr
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must by one of 'cos' or 'linear', instead got {anneal_strategy}")
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_strategy, self.anneal_epochs = anneal_strategy, anneal_epochs
        super().__init__(optimizer, last_epoch)

    def _anneal(self, t: float) -> float:
        return (1 - math.cos(math.pi * t)) / 2 if self.anneal_strategy == "cos" else t

    @staticmethod
    def _initial_lr(lr: float, swa_lr: float, alpha: float) -> float:
        # The lr before annealing, recovered from the current one (the schedule is recursive).
        return swa_lr if alpha == 1 else (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self) -> list[float]:
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_alpha = self._anneal(max(0.0, min(1.0, (step - 1) / max(1, self.anneal_epochs))))
        groups = self.optimizer.param_groups
        previous = [self._initial_lr(g["lr"], g["swa_lr"], prev_alpha) for g in groups]
        alpha = self._anneal(max(0.0, min(1.0, step / max(1, self.anneal_epochs))))
        return [g["swa_lr"] * alpha + lr * (1 - alpha) for g, lr in zip(groups, previous, strict=True)]
