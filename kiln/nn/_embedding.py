"""``embedding``: rows of a table at integer ids, one ``take`` forward and one scatter-add backward.

The lookup is the ``take`` primitive over the ids as they are (any shape); its gradient is
``index_put(zeros, g, ids, accumulate=True)`` (``take``'s VJP), a compiled kernel eagerly once it
is ready. With ``padding_idx`` the lookup is ``_LookupSkippingPadding``: the same take, and the
same scatter with the padding row of the gradient zeroed after it. (A ``where`` choosing detached
rows at the padding positions cost a pass over all the rows forward and over their gradient
backward: 200 us where torch took 58 for 560 ids into (500, 128), forward and backward.)
"""

from __future__ import annotations

import kiln
from kiln.frontend.dispatch import apply
from kiln.ir.primitives import P

from ._utils import check_tensor

__all__ = ["embedding"]


@kiln.jit.composite("embedding")
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type: float = 2.0, scale_grad_by_freq=False,
              sparse: bool = False) -> kiln.Tensor:  # fmt: skip
    """Rows of ``weight`` (num_embeddings, dim) at integer ``input``; the ``padding_idx`` row gets no gradient."""
    check_tensor(input, "input", "embedding")
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding: max_norm, scale_grad_by_freq and sparse are not supported")
    if input.dtype.is_floating_point or input.dtype == kiln.bool:
        raise RuntimeError(f"embedding: expected integer indices (int64 or int32), got {input.dtype}")
    if weight.ndim != 2:
        raise RuntimeError(f"embedding: 'weight' must be 2-D (num_embeddings, dim), got shape {list(weight.shape)}")
    num = weight.shape[0]
    if padding_idx is not None and not -num <= padding_idx < num:
        raise ValueError(f"embedding: padding_idx must be within num_embeddings ({num}), got {padding_idx}")
    # int64 in C order: a compiled gradient scatter walks the ids with one stride (ids.t() would
    # leave the backward on numpy's far slower kernel)
    index = (input if input.dtype is kiln.int64 else input.to(kiln.int64)).contiguous()
    message = f"embedding: index out of range in self (got {{value}}; indices must be in [0, {num - 1}])"
    kiln.jit.check_range(index, 0, num, IndexError, message)
    # The rows by the take primitive itself, over the ids of any shape: index_select would check
    # the index again and move dim 0 to the front and back (views, but an autograd node each),
    # 31 -> 14 us of a GPT's token lookup, (8, 64) ids into (256, 128), forward only; flattening the
    # ids and reshaping the rows back cost two more nodes (forward and backward).
    if padding_idx is None or not (weight.requires_grad and kiln.is_grad_enabled()):
        return apply(P["take"], weight, index)
    return _LookupSkippingPadding.apply(weight, index, padding_idx % num)


class _LookupSkippingPadding(kiln.autograd.Function):
    """``weight[index]``, whose gradient leaves row ``padding_idx`` of ``weight`` at zero."""

    kiln_only = True  # kiln's own code: no user code runs in its forward or backward

    @staticmethod
    def forward(ctx, weight, index, padding_idx: int):
        ctx.save_for_backward(index)
        ctx.table, ctx.padding_idx = (tuple(weight.shape), weight.dtype, weight.device), padding_idx
        return apply(P["take"], weight, index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        shape, dtype, device = ctx.table
        zeros = kiln.zeros((), dtype=dtype, device=device).expand(shape)  # (take's VJP: no table-sized constant)
        grad = apply(P["index_put"], zeros, g, index, accumulate=True)
        grad[ctx.padding_idx] = 0  # (a fresh array: one row written)
        return grad, None, None
