"""Whole training steps (forward, backward, optimizer step, zero_grad) compiled into one program:
20 steps give the same parameters as eager (float32, rtol 1e-4, atol 1e-6)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.optim as optim

from .helpers import compiled_calls, events, state_of

RTOL, ATOL = 1e-4, 1e-6
STEPS = 20


def _data():
    rng = np.random.default_rng(0)
    xs = [kiln.tensor(rng.standard_normal((16, 6)).astype(np.float32)) for _ in range(STEPS)]
    ys = [kiln.tensor(rng.integers(0, 3, 16)) for _ in range(STEPS)]
    return xs, ys


def _model(kind: str):
    kiln.manual_seed(0)
    if kind == "dropout":
        return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    if kind == "batchnorm":
        # No bias before BatchNorm (it cancels out): its true gradient is 0, and Adam would turn the
        # rounding noise of that 0 (which differs with the kernels' summation order) into updates.
        return nn.Sequential(nn.Linear(6, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


OPTIMIZERS = {
    "sgd_momentum": lambda p: optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd_nesterov_wd": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "adam": lambda p: optim.Adam(p, lr=1e-2),
    "adamw": lambda p: optim.AdamW(p, lr=1e-2, weight_decay=0.1),
}


def _make_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _train(model_kind: str, opt_name: str, compiled: bool, sched=None, seed_each_step=True):
    model = _model(model_kind)
    opt = OPTIMIZERS[opt_name](model.parameters())
    scheduler = sched(opt) if sched is not None else None
    step = _make_step(model, opt)
    f = kiln.compile(step) if compiled else step
    xs, ys = _data()
    losses = []
    for i in range(STEPS):
        if seed_each_step:
            kiln.manual_seed(1000 + i)
        losses.append(f(xs[i], ys[i]).numpy().copy())
        if scheduler is not None:
            scheduler.step()
    return model, opt, f, losses


def _compare(kind, opt_name, sched=None):
    m_c, opt_c, f, loss_c = _train(kind, opt_name, True, sched)
    m_e, opt_e, _, loss_e = _train(kind, opt_name, False, sched)
    np.testing.assert_allclose(np.array(loss_c), np.array(loss_e), rtol=RTOL, atol=ATOL)
    for (name, a), (_, b) in zip(m_c.state_dict().items(), m_e.state_dict().items(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL, atol=ATOL, err_msg=name)
    for pa, pb in zip(m_c.parameters(), m_e.parameters(), strict=True):
        for key, va in opt_c.state[pa].items():
            vb = opt_e.state[pb][key]
            if isinstance(va, kiln.Tensor):
                np.testing.assert_allclose(va.numpy(), vb.numpy(), rtol=RTOL, atol=ATOL, err_msg=key)
            else:
                assert va == vb, key
    return f, m_c, opt_c


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_training_step_equals_eager(opt_name):
    f, _, _ = _compare("plain", opt_name)
    specs = f.state.specializations
    assert 1 <= len(specs) <= 2 and sum(compiled_calls(f)) >= STEPS - 4
    assert not events(f, "break")


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_training_step_with_dropout_equals_eager(opt_name):
    f, _, _ = _compare("dropout", opt_name)
    assert 1 <= len(f.state.specializations) <= 2 and sum(compiled_calls(f)) >= STEPS - 4


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_training_step_with_batchnorm_equals_eager(opt_name):
    f, model, _ = _compare("batchnorm", opt_name)  # running stats are in the state_dict compared there
    assert int(model[1].num_batches_tracked) == STEPS
    assert 1 <= len(f.state.specializations) <= 2 and sum(compiled_calls(f)) >= STEPS - 4


@pytest.mark.parametrize(
    "sched",
    [
        lambda opt: optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
        lambda opt: optim.lr_scheduler.ExponentialLR(opt, gamma=0.9),
    ],
    ids=["StepLR", "ExponentialLR"],
)
@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_scheduler_stepping_between_calls_does_not_recompile(opt_name, sched):
    f, _, opt = _compare("plain", opt_name, sched)
    assert len(f.state.specializations) <= 2, [e.detail for e in f.state.events]
    assert sum(compiled_calls(f)) >= STEPS - 4
    assert opt.param_groups[0]["lr"] < 0.05


def test_first_optimizer_step_is_compiled(monkeypatch):
    """Adam's first step makes its state (kiln.jit.make_state) and compiles, and so does SGD's with
    momentum (a zero buffer, made the same way, updated as at every later step). With dampening
    SGD's first buffer is the gradient itself, a value of the call, so that first step is not cached."""
    for name in ("adam", "sgd_momentum", "sgd_nesterov_wd"):
        _, _, f, _ = _train("plain", name, True)
        assert [e.kind for e in f.state.events] == ["compiled"], name
    monkeypatch.setitem(OPTIMIZERS, "sgd_dampening", lambda p: optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1))
    _, _, f, _ = _train("plain", "sgd_dampening", True)
    kinds = [e.kind for e in f.state.events]
    assert kinds[0] == "not cached" and "compiled" in kinds
    assert "optimizer" in f.state.events[0].detail or "new tensor" in f.state.events[0].detail


def test_compiled_module_in_a_training_loop_with_backward_outside():
    m_c, m_e = _model("dropout"), _model("dropout")
    cm = kiln.compile(m_c)
    opt_c, opt_e = optim.Adam(cm.parameters(), lr=1e-2), optim.Adam(m_e.parameters(), lr=1e-2)
    xs, ys = _data()
    for i in range(10):
        for model, opt in ((cm, opt_c), (m_e, opt_e)):
            kiln.manual_seed(i)
            opt.zero_grad()
            loss = F.cross_entropy(model(xs[i]), ys[i])
            loss.backward()
            opt.step()
    for a, b in zip(m_c.parameters(), m_e.parameters(), strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=RTOL, atol=ATOL)
    specs = state_of(cm).specializations
    assert len(specs) <= 2 and sum(compiled_calls(cm)) >= 8


def test_zero_grad_set_to_none_outside_backward_inside_reuses_the_specialization():
    model, ref = _model("plain"), _model("plain")
    opt_c, opt_e = optim.SGD(model.parameters(), lr=0.1), optim.SGD(ref.parameters(), lr=0.1)

    def fwd_bwd(m, x, y):
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        return loss.detach()

    f = kiln.compile(lambda x, y: fwd_bwd(model, x, y))
    xs, ys = _data()
    for i in range(6):
        opt_c.zero_grad(set_to_none=True)
        opt_e.zero_grad(set_to_none=True)
        f(xs[i], ys[i])
        fwd_bwd(ref, xs[i], ys[i])
        opt_c.step()
        opt_e.step()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 1 and compiled_calls(f) == [5]
