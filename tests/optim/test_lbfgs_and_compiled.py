"""LBFGS against torch (with and without the strong-Wolfe line search), and the newer optimizers
compiled into one training step against eager."""

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.optim as optim
from tests.conftest import assert_close

RNG = np.random.default_rng(1)
A = RNG.standard_normal((8, 5)).astype(np.float64)
B = RNG.standard_normal(8).astype(np.float64)
W0 = RNG.standard_normal(5).astype(np.float64)


def _rosenbrock_like(lib, w, a, b):
    # A non-quadratic objective so that the line search and the history both matter.
    r = a @ w - b
    return (r**2).sum() + ((w[1:] - w[:-1] ** 2) ** 2).sum()


def _run(lib, module, steps, **kwargs):
    w = lib.tensor(W0.copy(), requires_grad=True)
    a, b = lib.tensor(A), lib.tensor(B)
    opt = module.LBFGS([w], **kwargs)
    losses = []

    def closure():
        opt.zero_grad()
        loss = _rosenbrock_like(lib, w, a, b)
        loss.backward()
        return loss

    for _ in range(steps):
        losses.append(float(opt.step(closure).detach()))
    return w, losses, opt


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"line_search_fn": "strong_wolfe"},
        {"lr": 0.5, "history_size": 3, "max_iter": 5},
        {"history_size": 2, "max_iter": 7, "line_search_fn": "strong_wolfe"},
    ],
)
def test_lbfgs_matches_torch(torch, kwargs):
    kw, klosses, kopt = _run(kiln, optim, 4, **kwargs)
    tw, tlosses, topt = _run(torch, torch.optim, 4, **kwargs)
    np.testing.assert_allclose(klosses, tlosses, rtol=1e-7, atol=1e-9)
    assert_close(kw, tw, rtol=1e-7, atol=1e-9)
    kstate, tstate = kopt.state[kw], topt.state[tw]
    assert kstate["func_evals"] == tstate["func_evals"] and kstate["n_iter"] == tstate["n_iter"]


def test_lbfgs_solves_least_squares_and_errors():
    w = kiln.tensor(W0.copy(), requires_grad=True)
    a, b = kiln.tensor(A), kiln.tensor(B)
    opt = optim.LBFGS([w], line_search_fn="strong_wolfe", tolerance_grad=1e-12, tolerance_change=1e-14)

    def closure():
        opt.zero_grad()
        loss = ((a @ w - b) ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    np.testing.assert_allclose(w.detach().numpy(), np.linalg.lstsq(A, B, rcond=None)[0], rtol=1e-6, atol=1e-8)
    with pytest.raises(RuntimeError, match="closure"):
        opt.step(None)
    with pytest.raises(RuntimeError, match="strong_wolfe"):
        optim.LBFGS([w], line_search_fn="armijo")
    with pytest.raises(ValueError, match="parameter groups"):
        optim.LBFGS([{"params": [w]}, {"params": [kiln.zeros(2, requires_grad=True)]}])


COMPILED = {
    "adadelta": lambda p: optim.Adadelta(p, lr=0.5, weight_decay=1e-2),
    "adamax": lambda p: optim.Adamax(p, lr=1e-2),
    "nadam": lambda p: optim.NAdam(p, lr=1e-2),
    "radam": lambda p: optim.RAdam(p, lr=1e-2),
    "asgd": lambda p: optim.ASGD(p, lr=1e-2, t0=5),
    "rprop": lambda p: optim.Rprop(p, lr=1e-2),
}


def _train(make_opt, compiled: bool, steps: int = 12):
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = make_opt(model.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    f = kiln.compile(step) if compiled else step
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x = kiln.tensor(rng.standard_normal((16, 6)).astype(np.float32))
        y = kiln.tensor(rng.integers(0, 3, 16))
        losses.append(f(x, y).numpy().copy())
    return model, opt, f, np.array(losses)


@pytest.mark.parametrize("name", list(COMPILED))
def test_compiled_step_equals_eager(name):
    m_c, opt_c, f, loss_c = _train(COMPILED[name], True)
    m_e, opt_e, _, loss_e = _train(COMPILED[name], False)
    np.testing.assert_allclose(loss_c, loss_e, rtol=1e-4, atol=1e-6)
    for (key, a), (_, b) in zip(m_c.state_dict().items(), m_e.state_dict().items(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6, err_msg=key)
    for pa, pb in zip(m_c.parameters(), m_e.parameters(), strict=True):
        for key, va in opt_c.state[pa].items():
            np.testing.assert_allclose(va.numpy(), opt_e.state[pb][key].numpy(), rtol=1e-4, atol=1e-6, err_msg=key)
    # The compiled program ran (not the eager fallback) for most steps.
    assert sum(s.calls for s in f.state.specializations) >= 8
