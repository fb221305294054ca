"""kiln.utils: ``utils.data`` is ``kiln.data`` under PyTorch's path, and ``utils.checkpoint`` recomputes
in backward with the same gradients as the plain call."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import kiln
import kiln.data
import kiln.nn as nn
from kiln.utils.checkpoint import checkpoint, checkpoint_sequential
from tests.conftest import assert_close


def test_utils_data_exposes_every_kiln_data_name(monkeypatch):
    import kiln.utils.data as udata

    for name in kiln.data.__all__:
        assert getattr(udata, name) is getattr(kiln.data, name), name
    namespace: dict = {}
    exec("from kiln.utils.data import *", namespace)
    assert set(kiln.data.__all__) <= set(namespace)
    # A name added to kiln.data later is visible through kiln.utils.data too.
    monkeypatch.setattr(kiln.data, "LateSampler", object(), raising=False)
    assert udata.LateSampler is kiln.data.LateSampler
    for sub in ("dataloader", "dataset", "sampler"):
        assert importlib.import_module(f"kiln.utils.data.{sub}") is importlib.import_module(f"kiln.data.{sub}")
    from kiln.utils.data.dataloader import DataLoader

    assert DataLoader is kiln.data.DataLoader
    with pytest.raises(AttributeError):
        udata.NoSuchThing  # noqa: B018


def test_torch_style_data_program():
    from kiln.utils.data import ConcatDataset, DataLoader, Subset, TensorDataset, get_worker_info, random_split

    ds = TensorDataset(kiln.arange(10.0), kiln.arange(10))
    train, val = random_split(ds, [8, 2], generator=kiln.Generator().manual_seed(0))
    both = ConcatDataset([train, Subset(val, [0])])
    seen = sorted(int(y) for _, ys in DataLoader(both, batch_size=3) for y in ys)
    assert len(seen) == 9 and len(set(seen)) == 9
    assert get_worker_info() is None


def _mlp():
    kiln.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.3), nn.Linear(8, 3))


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_gradients_equal_plain_call(use_reentrant):
    model = _mlp()
    x = kiln.tensor(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32), requires_grad=True)
    kiln.manual_seed(7)
    plain = model(x)
    (plain**2).sum().backward()
    ref_x, ref_params = x.grad.clone(), [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    kiln.manual_seed(7)
    out = checkpoint(model, x, use_reentrant=use_reentrant)
    assert_close(out, plain, rtol=0, atol=0)  # same dropout mask
    kiln.manual_seed(123)  # backward recomputes with the forward's random state, not this one
    (out**2).sum().backward()
    assert_close(x.grad, ref_x, rtol=1e-6, atol=1e-7)
    for p, g in zip(model.parameters(), ref_params, strict=True):
        assert_close(p.grad, g, rtol=1e-6, atol=1e-7)


def test_checkpoint_restores_the_callers_random_state():
    model = _mlp()
    x = kiln.randn(3, 4, requires_grad=True)
    out = checkpoint(model, x, use_reentrant=False)
    kiln.manual_seed(5)
    out.sum().backward()
    after = kiln.rand(3)
    kiln.manual_seed(5)
    assert_close(after, kiln.rand(3), rtol=0, atol=0)


def test_checkpoint_float64_gradcheck_multiple_outputs_and_kwargs():
    w = kiln.tensor(np.random.default_rng(1).standard_normal((3, 3)), requires_grad=True)

    def f(a, b, scale=1.0):
        h = kiln.tanh(a @ w) * scale
        return h * b, (h + b).sum(dim=0)

    a = kiln.randn(2, 3, dtype=kiln.float64, requires_grad=True)
    b = kiln.randn(2, 3, dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(lambda p, q: checkpoint(f, p, q, use_reentrant=False, scale=0.5)[0], (a, b))
    assert kiln.autograd.gradcheck(lambda p, q: checkpoint(f, p, q, use_reentrant=True)[1], (a, b))
    w.grad = None  # gradcheck's backward passes reached w too
    out = checkpoint(f, a, b, use_reentrant=False)
    (out[0].sum() + out[1].sum()).backward()
    ga, gw = a.grad.clone(), w.grad.clone()
    a.grad = w.grad = b.grad = None
    out = f(a, b)
    (out[0].sum() + out[1].sum()).backward()
    assert_close(ga, a.grad, rtol=1e-12, atol=1e-12)
    assert_close(gw, w.grad, rtol=1e-12, atol=1e-12)


def test_checkpoint_inputs_without_grad_and_warnings():
    model = _mlp().eval()
    x = kiln.randn(2, 4)
    checkpoint(model, x, use_reentrant=False).sum().backward()
    assert all(p.grad is not None for p in model.parameters())  # non-reentrant: parameters still get gradients
    model.zero_grad()
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = checkpoint(model, x, use_reentrant=True)
    assert not out.requires_grad
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        checkpoint(model, x.requires_grad_())
    with pytest.raises(ValueError, match="Unexpected keyword arguments"):
        checkpoint(lambda t, k=1: t, x, use_reentrant=True, k=2)


def test_checkpoint_sequential_equals_plain():
    model = _mlp().eval()
    x = kiln.randn(3, 4, requires_grad=True)
    model(x).sum().backward()
    ref = x.grad.clone()
    x.grad = None
    checkpoint_sequential(model, 2, x, use_reentrant=False).sum().backward()
    assert_close(x.grad, ref, rtol=1e-6, atol=1e-7)


def test_sdpa_backend_and_kernel_context(torch):
    from kiln.nn.attention import SDPBackend, sdpa_kernel

    theirs = {name: int(m.value) for name, m in torch.nn.attention.SDPBackend.__members__.items()}
    assert {m.name: m.value for m in SDPBackend} == theirs
    q = kiln.randn(2, 3, 4)
    plain = kiln.nn.functional.scaled_dot_product_attention(q, q, q)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        assert_close(kiln.nn.functional.scaled_dot_product_attention(q, q, q), plain, rtol=0, atol=0)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION, set_priority=True):
        pass
    with pytest.raises(AssertionError, match="SDPBackend"):
        with sdpa_kernel("flash"):
            pass
