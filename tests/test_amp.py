"""Mixed precision: autocast regions (dtypes and values against torch.autocast on the CPU) and GradScaler
(against torch.amp.GradScaler("cpu"), with inf/nan steps skipped)."""

import math
import threading
import warnings

import numpy as np
import pytest

pytest.importorskip("ml_dtypes")

import kiln  # noqa: E402
import kiln.nn.functional as F  # noqa: E402

BF_TOL = {"rtol": 2e-2, "atol": 2e-2}  # a few bfloat16 ulps, after several layers


def _forward(lib, functional, params, x, target):
    """A small network written once for both libraries; every intermediate is returned."""
    w1, b1, g, beta, w2, b2, k, kb = params
    out = {}
    out["conv"] = functional.conv2d(x, k, kb, padding=1)
    out["relu"] = out["conv"].relu()
    flat = out["relu"].reshape(x.shape[0], -1)
    out["linear1"] = functional.linear(flat, w1, b1)
    out["layer_norm"] = functional.layer_norm(out["linear1"], (w1.shape[0],), g, beta)
    out["gelu"] = functional.gelu(out["layer_norm"])
    out["linear2"] = functional.linear(out["gelu"], w2, b2)
    out["matmul"] = out["gelu"] @ w2.T
    out["softmax"] = out["linear2"].softmax(-1)
    out["sum"] = out["linear2"].sum()
    out["cross_entropy"] = functional.cross_entropy(out["linear2"], target)
    out["mse"] = functional.mse_loss(out["softmax"], lib.zeros_like(out["softmax"]))
    out["mixed_add"] = out["linear2"] + b2  # bfloat16 + float32 -> float32
    return out


def _params(rng):
    shapes = [(16, 3 * 4 * 4), (16,), (16,), (16,), (5, 16), (5,), (3, 2, 3, 3), (3,)]
    return [rng.standard_normal(s).astype(np.float32) * 0.5 for s in shapes]


def test_a_forward_under_autocast_matches_torchs_dtypes_and_values(torch):
    rng = np.random.default_rng(0)
    arrays = _params(rng)
    x = rng.standard_normal((4, 2, 4, 4)).astype(np.float32)
    target = np.array([0, 3, 1, 4])
    ours_params = [kiln.from_numpy(a.copy()).requires_grad_() for a in arrays]
    theirs_params = [torch.from_numpy(a.copy()).requires_grad_() for a in arrays]
    with kiln.autocast(device_type="cpu", dtype=kiln.bfloat16):
        ours = _forward(kiln, F, ours_params, kiln.from_numpy(x), kiln.from_numpy(target))
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        theirs = _forward(torch, torch.nn.functional, theirs_params, torch.from_numpy(x), torch.from_numpy(target))
    for name in theirs:
        assert str(ours[name].dtype).removeprefix("kiln.") == str(theirs[name].dtype).removeprefix("torch."), name
        np.testing.assert_allclose(ours[name].detach().float().numpy(), theirs[name].detach().float().numpy(),
                                   err_msg=name, **BF_TOL)  # fmt: skip
    (ours["cross_entropy"] + ours["mse"]).backward()
    (theirs["cross_entropy"] + theirs["mse"]).backward()
    for p, q in zip(ours_params, theirs_params, strict=True):
        assert p.grad.dtype is kiln.float32  # the casts are differentiable: float32 weights get float32 grads
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=5e-2, atol=5e-3)


def test_regions_nest_decorate_restore_and_stay_in_their_thread():
    layer = kiln.nn.Linear(4, 2)
    x = kiln.randn(3, 4)
    assert not kiln.is_autocast_enabled("cpu")
    with kiln.autocast("cpu"):
        assert kiln.is_autocast_enabled("cpu") and kiln.get_autocast_dtype("cpu") is kiln.bfloat16
        assert layer(x).dtype is kiln.bfloat16
        with kiln.autocast("cpu", enabled=False):
            assert layer(x).dtype is kiln.float32
        with kiln.cpu.amp.autocast(dtype=kiln.float16):
            assert layer(x).dtype is kiln.float16
        seen = []
        other = threading.Thread(target=lambda: seen.append(layer(x).dtype))
        other.start()
        other.join()
        assert seen == [kiln.float32]  # autocast is per thread, as in PyTorch
        assert (x.double() @ x.double().T).dtype is kiln.float64  # float64 is never cast
    assert layer(x).dtype is kiln.float32

    @kiln.autocast(device_type="cpu")
    def run(inputs):
        return layer(inputs)

    assert run(x).dtype is kiln.bfloat16 and layer(x).dtype is kiln.float32
    with pytest.raises(ZeroDivisionError), kiln.amp.autocast("cpu"):
        _ = 1 / 0
    assert not kiln.is_autocast_enabled("cpu")
    with (
        pytest.warns(UserWarning, match="target dtype kiln.float32 is not supported"),
        kiln.autocast("cpu", dtype=kiln.float32),
    ):
        assert not kiln.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="device_type must be one of 'cpu', 'cuda', got 'tpu'"):
        kiln.autocast("tpu")


