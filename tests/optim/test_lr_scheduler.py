"""kiln.optim.lr_scheduler against torch's: the lr (and momentum) sequence over 40 steps."""

import numpy as np
import pytest

import kiln
import kiln.optim as optim
from kiln.optim import lr_scheduler

SCHEDULERS = [
    ("StepLR", {"step_size": 7, "gamma": 0.5}),
    ("MultiStepLR", {"milestones": [3, 10, 10, 25], "gamma": 0.3}),
    ("ExponentialLR", {"gamma": 0.9}),
    ("CosineAnnealingLR", {"T_max": 12, "eta_min": 0.01}),
    ("LinearLR", {"start_factor": 0.2, "total_iters": 9}),
    ("OneCycleLR", {"max_lr": 1.0, "total_steps": 41}),
    ("OneCycleLR", {"max_lr": 1.0, "total_steps": 41, "anneal_strategy": "linear", "three_phase": True}),
    ("ConstantLR", {"factor": 0.25, "total_iters": 6}),
    ("MultiplicativeLR", {"lr_lambda": lambda e: 0.95}),
    ("PolynomialLR", {"total_iters": 15, "power": 2.0}),
    ("CosineAnnealingWarmRestarts", {"T_0": 5}),
    ("CosineAnnealingWarmRestarts", {"T_0": 3, "T_mult": 2, "eta_min": 0.05}),
    ("CyclicLR", {"base_lr": 0.1, "max_lr": 1.0, "step_size_up": 4}),
    ("CyclicLR", {"base_lr": 0.1, "max_lr": 1.0, "step_size_up": 3, "step_size_down": 5, "mode": "triangular2"}),
    ("CyclicLR", {"base_lr": 0.1, "max_lr": 1.0, "step_size_up": 4, "mode": "exp_range", "gamma": 0.95}),
    (
        "CyclicLR",
        {
            "base_lr": 0.1,
            "max_lr": 1.0,
            "step_size_up": 4,
            "scale_fn": lambda x: 0.5**x,
            "scale_mode": "iterations",
            "cycle_momentum": False,
        },
    ),
]


def lrs(lib, module, name, kwargs, opt_name="SGD", steps=40):
    w = lib.zeros(2, requires_grad=True)
    opt = getattr(module, opt_name)([w], lr=0.5, **({"momentum": 0.9} if opt_name == "SGD" else {}))
    sched = getattr(module.lr_scheduler, name)(opt, **kwargs)
    out = []
    for _ in range(steps):
        opt.step()
        sched.step()
        group = opt.param_groups[0]
        out.append((sched.get_last_lr()[0], group.get("momentum", group.get("betas", (0,))[0])))
    return np.array(out)


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
@pytest.mark.parametrize("name,kwargs", SCHEDULERS)
def test_matches_torch(torch, name, kwargs, opt_name):
    np.testing.assert_allclose(
        lrs(kiln, optim, name, kwargs, opt_name), lrs(torch, torch.optim, name, kwargs, opt_name), rtol=1e-6, atol=0
    )


def test_lambda_and_sequential(torch):
    def build(lib, module):
        w = lib.zeros(2, requires_grad=True)
        opt = module.SGD([w], lr=0.5)
        warm = module.lr_scheduler.LambdaLR(opt, lambda e: (e + 1) / 5)
        cos = module.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
        sched = module.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[5])
        out = [opt.param_groups[0]["lr"]]
        for _ in range(35):
            opt.step()
            sched.step()
            out.append(opt.param_groups[0]["lr"])
        return np.array(out)

    np.testing.assert_allclose(build(kiln, optim), build(torch, torch.optim), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"patience": 2},
        {"mode": "max", "factor": 0.5, "patience": 1, "threshold_mode": "abs", "threshold": 0.1, "cooldown": 2},
        {"patience": 0, "min_lr": 0.01, "eps": 1e-3},
    ],
)
def test_reduce_on_plateau(torch, kwargs):
    metrics = [1.0, 0.9, 0.95, 0.95, 0.96, 0.5, 0.5, 0.5, 0.5, 0.7] * 4

    def run(module):
        param = kiln.zeros(1, requires_grad=True) if module is optim else torch.zeros(1, requires_grad=True)
        opt = module.SGD([param], lr=1.0)
        sched = module.lr_scheduler.ReduceLROnPlateau(opt, **kwargs)
        out = []
        for m in metrics:
            sched.step(m)
            out.append(sched.get_last_lr()[0])
        return np.array(out)

    expected = run(torch.optim)
    assert len(set(expected)) > 1  # the scheduler must actually reduce
    np.testing.assert_allclose(run(optim), expected, rtol=1e-6, atol=0)


