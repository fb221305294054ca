"""``embedding_bag``: sums, means or maxima of bags of embedding rows, without the (bags, rows, dim) tensor.

Each bag is a row of a 2-d ``input``, or a run of a 1-d ``input`` starting at ``offsets[b]``. A
(bags, positions) membership matrix (weighted by ``per_sample_weights``, zero at ``padding_idx``)
turns the reduction into one matmul; its gradient reaches ``weight`` through the lookup.
"""

from __future__ import annotations

import math

import kiln

from ._utils import check_tensor

__all__ = ["embedding_bag"]


def _membership(input, offsets, include_last_offset: bool):
    """(flat indices (L,), bool membership (B, L))."""
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, as input is treated is a mini-batch of "
                             "fixed length sequences.")  # fmt: skip
        bags, length = input.shape
        flat = input.reshape(-1)
        position = kiln.arange(bags * length, device=input.device).reshape(1, -1)
        start = (kiln.arange(bags, device=input.device) * length).reshape(-1, 1)
        return flat, (position >= start) & (position < start + length)
    if input.ndim != 1:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.ndim}")
    if offsets is None:
        raise ValueError("offsets has to be a 1D Tensor but got None")
    if offsets.ndim != 1:
        raise ValueError("offsets has to be a 1D Tensor")
    offsets = offsets.to(kiln.int64)
    total = kiln.full((1,), input.shape[0], dtype=kiln.int64, device=input.device)
    ends = kiln.cat([offsets[1:], total]) if not include_last_offset else offsets[1:]
    starts = offsets if not include_last_offset else offsets[:-1]
    position = kiln.arange(input.shape[0], device=input.device).reshape(1, -1)
    return input, (position >= starts.reshape(-1, 1)) & (position < ends.reshape(-1, 1))


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type: float = 2, scale_grad_by_freq: bool = False,
                  mode: str = "mean", sparse: bool = False, per_sample_weights=None, include_last_offset: bool = False,
                  padding_idx=None) -> kiln.Tensor:  # fmt: skip
    """Reduce bags of rows of ``weight`` (num_embeddings, dim) with ``mode`` "sum", "mean" or "max"."""
    check_tensor(input, "input", "embedding_bag")
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"mode has to be one of sum, mean or max, got {mode}")
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding_bag: max_norm, scale_grad_by_freq and sparse are not supported")
    if per_sample_weights is not None:
        if mode != "sum":
            raise NotImplementedError(f"embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                      f"supported for mode='sum' (got mode='{mode}'). Please open a feature request "
                                      "on GitHub.")  # fmt: skip
        if tuple(per_sample_weights.shape) != tuple(input.shape):
            raise ValueError(f"embedding_bag: If per_sample_weights ({tuple(per_sample_weights.shape)}) is not None, "
                             f"then it must have the same shape as the input ({tuple(input.shape)})")  # fmt: skip
    flat, member = _membership(input, offsets, include_last_offset)
    num = weight.shape[0]
    index = flat.to(kiln.int64)
    kiln.jit.check_range(index, 0, num, IndexError,
                         f"embedding_bag: index out of range (got {{value}}; indices must be in [0, {num - 1}])")  # fmt: skip
    rows = kiln.index_select(weight, 0, index)
    if padding_idx is not None:
        padding_idx = padding_idx % num
        member = member & (index != padding_idx).reshape(1, -1)
    if mode == "max":
        masked = kiln.where(member.unsqueeze(-1), rows.unsqueeze(0), -math.inf)
        out = masked.amax(dim=1)
        return kiln.where(member.any(dim=1, keepdim=True), out, 0.0)
    mix = member.to(weight.dtype)
    if per_sample_weights is not None:
        mix = mix * per_sample_weights.reshape(1, -1).to(weight.dtype)
    out = kiln.matmul(mix, rows)
    if mode == "mean":
        out = out / kiln.clamp(member.sum(dim=1, keepdim=True).to(weight.dtype), min=1.0)
    return out
