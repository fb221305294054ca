"""RNN, LSTM, GRU and the cells against PyTorch: same weights give the same outputs, final states and
gradients, for padded and packed batches."""

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
    ("RNN", dict(num_layers=1), (5, 3)),
    ("RNN", dict(num_layers=2, nonlinearity="relu", bidirectional=True), (4, 3)),
    ("RNN", dict(num_layers=2, batch_first=True, bias=False), (3, 5)),
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


def _pair_states(torch, name, rows, batch, rng):
    count = 2 if name == "LSTM" else 1
    return [leaf_pair(torch, rng.standard_normal((rows, batch, 4)).astype(np.float32)) for _ in range(count)]


def _call(mod, x, states, name, side):
    if not states:
        return mod(x)
    if name == "LSTM":
        return mod(x, tuple(s[side] for s in states))
    return mod(x, states[0][side])


@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize(
    ("name", "kwargs"),
    [("LSTM", dict(num_layers=2, bidirectional=True)), ("GRU", dict(batch_first=True)),
     ("RNN", dict(num_layers=2, nonlinearity="relu", bidirectional=True, batch_first=True)), ("LSTM", dict())],
)  # fmt: skip
def test_packed_sequence_matches_torch(torch, name, kwargs, enforce_sorted):
    from kiln.nn.utils import rnn as krnn

    trnn = torch.nn.utils.rnn
    tmod, kmod = module_pair(torch, name, 3, 4, **kwargs)
    rng = np.random.default_rng(2)
    lengths = [5, 4, 4, 2, 1] if enforce_sorted else [2, 5, 1, 4, 4]
    batch_first = kwargs.get("batch_first", False)
    shape = (5, 5, 3)
    kx, tx = leaf_pair(torch, rng.standard_normal(shape).astype(np.float32))
    rows = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    states = _pair_states(torch, name, rows, 5, rng)
    kp = krnn.pack_padded_sequence(kx, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    tp = trnn.pack_padded_sequence(tx, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=enforce_sorted)
    assert_close(kp.data, tp.data, rtol=0, atol=0)
    assert kp.batch_sizes.tolist() == tp.batch_sizes.tolist()
    kout, kh = _call(kmod, kp, states, name, 0)
    tout, th = _call(tmod, tp, states, name, 1)
    assert isinstance(kout, krnn.PackedSequence)
    assert_close(kout.data, tout.data, rtol=RTOL, atol=ATOL)
    kpad, klen = krnn.pad_packed_sequence(kout, batch_first=batch_first, padding_value=-1.0, total_length=6)
    tpad, tlen = trnn.pad_packed_sequence(tout, batch_first=batch_first, padding_value=-1.0, total_length=6)
    assert klen.tolist() == tlen.tolist() and klen.dtype == kiln.int64
    assert_close(kpad, tpad, rtol=RTOL, atol=ATOL)
    kh, th = (list(kh), list(th)) if name == "LSTM" else ([kh], [th])
    for a, b in zip(kh, th, strict=True):
        assert_close(a, b, rtol=RTOL, atol=ATOL)
    gs = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in [tpad, *th]]
    sum((k * kiln.from_numpy(g.copy())).sum() for k, g in zip([kpad, *kh], gs, strict=True)).backward()
    sum((t * to_torch(torch, g)).sum() for t, g in zip([tpad, *th], gs, strict=True)).backward()
    assert_close(kx.grad, tx.grad, rtol=RTOL, atol=ATOL)
    for ks, ts in states:
        assert_close(ks.grad, ts.grad, rtol=RTOL, atol=ATOL)
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=RTOL, atol=ATOL)