def test_compiled_functions_guard_on_autocast():
    layer = kiln.nn.Linear(4, 3)
    compiled = kiln.compile(lambda x: F.gelu(layer(x)))
    x = kiln.randn(2, 4)
    for _ in range(2):
        assert compiled(x).dtype is kiln.float32
        with kiln.autocast("cpu"):
            got = compiled(x)
            want = F.gelu(layer(x))
        assert got.dtype is want.dtype is kiln.bfloat16
        np.testing.assert_array_equal(got.detach().float().numpy(), want.detach().float().numpy())
    report = str(kiln.explain(compiled, x))
    assert "autocast changed from off to cpu bfloat16" in report


def test_autocast_switched_on_without_a_region_retraces_and_says_so():
    # set_autocast_enabled alone leaves the CPU's dtype unmade: the key that told the two calls apart
    # read its name from None, and the compiled call raised AttributeError where eager ran
    f = kiln.compile(lambda x: x * 2 + 1, wait=True)
    x = kiln.ones(3)
    try:
        for on in (False, True, False, True):
            kiln.set_autocast_enabled("cpu", on)
            assert f(x).tolist() == [3.0, 3.0, 3.0]
    finally:
        kiln.set_autocast_enabled("cpu", False)
    assert "autocast changed from off to cpu bfloat16" in [e.detail for e in f.state.events][1]
    assert len(f.state.specializations) == 2


def _train(lib, scaler_cls, bad_steps, steps=12):
    """A few SGD steps with loss scaling; the losses of ``bad_steps`` are multiplied by inf or nan."""
    rng = np.random.default_rng(1)
    w = lib.from_numpy(rng.standard_normal((3, 2)).astype(np.float32)).requires_grad_()
    b = lib.from_numpy(np.zeros(2, np.float32)).requires_grad_()
    opt = lib.optim.SGD([w, b], lr=0.05, momentum=0.9)
    scaler = scaler_cls("cpu", init_scale=2.0**10, growth_interval=3)
    x = lib.from_numpy(rng.standard_normal((8, 3)).astype(np.float32))
    history = []
    for step in range(steps):
        opt.zero_grad()
        loss = ((x @ w + b) ** 2).mean()
        if step in bad_steps:
            loss = loss * bad_steps[step]
        scaler.scale(loss).backward()
        if step % 4 == 1:
            scaler.unscale_(opt)  # as before gradient clipping
            assert math.isfinite(float(w.grad.abs().max())) or step in bad_steps
        scaler.step(opt)
        scaler.update()
        history.append((scaler.get_scale(), w.detach().numpy().copy(), scaler.state_dict()))
    return history


def test_grad_scaler_matches_torch_and_skips_inf_and_nan_steps(torch):
    bad = {2: math.inf, 3: math.nan, 9: math.inf}
    ours = _train(kiln, kiln.amp.GradScaler, bad)
    theirs = _train(torch, torch.amp.GradScaler, bad)
    for step, ((s1, w1, d1), (s2, w2, d2)) in enumerate(zip(ours, theirs, strict=True)):
        assert s1 == s2, step
        assert d1 == d2, step
        np.testing.assert_allclose(w1, w2, rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
    assert [s for s, _, _ in ours][:5] == [1024.0, 1024.0, 512.0, 256.0, 256.0]
    assert ours[6][0] == 512.0 and ours[9][0] == 256.0  # three good steps in a row grow it again


def test_grad_scaler_state_and_misuse():
    w = kiln.ones(2, requires_grad=True)
    opt = kiln.optim.SGD([w], lr=0.1)
    scaler = kiln.amp.GradScaler("cpu", init_scale=8.0)
    assert scaler.get_scale() == 8.0 and scaler.is_enabled()
    with pytest.raises(RuntimeError, match="call scale\\(\\) first"):
        scaler.step(opt)
    scaler.scale((w * 2).sum()).backward()
    assert w.grad.tolist() == [16.0, 16.0]
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    assert w.tolist() == [pytest.approx(0.8), pytest.approx(0.8)]
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
        scaler.step(opt, closure=lambda: 0)
    scaler.update(new_scale=4.0)
    assert scaler.get_scale() == 4.0
    other = kiln.amp.GradScaler("cpu")
    other.load_state_dict(scaler.state_dict())
    assert other.state_dict() == scaler.state_dict() == {"scale": 4.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                                         "growth_interval": 2000, "_growth_tracker": 0}  # fmt: skip
    assert kiln.amp.GradScaler("cpu", enabled=False).scale(w) is w
    if not kiln.cuda.is_available():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not kiln.amp.GradScaler().is_enabled()  # "cuda" by default, as in PyTorch
        assert "CUDA is not available. Disabling" in str(caught[0].message)
    assert kiln.cpu.amp.GradScaler(init_scale=2.0).get_scale() == 2.0
