"""Layer parity with PyTorch: same weights (state dict converted key by key) give the same outputs and grads."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from tests.conftest import assert_close, to_torch
from tests.nn.modules.helpers import copy_from_torch

RTOL, ATOL = 1e-4, 1e-5


CASES = [
    ("Linear", (5, 3), {}, [(4, 5)]),
    ("Linear", (5, 3), {"bias": False}, [(2, 7, 5)]),
    ("Bilinear", (3, 4, 2), {}, [(5, 3), (5, 4)]),
    ("Conv1d", (2, 4, 3), {"stride": 2, "padding": 1}, [(2, 2, 9)]),
    ("Conv2d", (2, 4, 3), {"padding": 1, "dilation": 1, "bias": False}, [(2, 2, 6, 6)]),
    ("Conv2d", (4, 6, (3, 2)), {"groups": 2, "stride": (2, 1)}, [(2, 4, 7, 5)]),
    ("MaxPool2d", (2,), {}, [(2, 3, 6, 6)]),
    ("AvgPool2d", (3,), {"stride": 2, "padding": 1}, [(2, 3, 7, 7)]),
    ("AdaptiveAvgPool2d", ((2, 3),), {}, [(2, 3, 7, 8)]),
    ("BatchNorm1d", (4,), {}, [(6, 4)]),
    ("BatchNorm2d", (3,), {"affine": False}, [(4, 3, 5, 5)]),
    ("LayerNorm", ((3, 4),), {}, [(2, 5, 3, 4)]),
    ("GroupNorm", (2, 4), {}, [(3, 4, 5)]),
    ("Flatten", (), {}, [(2, 3, 4)]),
    ("Unflatten", (1, (2, 3)), {}, [(4, 6)]),
    ("Identity", (), {}, [(3,)]),
    ("ReLU", (), {}, [(3, 4)]),
    ("LeakyReLU", (0.2,), {}, [(3, 4)]),
    ("GELU", (), {"approximate": "tanh"}, [(3, 4)]),
    ("GELU", (), {}, [(3, 4)]),
    ("SiLU", (), {}, [(3, 4)]),
    ("Tanh", (), {}, [(3, 4)]),
    ("Sigmoid", (), {}, [(3, 4)]),
    ("Softmax", (1,), {}, [(3, 4)]),
    ("LogSoftmax", (-1,), {}, [(3, 4)]),
    ("Softplus", (2.0, 1.0), {}, [(3, 4)]),
]


@pytest.mark.parametrize(("name", "args", "kwargs", "shapes"), CASES, ids=[c[0] for c in CASES])
def test_layer_matches_torch(torch, name, args, kwargs, shapes):
    tmod = getattr(torch.nn, name)(*args, **kwargs)
    kmod = getattr(nn, name)(*args, **kwargs)
    copy_from_torch(torch, tmod, kmod)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    kx = [kiln.from_numpy(a.copy()).requires_grad_() for a in arrays]
    tx = [to_torch(torch, a).requires_grad_() for a in arrays]
    kout, tout = kmod(*kx), tmod(*tx)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    g = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    kout.backward(kiln.from_numpy(g.copy()))
    tout.backward(to_torch(torch, g))
    for a, b in zip(kx, tx, strict=True):
        assert_close(a.grad, b.grad, rtol=RTOL, atol=ATOL)
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=RTOL, atol=ATOL)
    for key, b in tmod.state_dict().items():  # running stats after one training step
        assert_close(kmod.state_dict()[key], b, rtol=RTOL, atol=ATOL)


def test_embedding_padding_idx(torch):
    tmod, kmod = torch.nn.Embedding(6, 3, padding_idx=1), nn.Embedding(6, 3, padding_idx=1)
    assert kmod.weight[1].abs().sum().item() == 0.0  # the padding row starts at zero
    copy_from_torch(torch, tmod, kmod)
    idx = np.array([[0, 1, 5], [1, 2, 2]])
    kout, tout = kmod(kiln.from_numpy(idx)), tmod(torch.from_numpy(idx))
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    kout.sum().backward()
    tout.sum().backward()
    assert_close(kmod.weight.grad, tmod.weight.grad, rtol=RTOL, atol=ATOL)
    assert kmod.weight.grad[1].abs().sum().item() == 0.0


LOSSES = [
    ("CrossEntropyLoss", {}, "class"),
    ("CrossEntropyLoss", {"reduction": "sum", "label_smoothing": 0.1, "ignore_index": 2}, "class"),
    ("NLLLoss", {"reduction": "none"}, "class"),
    ("MSELoss", {}, "same"),
    ("L1Loss", {"reduction": "sum"}, "same"),
    ("BCELoss", {}, "prob"),
    ("BCEWithLogitsLoss", {"reduction": "none"}, "prob"),
]


@pytest.mark.parametrize(("name", "kwargs", "kind"), LOSSES, ids=[c[0] for c in LOSSES])
def test_loss_matches_torch(torch, name, kwargs, kind):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    if kind == "class":
        target = rng.integers(0, 4, size=5)
    else:
        target = rng.random((5, 4)).astype(np.float32)
    if name == "BCELoss":
        x = 1 / (1 + np.exp(-x))
    kx, tx = kiln.from_numpy(x.copy()).requires_grad_(), to_torch(torch, x).requires_grad_()
    kout = getattr(nn, name)(**kwargs)(kx, kiln.from_numpy(target.copy()))
    tout = getattr(torch.nn, name)(**kwargs)(tx, torch.from_numpy(target.copy()))
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    kout.sum().backward()
    tout.sum().backward()
    assert_close(kx.grad, tx.grad, rtol=RTOL, atol=ATOL)


def test_bce_with_logits_buffers_in_state_dict(torch):
    w = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    kmod = nn.BCEWithLogitsLoss(pos_weight=kiln.from_numpy(w))
    tmod = torch.nn.BCEWithLogitsLoss(pos_weight=torch.from_numpy(w))
    assert list(kmod.state_dict()) == list(tmod.state_dict()) == ["pos_weight"]


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_running_stats_over_steps(torch, momentum):
    tmod = torch.nn.BatchNorm2d(3, momentum=momentum)
    kmod = nn.BatchNorm2d(3, momentum=momentum)
    rng = np.random.default_rng(2)
    for _ in range(4):
        x = (rng.standard_normal((4, 3, 2, 2)) * 3 + 1).astype(np.float32)
        kmod(kiln.from_numpy(x))
        tmod(to_torch(torch, x))
    for key, value in tmod.state_dict().items():
        assert_close(kmod.state_dict()[key], value, rtol=RTOL, atol=ATOL)
    assert kmod.num_batches_tracked.item() == 4 and kmod.num_batches_tracked.dtype == kiln.int64
    kmod.eval()
    tmod.eval()
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    assert_close(kmod(kiln.from_numpy(x)), tmod(to_torch(torch, x)), rtol=RTOL, atol=ATOL)
    assert kmod.num_batches_tracked.item() == 4  # eval does not count batches


def test_batchnorm_rejects_wrong_rank():
    with pytest.raises(ValueError, match="expected 4D input"):
        nn.BatchNorm2d(3)(kiln.zeros(2, 3))


def test_batchnorm_without_running_stats_uses_batch_stats_in_eval(torch):
    kmod = nn.BatchNorm1d(2, track_running_stats=False).eval()
    assert list(kmod.state_dict()) == list(torch.nn.BatchNorm1d(2, track_running_stats=False).state_dict())
    out = kmod(kiln.tensor([[1.0, 2.0], [3.0, 6.0]]))
    assert_close(out, np.array([[-1.0, -1.0], [1.0, 1.0]], dtype=np.float32), rtol=1e-4, atol=1e-4)


def test_dropout_train_and_eval():
    drop = nn.Dropout(0.5)
    x = kiln.ones(1000)
    y = drop(x)
    kept = (y != 0).sum().item()
    assert 400 < kept < 600
    assert set(np.unique(y.numpy()).tolist()) <= {0.0, 2.0}
    drop.eval()
    assert drop(x) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


def test_conv_bad_groups():
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