def test_pad_and_pack_helpers_match_torch(torch):
    from kiln.nn.utils import rnn as krnn

    trnn = torch.nn.utils.rnn
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((n, 2)).astype(np.float32) for n in (3, 5, 1)]
    ks = [kiln.from_numpy(a.copy()) for a in arrays]
    ts = [to_torch(torch, a) for a in arrays]
    for batch_first in (False, True):
        for side in ("right", "left"):
            kp = krnn.pad_sequence(ks, batch_first=batch_first, padding_value=7.0, padding_side=side)
            tp = trnn.pad_sequence(ts, batch_first=batch_first, padding_value=7.0, padding_side=side)
            assert_close(kp, tp, rtol=0, atol=0)
    kpack, tpack = krnn.pack_sequence(ks, enforce_sorted=False), trnn.pack_sequence(ts, enforce_sorted=False)
    assert_close(kpack.data, tpack.data, rtol=0, atol=0)
    assert kpack.sorted_indices.tolist() == tpack.sorted_indices.tolist()
    assert kpack.unsorted_indices.tolist() == tpack.unsorted_indices.tolist()
    for a, b in zip(krnn.unpack_sequence(kpack), arrays, strict=True):
        assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        krnn.pack_sequence(ks)
    with pytest.raises(ValueError, match="padding_side"):
        krnn.pad_sequence(ks, padding_side="middle")


@pytest.mark.parametrize(
    ("name", "kwargs"), [("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu", "bias": False}), ("LSTMCell", {}),
                         ("GRUCell", {}), ("GRUCell", {"bias": False})]
)  # fmt: skip
@pytest.mark.parametrize("batched", [True, False])
def test_cells_match_torch(torch, name, kwargs, batched):
    tmod, kmod = module_pair(torch, name, 3, 4, **kwargs)
    rng = np.random.default_rng(4)
    lead = (2,) if batched else ()
    kx, tx = leaf_pair(torch, rng.standard_normal((*lead, 3)).astype(np.float32))
    count = 2 if name == "LSTMCell" else 1
    states = [leaf_pair(torch, rng.standard_normal((*lead, 4)).astype(np.float32)) for _ in range(count)]
    for with_state in (False, True):
        if not with_state:
            kout, tout = kmod(kx), tmod(tx)
        elif count == 2:
            kout, tout = kmod(kx, tuple(s[0] for s in states)), tmod(tx, tuple(s[1] for s in states))
        else:
            kout, tout = kmod(kx, states[0][0]), tmod(tx, states[0][1])
        kouts, touts = (list(kout), list(tout)) if count == 2 else ([kout], [tout])
        for a, b in zip(kouts, touts, strict=True):
            assert_close(a, b, rtol=RTOL, atol=ATOL)
    sum(o.sum() * (i + 1) for i, o in enumerate(kouts)).backward()
    sum(o.sum() * (i + 1) for i, o in enumerate(touts)).backward()
    assert_close(kx.grad, tx.grad, rtol=RTOL, atol=ATOL)
    for ks, ts in states:
        assert_close(ks.grad, ts.grad, rtol=RTOL, atol=ATOL)


def test_gradcheck_rnn_and_cells_float64():
    kiln.manual_seed(0)
    rnn = nn.RNN(2, 3, num_layers=2, bidirectional=True, dtype=kiln.float64)
    cell = nn.GRUCell(2, 3, dtype=kiln.float64)
    x = kiln.randn(4, 2, 2, dtype=kiln.float64).requires_grad_()
    assert kiln.autograd.gradcheck(lambda a: rnn(a)[0], (x,))
    assert kiln.autograd.gradcheck(lambda a: cell(a[0]), (x,))


def test_flatten_parameters_and_rnn_errors():
    for m in (nn.LSTM(3, 4), nn.GRU(3, 4), nn.RNN(3, 4)):
        before = [p.detach().clone() for p in m.parameters()]
        assert m.flatten_parameters() is None
        for a, b in zip(m.parameters(), before, strict=True):
            assert_close(a, b, rtol=0, atol=0)
    assert len(nn.LSTM(3, 4, num_layers=2).all_weights) == 2
    with pytest.raises(ValueError, match="Unknown nonlinearity 'sigmoid'"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="Expected input to be 1D or 2D"):
        nn.LSTMCell(3, 4)(kiln.ones(1, 2, 3))
    with pytest.warns(UserWarning, match="non-zero dropout"):
        nn.GRU(3, 4, dropout=0.2)
