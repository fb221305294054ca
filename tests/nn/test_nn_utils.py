"""kiln.nn.utils against torch.nn.utils: weight_norm, get_total_norm / clip_grads_with_norm_."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from tests.conftest import assert_close, to_torch
from tests.nn.modules.helpers import copy_from_torch


@pytest.mark.parametrize(("module", "args", "dim"), [("Linear", (3, 4), 0), ("Conv2d", (2, 3, 3), 0),
                                                    ("Linear", (3, 4), None), ("Conv1d", (2, 3, 2), 1)])  # fmt: skip
def test_weight_norm_matches_torch(torch, module, args, dim):
    tmod = torch.nn.utils.weight_norm(getattr(torch.nn, module)(*args), dim=dim)
    kmod = nn.utils.weight_norm(getattr(nn, module)(*args), dim=dim)
    copy_from_torch(torch, tmod, kmod)  # weight_g / weight_v by key
    shape = (2, 3) if module == "Linear" else (2, 2, 5, 5) if module == "Conv2d" else (2, 2, 6)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(2):  # the weight is recomputed from g and v on every call
        kx, tx = kiln.from_numpy(x.copy()), to_torch(torch, x)
        kout, tout = kmod(kx), tmod(tx)
        assert_close(kout, tout, rtol=1e-5, atol=1e-6)
        kout.sum().backward()
        tout.sum().backward()
        with kiln.no_grad():
            kmod.weight_g.mul_(1.5)
        with torch.no_grad():
            tmod.weight_g.mul_(1.5)
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=1e-5, atol=1e-6)
    nn.utils.remove_weight_norm(kmod)
    torch.nn.utils.remove_weight_norm(tmod)
    assert sorted(dict(kmod.named_parameters())) == sorted(dict(tmod.named_parameters()))
    assert_close(kmod.weight, tmod.weight, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="weight_norm of 'weight' not found"):
        nn.utils.remove_weight_norm(kmod)


def test_total_norm_and_clip_with_norm_match_torch(torch):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (5,), (2, 2, 2))]
    for norm_type in (2.0, 1.0, float("inf"), 3.0):
        kgrads = [kiln.from_numpy(a.copy()) for a in arrays]
        tgrads = [to_torch(torch, a) for a in arrays]
        ktotal = nn.utils.get_total_norm(kgrads, norm_type)
        assert_close(ktotal, torch.nn.utils.get_total_norm(tgrads, norm_type), rtol=1e-6, atol=1e-6)
        kparams = [nn.Parameter(kiln.zeros(a.shape)) for a in arrays]
        tparams = [torch.nn.Parameter(torch.zeros(a.shape)) for a in arrays]
        for p, g in zip(kparams, kgrads, strict=True):
            p.grad = g
        for p, g in zip(tparams, tgrads, strict=True):
            p.grad = g
        nn.utils.clip_grads_with_norm_(kparams, 0.5, ktotal)
        torch.nn.utils.clip_grads_with_norm_(tparams, 0.5, torch.nn.utils.get_total_norm(tgrads, norm_type))
        for a, b in zip(kparams, tparams, strict=True):
            assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)
    with pytest.warns(FutureWarning):
        nn.utils.clip_grad_norm(kparams, 1.0)


def test_init_dirac_and_sparse(torch):
    for shape, groups in (((4, 2, 3), 1), ((6, 3, 3, 3), 2), ((2, 4, 3, 3, 3), 1)):
        k = nn.init.dirac_(kiln.empty(*shape), groups)
        t = torch.nn.init.dirac_(torch.empty(*shape), groups)
        assert_close(k, t, rtol=0, atol=0)
    # a dirac weight makes the convolution an identity on the kept channels
    conv = nn.Conv2d(3, 3, 3, padding=1, bias=False)
    nn.init.dirac_(conv.weight)
    x = kiln.randn(1, 3, 4, 4)
    assert_close(conv(x), x, rtol=1e-6, atol=1e-6)
    kiln.manual_seed(0)
    w = nn.init.sparse_(kiln.empty(10, 400), 0.3, std=0.5).numpy()
    assert ((w == 0).sum(axis=0) == 3).all()
    assert abs(w[w != 0].std() - 0.5) < 0.03
    with pytest.raises(ValueError, match="2 dimensions"):
        nn.init.sparse_(kiln.empty(3), 0.1)


def test_max_unpool_module():
    x = kiln.rand(1, 2, 4, 4, generator=kiln.Generator().manual_seed(0)) + 0.5  # positive: unpool's zeros never win
    out, idx = nn.MaxPool2d(2, return_indices=True)(x)
    restored = nn.MaxUnpool2d(2)(out, idx)
    assert tuple(restored.shape) == (1, 2, 4, 4)
    assert_close(nn.MaxPool2d(2)(restored), out, rtol=0, atol=0)
    assert (restored.numpy() != 0).sum() == out.numel()


def test_functional_call_matches_torch_and_restores(torch):
    from kiln.nn.utils.stateless import functional_call

    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    kmodel = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    copy_from_torch(torch, tmodel, kmodel)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    kw, tw = kiln.from_numpy(w.copy()).requires_grad_(), to_torch(torch, w).requires_grad_()
    mean = np.arange(4, dtype=np.float32)
    kmodel.eval()
    tmodel.eval()
    kout = functional_call(
        kmodel, ({"0.weight": kw}, {"1.running_mean": kiln.from_numpy(mean.copy())}), (kiln.tensor(x),)
    )
    tout = torch.func.functional_call(tmodel, ({"0.weight": tw}, {"1.running_mean": to_torch(torch, mean)}),
                                      (torch.tensor(x),))  # fmt: skip
    assert_close(kout, tout, rtol=1e-5, atol=1e-6)
    kout.sum().backward()
    tout.sum().backward()
    assert_close(kw.grad, tw.grad, rtol=1e-5, atol=1e-6)
    assert isinstance(kmodel[0].weight, nn.Parameter) and kmodel[0].weight.grad is None  # originals restored
    assert_close(kmodel[1].running_mean, np.zeros(4, dtype=np.float32), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        functional_call(kmodel, {"nope": kw}, (kiln.tensor(x),))
    with pytest.raises(RuntimeError, match="Missing key"):
        functional_call(kmodel, {"0.weight": kw}, (kiln.tensor(x),), strict=True)


def test_parametrize_matches_torch(torch):
    from kiln.nn.utils import parametrize

    class KSymmetric(nn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(0, 1)

    class TSymmetric(torch.nn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(0, 1)

    class KScale(nn.Module):
        def forward(self, x):
            return x * 2

        def right_inverse(self, x):
            return x / 2

    kmod, tmod = nn.Linear(3, 3), torch.nn.Linear(3, 3)
    copy_from_torch(torch, tmod, kmod)
    parametrize.register_parametrization(kmod, "weight", KSymmetric())
    parametrize.register_parametrization(kmod, "weight", KScale())
    torch.nn.utils.parametrize.register_parametrization(tmod, "weight", TSymmetric())
    assert list(kmod.state_dict()) == ["bias", "parametrizations.weight.original"]
    assert parametrize.is_parametrized(kmod) and parametrize.is_parametrized(kmod, "weight")
    assert not parametrize.is_parametrized(kmod, "bias")
    assert parametrize.type_before_parametrizations(kmod) is nn.Linear
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    kx = kiln.from_numpy(x.copy())
    weight = kmod.weight.detach().numpy()
    assert np.allclose(weight, weight.T)  # symmetric, then scaled
    assert_close(kmod.weight, (tmod.weight * 2).detach(), rtol=1e-6, atol=1e-6)
    kmod(kx).sum().backward()
    assert kmod.parametrizations.weight.original.grad is not None
    parametrize.remove_parametrizations(kmod, "weight")
    torch.nn.utils.parametrize.remove_parametrizations(tmod, "weight")
    assert type(kmod) is nn.Linear and list(kmod.state_dict()) == list(tmod.state_dict())
    assert_close(kmod.weight, weight, rtol=0, atol=0)


def test_parametrized_weight_norm_matches_torch(torch):
    from kiln.nn.utils.parametrizations import weight_norm

    tmod = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(2, 3, 3), dim=0)
    kmod = weight_norm(nn.Conv1d(2, 3, 3), dim=0)
    copy_from_torch(torch, tmod, kmod)  # same keys: parametrizations.weight.original0 / original1
    x = np.random.default_rng(4).standard_normal((2, 2, 6)).astype(np.float32)
    kout, tout = kmod(kiln.from_numpy(x.copy())), tmod(to_torch(torch, x))
    assert_close(kout, tout, rtol=1e-5, atol=1e-6)
    kout.sum().backward()
    tout.sum().backward()
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=1e-5, atol=1e-6)
    # assigning the weight goes through right_inverse
    with kiln.no_grad():
        kmod.weight = kiln.ones(3, 2, 3)
    assert_close(kmod.weight, np.ones((3, 2, 3), np.float32), rtol=1e-6, atol=1e-6)


def test_parametrized_copies_are_independent():
    import copy

    from kiln.nn.utils import parametrize
    from kiln.nn.utils.parametrizations import weight_norm

    a = weight_norm(nn.Linear(3, 2))
    b = copy.deepcopy(a)
    assert type(a) is not type(b) and parametrize.is_parametrized(b, "weight")
    parametrize.remove_parametrizations(a, "weight")
    assert type(a) is nn.Linear
    x = kiln.randn(4, 3)
    assert_close(b(x), x @ b.weight.transpose(0, 1) + b.bias, rtol=1e-6, atol=1e-6)  # b keeps its parametrization
    assert sorted(b.state_dict()) == ["bias", "parametrizations.weight.original0", "parametrizations.weight.original1"]


@pytest.mark.parametrize(("conv", "bn", "args", "transpose", "shape"),
                         [("Conv2d", "BatchNorm2d", (2, 3, 3), False, (2, 2, 5, 5)),
                          ("ConvTranspose1d", "BatchNorm1d", (2, 3, 3), True, (2, 2, 5)),
                          ("Linear", "BatchNorm1d", (4, 3), None, (5, 4))])  # fmt: skip
def test_fusion_matches_torch(torch, conv, bn, args, transpose, shape):
    tconv, tbn = getattr(torch.nn, conv)(*args), getattr(torch.nn, bn)(3)
    kconv, kbn = getattr(nn, conv)(*args), getattr(nn, bn)(3)
    with torch.no_grad():
        tbn.running_mean.uniform_(-1, 1)
        tbn.running_var.uniform_(0.5, 2)
        tbn.weight.uniform_(0.5, 2)
        tbn.bias.uniform_(-1, 1)
    copy_from_torch(torch, tconv, kconv)
    copy_from_torch(torch, tbn, kbn)
    for m in (tconv, tbn, kconv, kbn):
        m.eval()
    if conv == "Linear":
        kf, tf = nn.utils.fuse_linear_bn_eval(kconv, kbn), torch.nn.utils.fuse_linear_bn_eval(tconv, tbn)
    else:
        kf = nn.utils.fuse_conv_bn_eval(kconv, kbn, transpose=transpose)
        tf = torch.nn.utils.fuse_conv_bn_eval(tconv, tbn, transpose=transpose)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    kx = kiln.from_numpy(x.copy())
    assert_close(kf(kx), tf(to_torch(torch, x)), rtol=1e-5, atol=1e-5)
    assert_close(kf(kx), kbn(kconv(kx)), rtol=1e-5, atol=1e-5)
    assert kf is not kconv and isinstance(kf.weight, nn.Parameter)
    with pytest.raises(AssertionError, match="eval"):
        nn.utils.fuse_conv_bn_eval(kconv.train(), kbn)


@pytest.mark.parametrize(("module", "args", "shape"), [("Linear", (4, 3), (2, 4)), ("Conv2d", (2, 3, 3), (1, 2, 5, 5)),
                                                       ("ConvTranspose1d", (2, 3, 2), (2, 2, 4))])  # fmt: skip
def test_parametrized_spectral_norm_matches_torch(torch, module, args, shape):
    from kiln.nn.utils.parametrizations import spectral_norm

    torch.manual_seed(0)  # the weights and power-iteration vectors: how far 3 iterations converge depends on them
    tmod = torch.nn.utils.parametrizations.spectral_norm(getattr(torch.nn, module)(*args))
    kmod = spectral_norm(getattr(nn, module)(*args))
    copy_from_torch(torch, tmod, kmod)  # original, and the power-iteration vectors _u and _v
    rng = np.random.default_rng(6)
    for training in (True, True, False):
        tmod.train(training)
        kmod.train(training)
        x = rng.standard_normal(shape).astype(np.float32)
        kout, tout = kmod(kiln.from_numpy(x.copy())), tmod(to_torch(torch, x))
        assert_close(kout, tout, rtol=1e-4, atol=1e-5)
    kout.sum().backward()
    tout.sum().backward()
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=1e-4, atol=1e-5)
    tstate = tmod.state_dict()
    for key, value in kmod.state_dict().items():  # the refined _u, _v too
        assert_close(value, tstate[key], rtol=1e-4, atol=1e-5)
    # the largest singular value of the normalized weight is 1 (after enough iterations)
    w = kmod.weight.detach().numpy()
    matrix = np.moveaxis(w, 1, 0) if module == "ConvTranspose1d" else w
    assert abs(np.linalg.svd(matrix.reshape(matrix.shape[0], -1), compute_uv=False)[0] - 1) < 0.05


@pytest.mark.parametrize(("module", "args", "shape"), [("Linear", (4, 3), (2, 4)), ("Conv2d", (2, 3, 3), (1, 2, 5, 5))])
def test_hook_spectral_norm_matches_torch(torch, module, args, shape):
    tmod = torch.nn.utils.spectral_norm(getattr(torch.nn, module)(*args))
    kmod = nn.utils.spectral_norm(getattr(nn, module)(*args))
    copy_from_torch(torch, tmod, kmod)  # weight_orig, weight_u, weight_v by key
    rng = np.random.default_rng(7)
    for training in (True, True, False):
        tmod.train(training)
        kmod.train(training)
        x = rng.standard_normal(shape).astype(np.float32)
        kout, tout = kmod(kiln.from_numpy(x.copy())), tmod(to_torch(torch, x))
        assert_close(kout, tout, rtol=1e-4, atol=1e-5)
    kout.sum().backward()
    tout.sum().backward()
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=1e-4, atol=1e-5)
    nn.utils.remove_spectral_norm(kmod)
    torch.nn.utils.remove_spectral_norm(tmod)
    assert sorted(kmod.state_dict()) == sorted(tmod.state_dict())
    assert_close(kmod.weight, tmod.weight, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("max_norm", [0.25, 1e6])
def test_clip_grad_norm_eager_2_norm_equals_the_op_path(monkeypatch, dtype, max_norm):
    """The eager 2-norm on the gradients' arrays (one dot and one in-place scale each) gives the op
    path's norm and gradients: contiguous, transposed and empty gradients, clipping or not."""
    from kiln.nn.utils import clip_grad

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((4, 3)).astype(dtype), rng.standard_normal((5, 6)).astype(dtype).T,
              np.zeros((0, 2), dtype), rng.standard_normal(7).astype(dtype)]  # fmt: skip
    runs = []
    fast = clip_grad._clip_2_eager
    monkeypatch.setattr(clip_grad, "_clip_2_eager", lambda *a: runs.append(1) or fast(*a))

    def clipped(eager: bool):
        params = [nn.Parameter(kiln.zeros(*a.shape, dtype=kiln.float64 if dtype == np.float64 else kiln.float32))
                  for a in arrays]  # fmt: skip
        for p, a in zip(params, arrays, strict=True):
            p.grad = kiln.from_numpy(np.array(a, order="C"))  # a copy: the clip scales it in place
        if eager:
            params[1].grad = kiln.from_numpy(arrays[1].T.copy()).T  # a transposed view
        versions = [p.grad._version[0] for p in params]  # (the counter is a shared cell)
        with monkeypatch.context() as m:
            if not eager:
                m.setattr(clip_grad, "_plain", lambda grads: False)
            total = nn.utils.clip_grad_norm_(params, max_norm)
        assert all(p.grad._version[0] > v for p, v in zip(params, versions, strict=True))
        return total, [p.grad.numpy() for p in params]

    total, grads = clipped(eager=True)
    assert runs == [1]
    expected_total, expected = clipped(eager=False)
    assert runs == [1] and total.dtype == expected_total.dtype
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(total.numpy(), expected_total.numpy(), **tol)
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got, want, **tol)
    norm = np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays))
    np.testing.assert_allclose(float(total), norm, rtol=1e-6)
