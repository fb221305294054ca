"""``MultiheadAttention``: PyTorch's packed projections, masks (bool or additive) and batch_first layout."""

from __future__ import annotations

import math

import kiln

from .. import functional as F
from .. import init
from ..parameter import Parameter
from .linear import NonDynamicallyQuantizableLinear
from .module import Module

__all__ = ["MultiheadAttention"]


def _as_additive(mask, name: str, dtype):
    """A bool mask (True = masked out) or a float mask (added to the scores) as a float tensor."""
    if mask.dtype == kiln.bool:
        return kiln.zeros(tuple(mask.shape), dtype=dtype, device=mask.device).masked_fill(mask, -math.inf)
    if not mask.dtype.is_floating_point:
        raise AssertionError(f"only bool and floating types of {name} are supported, got {mask.dtype}")
    return mask.to(dtype)


class MultiheadAttention(Module):
    """Multi-head attention with a packed ``in_proj_weight`` (3E, E) / ``in_proj_bias`` (3E) and ``out_proj``."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, device=None, dtype=None) -> None:  # fmt: skip
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} "
                             f"and num_heads={num_heads} instead")  # fmt: skip
        if embed_dim % num_heads != 0:
            raise AssertionError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.head_dim = embed_dim // num_heads
        kw = {"device": device, "dtype": dtype}
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(kiln.empty(3 * embed_dim, embed_dim, **kw))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = Parameter(kiln.empty(embed_dim, embed_dim, **kw))
            self.k_proj_weight = Parameter(kiln.empty(embed_dim, self.kdim, **kw))
            self.v_proj_weight = Parameter(kiln.empty(embed_dim, self.vdim, **kw))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(kiln.empty(3 * embed_dim, **kw))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **kw)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)

    def _project(self, query, key, value):
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            weights = kiln.split(self.in_proj_weight, e, dim=0)
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        biases = (None,) * 3 if self.in_proj_bias is None else kiln.split(self.in_proj_bias, e, dim=0)
        return tuple(F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases, strict=True))

    def _mask(self, key_padding_mask, attn_mask, n: int, tgt: int, src: int, dtype):
        """Merge both masks into one additive (N or 1, H or 1, L, S) float tensor, or None."""
        merged = None
        if attn_mask is not None:
            mask = _as_additive(attn_mask, "attn_mask", dtype)
            if mask.dim() == 2:
                if tuple(mask.shape) != (tgt, src):
                    raise RuntimeError(f"The shape of the 2D attn_mask is {tuple(mask.shape)}, but should be "
                                       f"{(tgt, src)}.")  # fmt: skip
                merged = mask.reshape(1, 1, tgt, src)
            elif mask.dim() == 3:
                if tuple(mask.shape) != (n * self.num_heads, tgt, src):
                    raise RuntimeError(f"The shape of the 3D attn_mask is {tuple(mask.shape)}, but should be "
                                       f"{(n * self.num_heads, tgt, src)}.")  # fmt: skip
                merged = mask.reshape(n, self.num_heads, tgt, src)
            else:
                raise RuntimeError(f"attn_mask's dimension {mask.dim()} is not supported")
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (n, src):
                raise AssertionError(f"expecting key_padding_mask shape of {(n, src)}, but got "
                                     f"{tuple(key_padding_mask.shape)}")  # fmt: skip
            pad = _as_additive(key_padding_mask, "key_padding_mask", dtype).reshape(n, 1, 1, src)
            merged = pad if merged is None else merged + pad
        return merged

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False):  # fmt: skip
        """Returns ``(attn_output, attn_weights)``; weights are None unless ``need_weights``."""
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint.")
        if query.dim() not in (2, 3):
            raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received {query.dim()}-D")
        batched = query.dim() == 3
        if not batched:  # (L, E): a batch of one, masks without their batch dim
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        if query.shape[-1] != self.embed_dim:
            raise AssertionError(f"was expecting embedding dimension of {self.embed_dim}, but got {query.shape[-1]}")
        n, tgt, src, h, d = query.shape[0], query.shape[1], key.shape[1], self.num_heads, self.head_dim
        q, k, v = self._project(query, key, value)
        q = q.reshape(n, tgt, h, d).transpose(1, 2)
        k = k.reshape(n, src, h, d).transpose(1, 2)
        v = v.reshape(n, src, h, d).transpose(1, 2)
        scores = kiln.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        mask = self._mask(key_padding_mask, attn_mask, n, tgt, src, scores.dtype)
        if mask is not None:
            scores = scores + mask
        weights = kiln.softmax(scores, dim=-1)
        if self.dropout > 0.0 and self.training:
            weights = F.dropout(weights, self.dropout)
        out = kiln.matmul(weights, v).transpose(1, 2).reshape(n, tgt, self.embed_dim)
        out = self.out_proj(out)
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(dim=1)
        return out, (weights if batched else weights.squeeze(0))
