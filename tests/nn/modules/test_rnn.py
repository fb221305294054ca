"""LSTM and GRU parity with PyTorch: same weights give the same outputs, final states and gradients."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from tests.conftest import assert_close, to_torch
from tests.nn.modules.helpers import leaf_pair, module_pair

RTOL, ATOL = 1e-4, 1e-5


CASES = [
    ("LSTM", dict(num_layers=1), (5, 3)),
    ("LSTM", dict(num_layers=2, bidirectional=True), (5, 3)),
    ("LSTM", dict(num_layers=2, batch_first=True, bias=False), (3, 5)),
    ("LSTM", dict(num_layers=3, bidirectional=True, batch_first=True), (2, 4)),
    ("GRU", dict(num_layers=1), (5, 3)),
    ("GRU", dict(num_layers=2, bidirectional=True, batch_first=True), (3, 5)),
    ("GRU", dict(num_layers=2, bias=False), (4, 2)),
]


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize(("name", "kwargs", "lead"), CASES)
def test_rnn_matches_torch(torch, name, kwargs, lead, with_state):
    tmod, kmod = module_pair(torch, name, 3, 4, **kwargs)
    rng = np.random.default_rng(0)
    kx, tx = leaf_pair(torch, rng.standard_normal((*lead, 3)).astype(np.float32))
    batch = lead[0] if kwargs.get("batch_first") else lead[1]
    rows = kwargs["num_layers"] * (2 if kwargs.get("bidirectional") else 1)
    states = []
    if with_state:
        states = [leaf_pair(torch, rng.standard_normal((rows, batch, 4)).astype(np.float32))
                  for _ in range(2 if name == "LSTM" else 1)]  # fmt: skip
    if not states:
        kout, kh = kmod(kx)
        tout, th = tmod(tx)
    elif name == "LSTM":
        kout, kh = kmod(kx, tuple(s[0] for s in states))
        tout, th = tmod(tx, tuple(s[1] for s in states))
    else:
        kout, kh = kmod(kx, states[0][0])
        tout, th = tmod(tx, states[0][1])
    kh, th = (list(kh), list(th)) if name == "LSTM" else ([kh], [th])
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    for a, b in zip(kh, th, strict=True):
        assert_close(a, b, rtol=RTOL, atol=ATOL)
    # One loss over the output and every final state, so all paths carry gradient.
    gs = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in [tout, *th]]
    kloss = sum((k * kiln.from_numpy(g.copy())).sum() for k, g in zip([kout, *kh], gs, strict=True))
    tloss = sum((t * to_torch(torch, g)).sum() for t, g in zip([tout, *th], gs, strict=True))
    kloss.backward()
    tloss.backward()
    assert_close(kx.grad, tx.grad, rtol=RTOL, atol=ATOL)
    for ks, ts in states:
        assert_close(ks.grad, ts.grad, rtol=RTOL, atol=ATOL)
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_unbatched_input(torch, name):
    tmod, kmod = module_pair(torch, name, 3, 4, num_layers=2, bidirectional=True)
    x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    kout, kh = kmod(kiln.from_numpy(x.copy()))
    tout, th = tmod(to_torch(torch, x))
    assert tuple(kout.shape) == (5, 8)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    for a, b in zip(kh if name == "LSTM" else [kh], th if name == "LSTM" else [th], strict=True):
        assert tuple(a.shape) == (4, 4)
        assert_close(a, b, rtol=RTOL, atol=ATOL)


def test_hand_computed_single_step():
    # hidden 1, all weights 0 and biases 0 except weight_ih = 1: c = sigmoid(x)*tanh(x), h = sigmoid(x)*tanh(c).
    m = nn.LSTM(1, 1)
    with kiln.no_grad():
        for p in m.parameters():
            p.zero_()
        m.weight_ih_l0.fill_(1.0)
    out, (h, c) = m(kiln.tensor([[[0.5]]]))
    s, t = 1 / (1 + np.exp(-0.5)), np.tanh(0.5)
    assert_close(c, np.array([[[s * t]]], dtype=np.float32), rtol=1e-6, atol=1e-7)
    assert_close(out, np.array([[[s * np.tanh(s * t)]]], dtype=np.float32), rtol=1e-6, atol=1e-7)


def test_default_init_bounds_and_repr():
    m = nn.GRU(3, 16, num_layers=2, dropout=0.5)
    for p in m.parameters():
        assert p.abs().max().item() <= 0.25
    assert p.abs().max().item() > 0.2  # drawn over the whole range, not left at zero
    assert repr(m) == "GRU(3, 16, num_layers=2, dropout=0.5)"


def test_dropout_between_layers_only_in_training():
    m = nn.LSTM(3, 4, num_layers=2, dropout=0.9)
    x = kiln.randn(6, 2, 3)
    m.eval()
    a, _ = m(x)
    b, _ = m(x)
    assert_close(a, b, rtol=0, atol=0)
    m.train()
    c, _ = m(x)
    assert not np.allclose(c.detach().numpy(), a.detach().numpy())


def test_bad_inputs():
    m = nn.LSTM(3, 4)
    with pytest.raises(RuntimeError, match="Expected 3, got 5"):
        m(kiln.randn(2, 1, 5))
    with pytest.raises(ValueError, match="2D or 3D, got 4D"):
        m(kiln.randn(2, 1, 1, 3))
    with pytest.raises(RuntimeError, match=r"Expected hidden size \(1, 2, 4\), got \(1, 3, 4\)"):
        m(kiln.randn(5, 2, 3), (kiln.zeros(1, 3, 4), kiln.zeros(1, 3, 4)))
    with pytest.raises(ValueError, match="dropout"):
        nn.GRU(3, 4, dropout=1.5)
