"""Learning-rate schedulers: PyTorch's recursive ("chainable") forms, producing the same values.

A scheduler writes Python floats into ``group["lr"]``; the optimizer reads them through tensors.
This module is PyTorch's path to them all; they live by kind in ``_lr_base`` (the base class and
the schedules that follow a formula of the epoch), ``_lr_cyclic`` (cycles and warm restarts),
``_lr_composite`` (SequentialLR, ChainedScheduler) and ``_lr_plateau`` (ReduceLROnPlateau).

>>> import kiln, kiln.optim
>>> w = kiln.tensor([1.0], requires_grad=True)
>>> opt = kiln.optim.SGD([w], lr=1.0)
>>> sched = StepLR(opt, step_size=2, gamma=0.5)
>>> for _ in range(3):
...     opt.step()
...     sched.step()
>>> sched.get_last_lr()
[0.5]
"""

from ._lr_base import (
    ConstantLR,
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    PolynomialLR,
    StepLR,
)
from ._lr_composite import ChainedScheduler, SequentialLR
from ._lr_cyclic import CosineAnnealingWarmRestarts, CyclicLR, OneCycleLR
from ._lr_plateau import ReduceLROnPlateau

__all__ = ["ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
           "ExponentialLR", "LRScheduler", "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR", "OneCycleLR",
           "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR"]  # fmt: skip
