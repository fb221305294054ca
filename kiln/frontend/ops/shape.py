"""Shape and view ops: reshape, expand, permute, slicing, cat, and friends.

Exactly PyTorch's view ops return views (sharing memory and the version counter with their
base); ops that PyTorch copies (flip, roll, repeat) copy, even where numpy would view.
"""

from __future__ import annotations

from ...ir.primitives import P
from ...ir.shapes import numel
from ..dispatch import apply
from ..tensor import Tensor, method

__all__ = ["reshape", "view", "expand", "broadcast_to", "sum_to", "contiguous"]


def _shape_arg(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = shape[0]
    return tuple(int(d) for d in shape)


def _infer_minus_one(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    if -1 not in shape:
        return shape
    if shape.count(-1) > 1:
        raise RuntimeError(f"only one dimension can be inferred, got shape {list(shape)}")
    known = numel(d for d in shape if d != -1)
    if known == 0 or size % known:
        raise RuntimeError(f"shape {list(shape)} is invalid for input of size {size}")
    return tuple(size // known if d == -1 else d for d in shape)


def _viewable(x: Tensor, shape: tuple[int, ...]) -> bool:
    if x._data.flags.c_contiguous:
        return True
    probe = x._data.view()
    try:
        probe.shape = shape  # numpy refuses exactly when a copy would be needed
    except AttributeError:
        return False
    return True


@method("reshape")
def reshape(input: Tensor, *shape) -> Tensor:
    """A view when the strides allow it, else a copy (as ``torch.reshape``)."""
    shape = _infer_minus_one(_shape_arg(shape), input._data.size)
    if not _viewable(input, shape):
        input = contiguous(input)
    return apply(P["reshape"], input, shape=shape)


@method("view")
def view(input: Tensor, *shape) -> Tensor:
    """Always a view; an error when the strides do not allow one (as ``torch.Tensor.view``)."""
    shape = _infer_minus_one(_shape_arg(shape), input._data.size)
    if not _viewable(input, shape):
        raise RuntimeError(
            f"view size {list(shape)} is not compatible with input tensor's size {list(input.shape)} and "
            f"stride {list(input.stride())} (at least one dimension spans across two contiguous subspaces). "
            "Use .reshape(...) instead."
        )
    return apply(P["reshape"], input, shape=shape)


@method("expand")
def expand(input: Tensor, *shape) -> Tensor:
    shape = _shape_arg(shape)
    lead = len(shape) - input.ndim
    shape = tuple(input._data.shape[i - lead] if d == -1 and i >= lead else d for i, d in enumerate(shape))
    if shape == input._data.shape:
        return input
    return apply(P["expand"], input, shape=shape)


@method("broadcast_to")
def broadcast_to(input: Tensor, shape) -> Tensor:
    return expand(input, tuple(shape))


def sum_to(input: Tensor, shape) -> Tensor:
    """Sum ``input`` down to ``shape`` (the reverse of broadcasting): the VJP of every broadcast."""
    shape = tuple(shape)
    if tuple(input._data.shape) == shape:
        return input
    lead = input.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and input._data.shape[lead + i] != 1)
    out = apply(P["reduce_sum"], input, axes=axes, keepdim=True)
    return reshape(out, shape)


@method("contiguous")
def contiguous(input: Tensor) -> Tensor:
    if input._data.flags.c_contiguous:
        return input
    from .creation import clone  # noqa: PLC0415

    return clone(input)
