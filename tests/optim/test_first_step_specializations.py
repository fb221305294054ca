"""An optimizer's first step (its state made, the first gradients set) costs no second trace.

The trace of a compiled training step's first call makes the optimizer's state; the program it
records must serve the later calls as they are (one specialization, no call run eagerly for
storing new tensors), and give eager's values at every call.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import nn, optim
from kiln.nn import functional as F

OPTIMIZERS = {
    "sgd": lambda p: optim.SGD(p, lr=0.1),
    "sgd_momentum": lambda p: optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd_nesterov": lambda p: optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "adam": lambda p: optim.Adam(p, lr=1e-2),
    "adamw": lambda p: optim.AdamW(p, lr=1e-2),
    "rmsprop": lambda p: optim.RMSprop(p, lr=1e-2),
    "rmsprop_momentum_centered": lambda p: optim.RMSprop(p, lr=1e-2, momentum=0.5, centered=True),
}
CALLS = 3


def _run(make_opt, compiled: bool):
    """``CALLS`` training steps of a small classifier: the losses, the parameters, the optimizer state
    and (compiled) the compiled function."""
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = make_opt(model.parameters())

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    fn = kiln.compile(step) if compiled else step
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(CALLS):
        x = kiln.tensor(rng.standard_normal((8, 6)).astype(np.float32))
        y = kiln.tensor(rng.integers(0, 3, 8))
        losses.append(float(fn(x, y)))
    state = [{k: v.numpy().copy() for k, v in opt.state[p].items()} for p in model.parameters()]
    return np.array(losses), [p.detach().numpy().copy() for p in model.parameters()], state, fn


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_first_calls_trace_serves_the_later_calls(name):
    losses, params, state, fn = _run(OPTIMIZERS[name], compiled=True)
    eager_losses, eager_params, eager_state, _ = _run(OPTIMIZERS[name], compiled=False)
    specializations = fn.state.specializations
    assert len(specializations) == 1, [str(e) for e in fn.state.events]
    assert [e.kind for e in fn.state.events] == ["compiled"], [str(e) for e in fn.state.events]
    assert specializations[0].calls == CALLS - 1, "every call after the traced one ran the compiled program"
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(params, eager_params, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(state, eager_state, strict=True):
        assert got.keys() == want.keys()
        for key in got:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_sgds_first_momentum_buffer_is_the_gradient_as_in_pytorch():
    """The zero buffer the first step starts from ends that step equal to the gradient (PyTorch's
    clone), bit for bit; with dampening, which would scale it, the buffer is the clone itself."""
    for dampening in (0.0, 0.5):
        w = kiln.tensor([1.0, -2.0, 3.0], requires_grad=True)
        opt = optim.SGD([w], lr=0.1, momentum=0.9, dampening=dampening)
        (w * kiln.tensor([0.3, 0.7, -1.1])).sum().backward()
        grad = w.grad.numpy().copy()
        opt.step()
        np.testing.assert_array_equal(opt.state[w]["momentum_buffer"].numpy(), grad)
        np.testing.assert_allclose(w.detach().numpy(), np.array([1.0, -2.0, 3.0], np.float32) - 0.1 * grad, rtol=1e-6)


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "adamw", "rmsprop"])
def test_explain_on_a_fresh_optimizer_reports_one_specialization(name):
    kiln.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = OPTIMIZERS[name](model.parameters())

    def step(x):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    text = str(kiln.explain(step, kiln.ones(3, 4)))
    assert "1 specialization(s)" in text
    assert "not cached" not in text.lower()


def test_a_compiled_module_is_not_traced_again_when_grad_is_first_set():
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    compiled = kiln.compile(model)
    x = kiln.tensor(np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32))
    grads = []
    for _ in range(CALLS):
        compiled(x).sum().backward()
        grads.append(model[0].weight.grad.numpy().copy())
    assert len(compiled._compiled.state.specializations) == 1
    assert [e.kind for e in compiled._compiled.state.events] == ["compiled"]
    for i, grad in enumerate(grads):  # .grad accumulates: call i holds i + 1 times the first
        np.testing.assert_allclose(grad, grads[0] * (i + 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["sgd_momentum", "adam"])
def test_a_compiled_module_trained_by_an_optimizer_outside_is_traced_once(name):
    """The backward and the optimizer run outside the compiled module: the first ``.grad`` and the
    optimizer's state appear after the first call, and no later call traces again."""
    x = kiln.tensor(np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32))
    y = kiln.tensor(np.array([0, 1, 2, 1, 0]))
    losses = {}
    for compiled in (True, False):
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        opt = OPTIMIZERS[name](model.parameters())
        forward = kiln.compile(model) if compiled else model
        losses[compiled] = []
        for _ in range(CALLS):
            loss = F.cross_entropy(forward(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[compiled].append(float(loss))
        if compiled:
            assert len(forward._compiled.state.specializations) == 1
            assert [e.kind for e in forward._compiled.state.events] == ["compiled"]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5, atol=1e-6)