def test_state_dict_and_errors():
    w = kiln.zeros(1, requires_grad=True)
    opt = optim.SGD([w], lr=1.0)
    sched = lr_scheduler.StepLR(opt, step_size=2)
    for _ in range(3):
        sched.step()
    state = sched.state_dict()
    opt2 = optim.SGD([kiln.zeros(1, requires_grad=True)], lr=1.0)
    sched2 = lr_scheduler.StepLR(opt2, step_size=5)
    sched2.load_state_dict(state)
    assert sched2.last_epoch == 3 and sched2.step_size == 2
    with pytest.raises(TypeError, match="is not an Optimizer"):
        lr_scheduler.StepLR(object(), step_size=1)
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        lr_scheduler.ReduceLROnPlateau(opt, factor=1.5)
    with pytest.raises(ValueError, match="Tried to step 3 times"):
        one = lr_scheduler.OneCycleLR(optim.SGD([kiln.zeros(1, requires_grad=True)], lr=1.0), max_lr=1.0, total_steps=2)
        for _ in range(3):
            one.step()


def test_chained_and_warm_restarts_with_epochs(torch):
    def build(lib, module):
        w = lib.zeros(2, requires_grad=True)
        opt = module.SGD([w], lr=0.5, momentum=0.9)
        sched = module.lr_scheduler.ChainedScheduler(
            [module.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=3),
             module.lr_scheduler.ExponentialLR(opt, gamma=0.9)]
        )  # fmt: skip
        out = []
        for _ in range(10):
            opt.step()
            sched.step()
            out.append(sched.get_last_lr()[0])
        w2 = lib.zeros(2, requires_grad=True)
        opt2 = module.SGD([w2], lr=0.5)
        warm = module.lr_scheduler.CosineAnnealingWarmRestarts(opt2, T_0=4, T_mult=2)
        for epoch in (0.5, 1.25, 3.0, 4.5, 9.0, 13.75, 2.0):
            opt2.step()
            warm.step(epoch)
            out.append(warm.get_last_lr()[0])
        return np.array(out)

    np.testing.assert_allclose(build(kiln, optim), build(torch, torch.optim), rtol=1e-6, atol=1e-12)


def _composite(kind: str, opt):
    warm = lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=4)
    decay = lr_scheduler.ExponentialLR(opt, gamma=0.8)
    if kind == "SequentialLR":
        return lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[4])
    return lr_scheduler.ChainedScheduler([warm, decay])


@pytest.mark.parametrize("kind", ["SequentialLR", "ChainedScheduler"])
def test_composite_schedulers_resume_from_their_state_dict(kind):
    # One implementation of the state dict of a scheduler of schedulers: each inner state nested.
    assert lr_scheduler.SequentialLR.state_dict is lr_scheduler.ChainedScheduler.state_dict
    assert lr_scheduler.SequentialLR.load_state_dict is lr_scheduler.ChainedScheduler.load_state_dict
    opt = optim.SGD([kiln.zeros(1, requires_grad=True)], lr=1.0)
    sched = _composite(kind, opt)
    for _ in range(5):
        sched.step()
    state = sched.state_dict()
    assert [inner["last_epoch"] for inner in state["_schedulers"]] == [inner.last_epoch for inner in sched._schedulers]
    opt2 = optim.SGD([kiln.zeros(1, requires_grad=True)], lr=1.0)
    resumed = _composite(kind, opt2)
    resumed.load_state_dict(state)
    opt2.param_groups[0]["lr"] = opt.param_groups[0]["lr"]  # the optimizer's own state dict carries it
    lrs, resumed_lrs = [], []
    for _ in range(6):
        sched.step()
        resumed.step()
        lrs.append(opt.param_groups[0]["lr"])
        resumed_lrs.append(opt2.param_groups[0]["lr"])
    np.testing.assert_allclose(resumed_lrs, lrs, rtol=1e-12)
    assert len(set(lrs)) > 3  # the schedule moved after the resume


def test_lr_scheduler_exports_every_scheduler_from_pytorchs_path():
    names = {"LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
             "ExponentialLR", "PolynomialLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
             "OneCycleLR", "SequentialLR", "ChainedScheduler", "ReduceLROnPlateau"}  # fmt: skip
    assert set(lr_scheduler.__all__) == names
    for name in names:
        assert isinstance(getattr(lr_scheduler, name), type), name
        assert name == "LRScheduler" or issubclass(getattr(lr_scheduler, name), lr_scheduler.LRScheduler), name
