"""Argument helpers shared by the functional modules: PyTorch's int-or-tuple spellings."""

from __future__ import annotations

import kiln
from kiln.frontend.autograd.checked import check_saved


def ntuple(value, d: int, name: str, op: str) -> tuple[int, ...]:
    """``value`` (an int or a sequence of ``d`` ints) as a tuple of ``d`` ints."""
    if isinstance(value, int):
        return (value,) * d
    values = tuple(value)
    if len(values) == 1:
        values = values * d
    if len(values) != d or not all(isinstance(v, int) for v in values):
        raise ValueError(f"{op}: {name} must be an int or a tuple of {d} ints, got {value!r}")
    return values


def check_tensor(x, name: str, op: str) -> kiln.Tensor:
    if not isinstance(x, kiln.Tensor):
        raise TypeError(f"{op}(): argument '{name}' must be a Tensor, not {type(x).__name__}")
    return x


def pad_spec(pads: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """Per-spatial-dim (left, right) pads in ``F.pad`` order: the last dimension first."""
    return tuple(p for pair in reversed(pads) for p in pair)


def batched(x: kiln.Tensor, d: int, op: str) -> tuple[kiln.Tensor, bool]:
    """``x`` as (N, C, *spatial) for ``d`` spatial dims; an unbatched (C, *spatial) gets N = 1."""
    if x.ndim == d + 2:
        return x, False
    if x.ndim == d + 1:
        return x.unsqueeze(0), True
    raise RuntimeError(
        f"{op}: expected a {d + 1}-d (unbatched) or {d + 2}-d (batched) input, got shape {list(x.shape)}"
    )


def new_memory(out: kiln.Tensor, input: kiln.Tensor) -> kiln.Tensor:
    """``out``, or a copy of it where it is ``input``'s memory rearranged by views alone (a factor of
    1 makes the rearrangement an identity, and reshape then returns a view): PyTorch's result is
    new memory, which a later in-place change of ``input`` leaves alone."""
    return out.clone() if out.numel() and out.data_ptr() == input.data_ptr() else out


def saves_target(loss: kiln.Tensor, target, op: str) -> kiln.Tensor:
    """``loss``, whose backward raises as PyTorch's does when ``target`` was changed in place after
    the loss ``op`` was computed. PyTorch's nll_loss (so cross_entropy against class indices),
    mse_loss, smooth_l1_loss and huber_loss keep their target for their backward; kiln's formulas
    read only values made from it (the picked index, ``input - target``), so a changed target went
    unnoticed (the gradient of the old one). Without grad, or a target that is no tensor: ``loss``.
    The check is a pass-through node in front of ``loss`` (``check_saved``, ~2 us; an
    ``autograd.Function`` cost ~13 us a call), named as PyTorch names the loss's node.

    >>> import kiln
    >>> x, t = kiln.zeros(2, requires_grad=True), kiln.ones(2)
    >>> loss = saves_target(((x - t) ** 2).sum(), t, "mse_loss")
    >>> _ = t.mul_(2)
    >>> try:
    ...     loss.backward()
    ... except RuntimeError as e:
    ...     print(str(e)[:98])
    one of the variables needed for gradient computation has been modified by an inplace operation: it
    """
    if not isinstance(target, kiln.Tensor) or loss.grad_fn is None:
        return loss
    if loss._base is not None:  # check_saved takes new memory: a view of the loss's own result is not
        loss = loss.clone()
    return check_saved(loss, (target,), "".join(part.capitalize() for part in op.split("_")) + "Backward")
