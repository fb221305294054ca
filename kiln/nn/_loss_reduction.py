"""How every loss reduces its per-element values: ``reduction`` (``"mean"``, ``"sum"`` or ``"none"``,
as in PyTorch) and the deprecated ``size_average``/``reduce`` flags that still choose it."""

from __future__ import annotations

import kiln

_REDUCTIONS = ("none", "mean", "sum")


def legacy_reduction(size_average: bool | None, reduce: bool | None, reduction: str) -> str:
    """``reduction`` as PyTorch's deprecated ``size_average``/``reduce`` flags say, where either is given.

    ``reduce=False`` is ``'none'``; otherwise ``size_average=False`` is ``'sum'`` and anything else
    ``'mean'``. Where both are None, ``reduction`` itself, checked by the loss that reads it.

    >>> legacy_reduction(False, None, "mean"), legacy_reduction(None, False, "mean"), legacy_reduction(None, None, "sum")
    ('sum', 'none', 'sum')
    """
    if size_average is None and reduce is None:
        return reduction
    if reduce is not None and not reduce:
        return "none"
    return "sum" if size_average is not None and not size_average else "mean"


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction (expected 'none', 'mean' or 'sum')")


def _reduce(loss: kiln.Tensor, reduction: str) -> kiln.Tensor:
    _check_reduction(reduction)
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss
