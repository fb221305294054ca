"""The transformer: encoder and decoder layers (post- or pre-norm), their stacks, and ``Transformer``.

Parameter names, their order and initialization follow ``torch.nn``, so a PyTorch state_dict loads by key.
Masks: ``*_mask`` is bool (True = not allowed) or additive float; ``*_key_padding_mask`` is (N, S),
True where a key is padding.
"""

from __future__ import annotations

import copy

import kiln

from .. import functional as F
from .. import init
from .attention import MultiheadAttention
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .normalization import LayerNorm

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
           "TransformerDecoder", "Transformer"]  # fmt: skip

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def _activation(activation):
    if isinstance(activation, str):
        if activation not in _ACTIVATIONS:
            raise RuntimeError(f"activation should be relu/gelu, not {activation}")
        return _ACTIVATIONS[activation]
    return activation


def _generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> kiln.Tensor:
    """(sz, sz) float mask: 0 on and below the diagonal, -inf above (a position sees only its past)."""
    dtype = kiln.float32 if dtype is None else dtype
    return kiln.triu(kiln.full((sz, sz), float("-inf"), dtype=dtype, device=device), diagonal=1)


def _causal_mask_for(x, batch_first: bool) -> kiln.Tensor:
    length = x.shape[1] if (batch_first and x.dim() == 3) else x.shape[0]
    return kiln.ones(length, length, dtype=kiln.bool, device=x.device).triu(1)


class _FeedForwardBlock(Module):
    """Shared by both layers: the two linear maps around the activation, and the residual dropouts."""

    def _init_feed_forward(self, d_model, dim_feedforward, dropout, activation, bias, kw) -> None:
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)

    def _ff_block(self, x, out_dropout):
        return out_dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    @staticmethod
    def _attend(attn, x, memory, mask, key_padding_mask, is_causal: bool):
        return attn(x, memory, memory, attn_mask=mask, key_padding_mask=key_padding_mask, need_weights=False,
                    is_causal=is_causal)[0]  # fmt: skip


class TransformerEncoderLayer(_FeedForwardBlock):
    """Self-attention then a feed-forward block, each with a residual and LayerNorm (post- or pre-norm)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:  # fmt: skip
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **kw)
        self._init_feed_forward(d_model, dim_feedforward, dropout, activation, bias, kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal: bool):
        return self.dropout1(self._attend(self.self_attn, x, x, attn_mask, key_padding_mask, is_causal))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        if is_causal and src_mask is None:
            src_mask = _causal_mask_for(src, self.self_attn.batch_first)
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x), self.dropout2)
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x, self.dropout2))


class TransformerDecoderLayer(_FeedForwardBlock):
    """Self-attention, attention over the encoder's memory, then a feed-forward block (post- or pre-norm)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:  # fmt: skip
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **kw)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                                 **kw)  # fmt: skip
        self._init_feed_forward(d_model, dim_feedforward, dropout, activation, bias, kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False, memory_is_causal: bool = False):  # fmt: skip
        if tgt_is_causal and tgt_mask is None:
            tgt_mask = _causal_mask_for(tgt, self.self_attn.batch_first)
        x = tgt

        def self_block(y):
            return self.dropout1(self._attend(self.self_attn, y, y, tgt_mask, tgt_key_padding_mask, tgt_is_causal))

        def memory_block(y):
            out = self._attend(self.multihead_attn, y, memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            return self.dropout2(out)

        if self.norm_first:
            x = x + self_block(self.norm1(x))
            x = x + memory_block(self.norm2(x))
            return x + self._ff_block(self.norm3(x), self.dropout3)
        x = self.norm1(x + self_block(x))
        x = self.norm2(x + memory_block(x))
        return self.norm3(x + self._ff_block(x, self.dropout3))


def _clones(module: Module, n: int) -> ModuleList:
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` (deep copies: independent weights), then ``norm`` if given."""

    def __init__(self, encoder_layer, num_layers: int, norm=None, enable_nested_tensor: bool = True,
                 mask_check: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm
        # PyTorch's nested-tensor fast path is an eval-time optimization; kiln always runs the plain path.
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=mask, is_causal=bool(is_causal), src_key_padding_mask=src_key_padding_mask)
        return output if self.norm is None else self.norm(output)


class TransformerDecoder(Module):
    """``num_layers`` copies of ``decoder_layer``, then ``norm`` if given."""

    def __init__(self, decoder_layer, num_layers: int, norm=None) -> None:
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal: bool = False):  # fmt: skip
        output = tgt
        for layer in self.layers:
            output = layer(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                           tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                           tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)  # fmt: skip
        return output if self.norm is None else self.norm(output)


class Transformer(Module):
    """Encoder-decoder transformer ("Attention Is All You Need"), PyTorch's layout and defaults.

    >>> model = Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16)
    >>> model(kiln.zeros(5, 2, 8), kiln.zeros(3, 2, 8)).shape
    kiln.Size([3, 2, 8])
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:  # fmt: skip
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        layer_args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
                      bias)  # fmt: skip
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
            self.encoder = TransformerEncoder(TransformerEncoderLayer(*layer_args, **kw), num_encoder_layers, norm)
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
            self.decoder = TransformerDecoder(TransformerDecoderLayer(*layer_args, **kw), num_decoder_layers, norm)
        self._reset_parameters()
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def _reset_parameters(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal: bool = False):  # fmt: skip
        batched = src.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        if batched and src.shape[batch_dim] != tgt.shape[batch_dim]:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)  # fmt: skip

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> kiln.Tensor:
        """(sz, sz) float mask: 0 on and below the diagonal, -inf above."""
        return _generate_square_subsequent_mask(sz, device, dtype)
