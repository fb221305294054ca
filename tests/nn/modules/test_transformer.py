"""MultiheadAttention, the transformer layers, their stacks and Transformer against PyTorch (same weights,
masks, gradients)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from tests.conftest import assert_close, to_torch
from tests.nn.modules.helpers import leaf_pair, module_pair

RTOL, ATOL = 1e-4, 1e-5


def _mask(torch, array):
    return kiln.from_numpy(array.copy()), torch.from_numpy(array.copy())


def _check_grads(torch, kouts, touts, kins, tins, kmod, tmod, seed=3):
    rng = np.random.default_rng(seed)
    gs = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in touts]
    sum((k * kiln.from_numpy(g.copy())).sum() for k, g in zip(kouts, gs, strict=True)).backward()
    sum((t * to_torch(torch, g)).sum() for t, g in zip(touts, gs, strict=True)).backward()
    for a, b in zip(kins, tins, strict=True):
        assert_close(a.grad, b.grad, rtol=RTOL, atol=ATOL)
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=RTOL, atol=ATOL)


MHA_CASES = [
    dict(batch_first=False, masks=None, average=True),
    dict(batch_first=True, masks="bool", average=False),
    dict(batch_first=False, masks="float", average=True),
    dict(batch_first=True, masks="3d", average=True),
]


@pytest.mark.parametrize("case", MHA_CASES, ids=lambda c: f"{c['batch_first']}-{c['masks']}-{c['average']}")
def test_mha_matches_torch(torch, case):
    e, h, n, tgt, src = 8, 2, 3, 4, 5
    tmod, kmod = module_pair(torch, "MultiheadAttention", e, h, batch_first=case["batch_first"])
    rng = np.random.default_rng(0)
    shape = (lambda length: (n, length, e)) if case["batch_first"] else (lambda length: (length, n, e))
    pairs = [leaf_pair(torch, rng.standard_normal(shape(length)).astype(np.float32)) for length in (tgt, src, src)]
    kw_k, kw_t = {}, {}
    if case["masks"] == "bool":
        pad = np.zeros((n, src), dtype=bool)
        pad[0, -2:] = True
        pad[2, 0] = True
        attn = np.triu(np.ones((tgt, src), dtype=bool), 2)
        (kw_k["key_padding_mask"], kw_t["key_padding_mask"]) = _mask(torch, pad)
        (kw_k["attn_mask"], kw_t["attn_mask"]) = _mask(torch, attn)
    elif case["masks"] == "float":
        (kw_k["attn_mask"], kw_t["attn_mask"]) = _mask(torch, rng.standard_normal((tgt, src)).astype(np.float32))
        pad = np.where(rng.random((n, src)) < 0.3, -1e4, 0.0).astype(np.float32)
        (kw_k["key_padding_mask"], kw_t["key_padding_mask"]) = _mask(torch, pad)
    elif case["masks"] == "3d":
        attn = rng.random((n * h, tgt, src)) < 0.3
        attn[..., 0] = False  # every query keeps at least one key
        (kw_k["attn_mask"], kw_t["attn_mask"]) = _mask(torch, attn)
    kout, kw = kmod(*(p[0] for p in pairs), average_attn_weights=case["average"], **kw_k)
    tout, tw = tmod(*(p[1] for p in pairs), average_attn_weights=case["average"], **kw_t)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    assert tuple(kw.shape) == ((n, tgt, src) if case["average"] else (n, h, tgt, src))
    assert_close(kw, tw, rtol=RTOL, atol=ATOL)
    _check_grads(torch, [kout, kw], [tout, tw], [p[0] for p in pairs], [p[1] for p in pairs], kmod, tmod)


def test_mha_unbatched_and_no_weights(torch):
    tmod, kmod = module_pair(torch, "MultiheadAttention", 6, 3)
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    kx, tx = kiln.from_numpy(x.copy()), to_torch(torch, x)
    kout, kw = kmod(kx, kx, kx)
    tout, tw = tmod(tx, tx, tx)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    assert_close(kw, tw, rtol=RTOL, atol=ATOL)
    assert kmod(kx, kx, kx, need_weights=False)[1] is None


def test_mha_hand_computed_uniform_attention():
    # Equal keys give uniform weights, so the output is out_proj(mean of v) whatever the query.
    m = nn.MultiheadAttention(4, 2, bias=False)
    with kiln.no_grad():
        m.in_proj_weight.copy_(kiln.cat([kiln.zeros(8, 4), kiln.eye(4)], dim=0))
        m.out_proj.weight.copy_(kiln.eye(4))
    q = kiln.randn(3, 1, 4)
    kv = kiln.ones(5, 1, 4)
    out, w = m(q, kv, kv)
    assert_close(w, np.full((1, 3, 5), 0.2, dtype=np.float32), rtol=1e-6, atol=1e-7)
    assert_close(out, np.ones((3, 1, 4), dtype=np.float32), rtol=1e-6, atol=1e-6)


def test_mha_errors():
    m = nn.MultiheadAttention(4, 2)
    x = kiln.randn(3, 2, 4)
    with pytest.raises(RuntimeError, match=r"2D attn_mask is \(2, 2\), but should be \(3, 3\)"):
        m(x, x, x, attn_mask=kiln.zeros(2, 2))
    with pytest.raises(AssertionError, match=r"key_padding_mask shape of \(2, 3\), but got \(3, 2\)"):
        m(x, x, x, key_padding_mask=kiln.zeros(3, 2, dtype=kiln.bool))
    with pytest.raises(AssertionError, match="divisible"):
        nn.MultiheadAttention(5, 2)
    with pytest.raises(AssertionError, match="embedding dimension of 4, but got 3"):
        m(kiln.randn(3, 2, 3), x, x)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize(("activation", "batch_first"), [("relu", False), ("gelu", True)])
def test_encoder_layer_matches_torch(torch, norm_first, activation, batch_first):
    kwargs = dict(dim_feedforward=16, activation=activation, batch_first=batch_first, norm_first=norm_first,
                  layer_norm_eps=1e-6)  # fmt: skip
    tmod, kmod = module_pair(torch, "TransformerEncoderLayer", 8, 2, **kwargs)
    tmod.eval()
    kmod.eval()
    rng = np.random.default_rng(2)
    n, length = 3, 5
    kx, tx = leaf_pair(torch, rng.standard_normal((n, length, 8) if batch_first else (length, n, 8)).astype(np.float32))
    pad = np.zeros((n, length), dtype=bool)
    pad[1, -2:] = True
    kpad, tpad = _mask(torch, pad)
    causal = np.triu(np.ones((length, length), dtype=bool), 1)
    kc, tc = _mask(torch, causal)
    kout = kmod(kx, src_mask=kc, src_key_padding_mask=kpad, is_causal=True)
    tout = tmod(tx, src_mask=tc, src_key_padding_mask=tpad, is_causal=True)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    _check_grads(torch, [kout], [tout], [kx], [tx], kmod, tmod)
    # is_causal alone builds the causal mask itself.
    assert_close(kmod(kx, is_causal=True), kmod(kx, src_mask=kc), rtol=1e-6, atol=1e-6)


def test_encoder_layer_dropout_active_only_in_training():
    m = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.5)
    x = kiln.randn(4, 2, 8)
    m.eval()
    assert_close(m(x), m(x), rtol=0, atol=0)
    m.train()
    assert not np.allclose(m(x).detach().numpy(), m(x).detach().numpy())
    with pytest.raises(RuntimeError, match="relu/gelu, not tanh"):
        nn.TransformerEncoderLayer(8, 2, activation="tanh")


def _seq(torch, rng, length, n, e, batch_first):
    return leaf_pair(torch, rng.standard_normal((n, length, e) if batch_first else (length, n, e)).astype(np.float32))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize(("activation", "batch_first"), [("relu", False), ("gelu", True), ("callable", False)])
def test_decoder_layer_matches_torch(torch, norm_first, activation, batch_first):
    kw = dict(dim_feedforward=16, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    tmod = torch.nn.TransformerDecoderLayer(8, 2, activation=torch.tanh if activation == "callable" else activation,
                                            **kw)  # fmt: skip
    kmod = nn.TransformerDecoderLayer(8, 2, activation=kiln.tanh if activation == "callable" else activation, **kw)
    from tests.nn.modules.helpers import copy_from_torch

    copy_from_torch(torch, tmod, kmod)
    rng = np.random.default_rng(5)
    n, tgt_len, src_len = 3, 4, 6
    kt, tt = _seq(torch, rng, tgt_len, n, 8, batch_first)
    km, tm = _seq(torch, rng, src_len, n, 8, batch_first)
    causal = nn.Transformer.generate_square_subsequent_mask(tgt_len)
    tcausal = torch.nn.Transformer.generate_square_subsequent_mask(tgt_len)
    assert_close(causal, tcausal, rtol=0, atol=0)
    pad = np.zeros((n, src_len), dtype=bool)
    pad[0, -3:] = True
    kpad, tpad = _mask(torch, pad)
    tgt_pad = np.zeros((n, tgt_len), dtype=bool)
    tgt_pad[2, -1] = True
    ktp, ttp = _mask(torch, tgt_pad)
    kout = kmod(kt, km, tgt_mask=causal, memory_key_padding_mask=kpad, tgt_key_padding_mask=ktp, tgt_is_causal=True)
    tout = tmod(tt, tm, tgt_mask=tcausal, memory_key_padding_mask=tpad, tgt_key_padding_mask=ttp, tgt_is_causal=True)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    _check_grads(torch, [kout], [tout], [kt, km], [tt, tm], kmod, tmod)


@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_and_decoder_stacks_match_torch(torch, batch_first):
    kw = dict(dim_feedforward=16, dropout=0.0, batch_first=batch_first)
    t_enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, **kw), 2, torch.nn.LayerNorm(8))
    k_enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, **kw), 2, nn.LayerNorm(8))
    t_dec = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(8, 2, **kw), 3)
    k_dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, **kw), 3)
    from tests.nn.modules.helpers import copy_from_torch

    copy_from_torch(torch, t_enc, k_enc)
    copy_from_torch(torch, t_dec, k_dec)
    # deep copies: the stacked layers do not share weights
    assert k_enc.layers[0].linear1.weight is not k_enc.layers[1].linear1.weight
    rng = np.random.default_rng(6)
    ks, ts = _seq(torch, rng, 5, 2, 8, batch_first)
    kt, tt = _seq(torch, rng, 4, 2, 8, batch_first)
    kmem, tmem = k_enc(ks), t_enc(ts)
    assert_close(kmem, tmem, rtol=RTOL, atol=ATOL)
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    kout = k_dec(kt, kmem, tgt_mask=mask, tgt_is_causal=True)
    tout = t_dec(tt, tmem, tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(4), tgt_is_causal=True)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    rng2 = np.random.default_rng(7)
    g = rng2.standard_normal(tuple(tout.shape)).astype(np.float32)
    (kout * kiln.from_numpy(g.copy())).sum().backward()
    (tout * to_torch(torch, g)).sum().backward()
    assert_close(ks.grad, ts.grad, rtol=RTOL, atol=ATOL)
    assert_close(kt.grad, tt.grad, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("batch_first", "norm_first"), [(False, False), (True, True)])
def test_transformer_matches_torch(torch, batch_first, norm_first):
    kw = dict(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=16, dropout=0.0,
              batch_first=batch_first, norm_first=norm_first)  # fmt: skip
    tmod, kmod = module_pair(torch, "Transformer", **kw)
    rng = np.random.default_rng(8)
    ks, ts = _seq(torch, rng, 6, 3, 8, batch_first)
    kt, tt = _seq(torch, rng, 5, 3, 8, batch_first)
    pad = np.zeros((3, 6), dtype=bool)
    pad[1, -2:] = True
    kpad, tpad = _mask(torch, pad)
    kmask = kmod.generate_square_subsequent_mask(5)
    tmask = tmod.generate_square_subsequent_mask(5)
    kout = kmod(ks, kt, tgt_mask=kmask, src_key_padding_mask=kpad, memory_key_padding_mask=kpad)
    tout = tmod(ts, tt, tgt_mask=tmask, src_key_padding_mask=tpad, memory_key_padding_mask=tpad)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    _check_grads(torch, [kout], [tout], [ks, kt], [ts, tt], kmod, tmod)


def test_transformer_init_and_errors():
    kiln.manual_seed(0)
    m = nn.Transformer(d_model=16, nhead=4, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32)
    w = m.encoder.layers[0].linear1.weight
    bound = (6 / (16 + 32)) ** 0.5  # xavier_uniform_ on every matrix
    assert w.abs().max().item() <= bound and w.abs().max().item() > 0.8 * bound
    assert m.encoder.norm is not None and m.decoder.norm is not None
    with pytest.raises(RuntimeError, match="batch number of src and tgt must be equal"):
        m(kiln.zeros(5, 2, 16), kiln.zeros(5, 3, 16))
    with pytest.raises(RuntimeError, match="feature number of src and tgt must be equal to d_model"):
        m(kiln.zeros(5, 2, 8), kiln.zeros(5, 2, 8))
    mask = nn.Transformer.generate_square_subsequent_mask(3)
    assert mask.dtype == kiln.float32 and mask.tolist()[0][1] == float("-inf") and mask.tolist()[1][0] == 0.0
