"""kiln.optim against torch.optim: 20 steps on a least-squares problem, state dicts, errors."""

import numpy as np
import pytest

import kiln
import kiln.optim as optim
from tests.conftest import assert_close

RNG = np.random.default_rng(0)
A = RNG.standard_normal((6, 4)).astype(np.float32)
B = RNG.standard_normal(6).astype(np.float32)
W0 = RNG.standard_normal(4).astype(np.float32)

CONFIGS = [
    ("SGD", {"lr": 0.05}),
    ("SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "maximize": True}),
    ("Adam", {"lr": 0.05}),
    ("Adam", {"lr": 0.05, "betas": (0.8, 0.9), "weight_decay": 0.1, "amsgrad": True}),
    ("Adam", {"lr": 0.05, "eps": 1e-3, "maximize": True}),
    ("AdamW", {"lr": 0.05}),
    ("AdamW", {"lr": 0.05, "weight_decay": 0.5, "amsgrad": True}),
    ("AdamW", {"lr": 0.05, "foreach": False, "fused": None}),
    ("Adam", {"lr": 0.05, "weight_decay": 0.3, "decoupled_weight_decay": True, "foreach": True}),
    ("SGD", {"lr": 0.05, "momentum": 0.5, "foreach": False, "differentiable": False}),
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.9, "eps": 1e-4, "maximize": True}),
    ("Adagrad", {"lr": 0.1}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1, "initial_accumulator_value": 0.5}),
    ("Adagrad", {"lr": 0.1, "eps": 1e-3, "maximize": True}),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1}),
    ("Adadelta", {"maximize": True}),
    ("Adamax", {"lr": 0.05}),
    ("Adamax", {"lr": 0.05, "betas": (0.8, 0.9), "weight_decay": 0.1, "maximize": True}),
    ("NAdam", {"lr": 0.05}),
    ("NAdam", {"lr": 0.05, "momentum_decay": 0.01, "weight_decay": 0.1}),
    ("NAdam", {"lr": 0.05, "weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}),
    ("RAdam", {"lr": 0.05}),
    ("RAdam", {"lr": 0.05, "betas": (0.8, 0.9), "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.05, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("ASGD", {"lr": 0.02}),
    ("ASGD", {"lr": 0.02, "lambd": 0.01, "alpha": 0.5, "t0": 5, "weight_decay": 0.1}),
    ("Rprop", {"lr": 0.05}),
    ("Rprop", {"lr": 0.05, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.2), "maximize": True}),
]


def run_kiln(name, kwargs, steps=20, opt=None, w=None):
    w = kiln.tensor(W0.copy(), requires_grad=True) if w is None else w
    opt = getattr(optim, name)([w], **kwargs) if opt is None else opt
    a, b = kiln.tensor(A), kiln.tensor(B)
    for _ in range(steps):
        opt.zero_grad()
        ((a @ w - b) ** 2).sum().backward()
        opt.step()
    return w, opt


def run_torch(torch, name, kwargs, steps=20):
    w = torch.tensor(W0.copy(), requires_grad=True)
    opt = getattr(torch.optim, name)([w], **kwargs)
    a, b = torch.tensor(A), torch.tensor(B)
    for _ in range(steps):
        opt.zero_grad()
        ((a @ w - b) ** 2).sum().backward()
        opt.step()
    return w


@pytest.mark.parametrize("name,kwargs", CONFIGS)
def test_matches_torch(torch, name, kwargs):
    w, _ = run_kiln(name, kwargs)
    assert_close(w, run_torch(torch, name, kwargs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,kwargs", CONFIGS)
def test_state_dict_round_trip(name, kwargs):
    w_full, _ = run_kiln(name, kwargs, steps=20)
    w, opt = run_kiln(name, kwargs, steps=10)
    state = opt.state_dict()
    assert state["param_groups"][0]["params"] == [0]
    w2 = kiln.tensor(w.detach().numpy().copy(), requires_grad=True)
    fresh = getattr(optim, name)([w2], **{**kwargs, "lr": 123.0})
    fresh.load_state_dict(state)
    run_kiln(name, kwargs, steps=10, opt=opt, w=w)  # the original must not share state with the copy
    run_kiln(name, kwargs, steps=10, opt=fresh, w=w2)
    assert_close(w2, w_full, rtol=1e-6, atol=1e-7)
    assert_close(w, w_full, rtol=1e-6, atol=1e-7)


def test_adam_step_is_float32_tensor_and_lr_read_each_step():
    w, opt = run_kiln("Adam", {"lr": 0.1}, steps=3)
    step = opt.state[w]["step"]
    assert isinstance(step, kiln.Tensor) and step.dtype == kiln.float32 and step.item() == 3.0
    before = w.detach().numpy().copy()
    opt.param_groups[0]["lr"] = 0.0
    run_kiln("Adam", {}, steps=2, opt=opt, w=w)
    np.testing.assert_array_equal(w.detach().numpy(), before)
    lr_tensor = opt._scalars[0]["lr"]
    opt.param_groups[0]["lr"] = 0.25
    run_kiln("Adam", {}, steps=1, opt=opt, w=w)
    assert opt._scalars[0]["lr"] is lr_tensor and lr_tensor.item() == 0.25
    assert not np.array_equal(w.detach().numpy(), before)


def test_sgd_by_hand_and_identity():
    w = kiln.tensor([1.0, -2.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.5, momentum=0.5)
    for _ in range(2):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
    # step 1: g=[2,-4], buf=g, w=[0,0]; step 2: g=0, buf=0.5*buf=[1,-2], w=[-0.5,1]
    assert_close(w, np.array([-0.5, 1.0], np.float32), rtol=0, atol=1e-7)
    assert opt.state[w]["momentum_buffer"] is opt.state_dict()["state"][0]["momentum_buffer"]


def test_closure_and_zero_grad():
    w = kiln.tensor([3.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 9.0
    assert_close(w, np.array([2.4], np.float32), rtol=1e-6, atol=1e-7)
    opt.zero_grad(set_to_none=False)
    assert w.grad is not None and w.grad.item() == 0.0
    opt.zero_grad()
    assert w.grad is None
    opt.step()  # no gradient: nothing changes
    assert_close(w, np.array([2.4], np.float32), rtol=1e-6, atol=1e-7)


def test_param_groups_defaults_and_add_group():
    a, b = kiln.zeros(2, requires_grad=True), kiln.zeros(3, requires_grad=True)
    opt = optim.Adam([{"params": [a]}, {"params": b, "lr": 0.5}], lr=0.1)
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[1]["lr"] == 0.5
    assert opt.param_groups[1]["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    c = kiln.zeros(1, requires_grad=True)
    opt.add_param_group({"params": [c], "eps": 1.0})
    assert opt.param_groups[2]["eps"] == 1.0 and opt.param_groups[2]["lr"] == 0.1


def test_bad_inputs():
    w = kiln.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        optim.SGD([w], lr=-1.0)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        optim.Adam([w], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid epsilon value"):
        optim.RMSprop([w], eps=-1.0)
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        optim.SGD([w], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([w * 2], lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.Adam([])
    with pytest.raises(TypeError, match="iterable of Tensors"):
        optim.Adam(w)
    with pytest.raises(TypeError, match="can only optimize Tensors"):
        optim.Adam([1.0])
    opt = optim.SGD([w], lr=0.1)
    other = optim.SGD([w, kiln.zeros(1, requires_grad=True)], lr=0.1).state_dict()
    with pytest.raises(ValueError, match="doesn't match the size"):
        opt.load_state_dict(other)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})


class _SignStep(optim.Optimizer):
    """An optimizer written as the base asks: only its own math (a step of lr times the sign)."""

    numbers = ("lr", "weight_decay")
    flags = ("maximize", "decoupled_weight_decay")
    zero_skips = ("weight_decay",)

    def __init__(self, params, lr=0.1, weight_decay=0.0, maximize=False, decoupled_weight_decay=False):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, maximize=maximize,
                                      decoupled_weight_decay=decoupled_weight_decay))  # fmt: skip

    def _fresh_state(self, p, group):
        return {"step": optim.optimizer.step_count(p), "last": kiln.zeros_like(p)}

    def _update_group(self, group, scalars):
        for p, grad, state in self._gradients(group, scalars):
            state["last"].copy_(grad)
            p.sub_(grad.sign() * scalars["lr"])


@pytest.mark.parametrize("compiled", [False, True])
def test_the_base_owns_the_start_of_the_per_parameter_loop(compiled):
    # maximize, weight decay (added to the gradient, or decoupled), state made at the first step and
    # its step count, parameters without a gradient skipped: none of it written in _SignStep.
    w, skipped = kiln.tensor([1.0, -2.0], requires_grad=True), kiln.tensor([5.0], requires_grad=True)
    opt = _SignStep([w, skipped], lr=0.5, weight_decay=0.25, maximize=True)

    def step():
        opt.zero_grad()
        (w * kiln.tensor([1.0, 10.0])).sum().backward()
        opt.step()

    f = kiln.compile(step) if compiled else step
    f()  # grad -(1, 10) + 0.25 * (1, -2) = (-0.75, -10.5): w moves by +0.5 each
    assert_close(w, kiln.tensor([1.5, -1.5]), rtol=1e-6, atol=1e-6)
    assert_close(opt.state[w]["last"], kiln.tensor([-0.75, -10.5]), rtol=1e-6, atol=1e-6)
    f()
    assert float(opt.state[w]["step"]) == 2.0 and opt.state[w]["step"].dtype == kiln.float32
    assert skipped not in opt.state and float(skipped[0]) == 5.0
    opt.param_groups[0]["decoupled_weight_decay"] = True
    f()  # w shrinks by 1 - 0.5 * 0.25 first, then moves by +0.5 against the negated gradient's sign
    assert_close(w, kiln.tensor([2.0 * 0.875 + 0.5, -1.0 * 0.875 + 0.5]), rtol=1e-6, atol=1e-6)
    assert_close(opt.state[w]["last"], kiln.tensor([-1.0, -10.0]), rtol=1e-6, atol=1e-6)
