"""Optimizer scenarios: every optimizer of ``kiln.optim`` and every LR scheduler, with each
hyperparameter changed between calls at random times, over a small model's training step.

After each call the parameters, gradients, the optimizer's hyperparameters and state and the
scheduler's attributes are compared (tests/fuzz/stateful.py). ``optimizer`` and ``scheduler``
are also used by the model scenarios (tests/fuzz/models.py).
"""

from __future__ import annotations

import random

from .scenario import Builder, Scenario

BETAS = ((0.9, 0.999), (0.8, 0.99), (0.5, 0.9))
DECAY = (0.0, 0.01, 0.1)
EPS = (1e-8, 1e-6, 1e-3)
BOOL = (False, True)
# name -> hyperparameter -> values it may take (at construction, then between calls); the first
# learning rate is the one a model scenario uses
SPECS: dict[str, dict[str, tuple]] = {
    "SGD": {"lr": (0.05, 0.01, 0.1), "momentum": (0.0, 0.5, 0.9), "dampening": (0.0, 0.1), "weight_decay": DECAY,
            "nesterov": BOOL, "maximize": BOOL},
    "Adam": {"lr": (1e-2, 1e-3, 0.05), "betas": BETAS, "eps": EPS, "weight_decay": DECAY, "amsgrad": BOOL,
             "maximize": BOOL},
    "AdamW": {"lr": (1e-2, 1e-3, 0.05), "betas": BETAS, "eps": EPS, "weight_decay": DECAY, "amsgrad": BOOL,
              "maximize": BOOL},
    "Adamax": {"lr": (1e-2, 2e-3, 0.05), "betas": BETAS, "eps": EPS, "weight_decay": DECAY, "maximize": BOOL},
    "NAdam": {"lr": (1e-2, 2e-3, 0.05), "betas": BETAS, "eps": EPS, "weight_decay": DECAY,
              "momentum_decay": (4e-3, 0.01, 0.1), "decoupled_weight_decay": BOOL, "maximize": BOOL},
    "RAdam": {"lr": (1e-2, 1e-3, 0.05), "betas": BETAS, "eps": EPS, "weight_decay": DECAY,
              "decoupled_weight_decay": BOOL, "maximize": BOOL},
    "RMSprop": {"lr": (1e-2, 1e-3, 0.05), "alpha": (0.99, 0.9, 0.5), "eps": EPS, "weight_decay": DECAY,
                "momentum": (0.0, 0.5, 0.9), "centered": BOOL, "maximize": BOOL},
    "Adagrad": {"lr": (0.05, 0.01, 0.1), "lr_decay": (0.0, 0.01, 0.1), "weight_decay": DECAY,
                "initial_accumulator_value": (0.0, 0.1), "eps": (1e-10, 1e-6, 1e-3), "maximize": BOOL},
    "Adadelta": {"lr": (1.0, 0.5, 0.1), "rho": (0.9, 0.5, 0.99), "eps": (1e-6, 1e-4), "weight_decay": DECAY,
                 "maximize": BOOL},
    "ASGD": {"lr": (0.05, 0.01, 0.1), "lambd": (1e-4, 1e-2), "alpha": (0.75, 0.5), "t0": (1e6, 2.0, 0.0),
             "weight_decay": DECAY, "maximize": BOOL},
    "Rprop": {"lr": (0.01, 0.05), "etas": ((0.5, 1.2), (0.3, 1.5)), "step_sizes": ((1e-6, 50), (1e-3, 0.1)),
              "maximize": BOOL},
    "LBFGS": {"lr": (0.5, 1.0, 0.1), "max_iter": (1, 2, 4), "history_size": (2, 5, 100),
              "tolerance_grad": (1e-7, 1e-3), "tolerance_change": (1e-9, 1e-4), "line_search_fn": (None, "strong_wolfe")},
}  # fmt: skip
# hyperparameters read only when the optimizer is made
AT_CONSTRUCTION = {("Adagrad", "initial_accumulator_value")}
# state made at the first step only where the value then asked for it (PyTorch raises KeyError
# later otherwise): these may change only when the optimizer was made with the value on
NEEDS_STATE = {("Adam", "amsgrad"), ("AdamW", "amsgrad"), ("RMSprop", "centered"), ("RMSprop", "momentum")}
# the signs of gradients decide these updates: rounding next to 0 could flip them in float32
SIGN_BASED = {"Rprop", "LBFGS"}
# name -> the scheduler's constructor (``{opt}`` and ``{lr}`` filled in); CyclicLR and OneCycleLR
# cycle the momentum (or beta1) where the optimizer has one
SCHEDULERS = {
    "StepLR": "lr_scheduler.StepLR({opt}, step_size=2, gamma=0.5)",
    "MultiStepLR": "lr_scheduler.MultiStepLR({opt}, milestones=[1, 3], gamma=0.5)",
    "ExponentialLR": "lr_scheduler.ExponentialLR({opt}, gamma=0.8)",
    "LinearLR": "lr_scheduler.LinearLR({opt}, start_factor=0.5, total_iters=3)",
    "ConstantLR": "lr_scheduler.ConstantLR({opt}, factor=0.5, total_iters=2)",
    "CosineAnnealingLR": "lr_scheduler.CosineAnnealingLR({opt}, T_max=4, eta_min=1e-4)",
    "CosineAnnealingWarmRestarts": "lr_scheduler.CosineAnnealingWarmRestarts({opt}, T_0=2, T_mult=2)",
    "PolynomialLR": "lr_scheduler.PolynomialLR({opt}, total_iters=4, power=2.0)",
    "LambdaLR": "lr_scheduler.LambdaLR({opt}, lambda epoch: 0.9 ** epoch)",
    "MultiplicativeLR": "lr_scheduler.MultiplicativeLR({opt}, lambda epoch: 0.95)",
    "CyclicLR": "lr_scheduler.CyclicLR({opt}, base_lr={lr} / 10, max_lr={lr}, step_size_up=2, cycle_momentum={cycle})",
    "OneCycleLR": "lr_scheduler.OneCycleLR({opt}, max_lr={lr}, total_steps=10, cycle_momentum={cycle})",
    "SequentialLR": "lr_scheduler.SequentialLR({opt}, [lr_scheduler.ConstantLR({opt}, factor=0.5, total_iters=2), "
    "lr_scheduler.ExponentialLR({opt}, gamma=0.9)], milestones=[2])",
    "ChainedScheduler": "lr_scheduler.ChainedScheduler([lr_scheduler.StepLR({opt}, 2, 0.5), "
    "lr_scheduler.ExponentialLR({opt}, gamma=0.9)])",
    "ReduceLROnPlateau": "lr_scheduler.ReduceLROnPlateau({opt}, patience=0, factor=0.5)",
}
# LBFGS's step takes a closure that evaluates the model again (a module-level helper of the program)
#: The ways a step clears its gradients: each must leave what eager leaves (Module.zero_grad with
#: set_to_none=False once replaced .grad behind the trace: compiled gradients then accumulated).
ZERO_GRADS = ("opt.zero_grad()", "opt.zero_grad(set_to_none=False)", "model.zero_grad()",
              "model.zero_grad(set_to_none=False)")  # fmt: skip


def zero_grad_line(r: random.Random) -> str:
    """One of ``ZERO_GRADS``, the optimizer's default most often."""
    return "opt.zero_grad()" if r.random() < 0.5 else r.choice(ZERO_GRADS)


CLOSURE = ["def closure_of(opt, model, x, y, loss_fn):", "    def closure():", "        opt.zero_grad()",
           "        loss = loss_fn(model(x), y)", "        loss.backward()", "        return loss",
           "    return closure"]  # fmt: skip


def optimizer(b: Builder, r: random.Random, name: str, params: str, groups: int, default_values: bool,
              min_eps: float = 0.0) -> dict:  # fmt: skip
    """Add ``opt = <name>(...)`` to the setup; returns the hyperparameters it was made with.
    ``min_eps`` bounds the ``eps`` that divides by the gradients' size (see models.py)."""
    spec = SPECS[name]
    values = {k: v[0] if default_values else r.choice(v) for k, v in spec.items()}
    if "eps" in values:
        values["eps"] = max(values["eps"], min_eps)
    if name == "SGD" and values["nesterov"]:
        values.update(momentum=0.9, dampening=0.0)  # the constructor checks this combination
    args = ", ".join(f"{k}={v!r}" for k, v in values.items())
    if groups == 2:
        b.setup.append(f"params = list({params})")
        lr = r.choice(spec["lr"])
        params = f'[{{"params": params[:1]}}, {{"params": params[1:], "lr": {lr!r}}}]'
    b.setup.append(f"opt = optim.{name}({params}, {args})")
    b.state_names.append("opt")
    return values


def step_line(name: str, model: str, x: str, y: str, loss_fn: str) -> str:
    if name == "LBFGS":
        return f"opt.step(closure_of(opt, {model}, {x}, {y}, {loss_fn}))"
    return "opt.step()"


def changes(b: Builder, r: random.Random, name: str, values: dict, groups: int, count: int) -> None:
    """``count`` hyperparameter changes between calls, each at a random call, to a random group.

    Each is tagged ``hp:<name>``; a momentum switched between zero and non-zero (which decides
    whether the update uses a momentum buffer at all) is tagged ``hp:momentum-zero-switch``."""
    spec = SPECS[name]
    mutable = [k for k in spec if (name, k) not in AT_CONSTRUCTION and ((name, k) not in NEEDS_STATE or values[k])]
    planned = []
    for _ in range(count):
        key = r.choice(mutable)
        value = r.choice([v for v in spec[key] if (name, key) not in NEEDS_STATE or v])
        planned.append((r.randint(1, 5), r.randrange(groups), key, value))
    current = [dict(values) for _ in range(groups)]
    for call, group, key, value in sorted(planned, key=lambda change: change[0]):  # in the order they happen
        switch = key == "momentum" and (value == 0) != (current[group][key] == 0)
        current[group][key] = value
        b.action(call, f"opt.param_groups[{group}][{key!r}] = {value!r}", f"hp:{key}" + "-zero-switch" * switch)


def scheduler(b: Builder, r: random.Random, name: str, values: dict, inside: bool) -> str:
    """Add a random scheduler to the setup and its ``step()`` between calls (or inside ``f`` when
    ``inside``); returns the scheduler's name."""
    kind = r.choice(sorted(SCHEDULERS))
    cycle = name in ("SGD", "RMSprop") and values.get("momentum", 0) > 0 or "betas" in SPECS[name]
    b.setup.append("sched = " + SCHEDULERS[kind].format(opt="opt", lr=values["lr"], cycle=cycle))
    b.state_names.append("sched")
    if kind == "ReduceLROnPlateau":  # steps on the last loss: a value, read between calls
        b.action_line("if last is not None: sched.step(float(last[0]))", f"sched:{kind}")
    elif inside:
        b.stmt("sched.step()", f"sched-in-f:{kind}")
    else:
        b.action_line("if call >= 1: sched.step()", f"sched:{kind}")
    return kind


# Between calls: the optimizer's state replaced, and hooks registered on the parameters (a compiled step
# reads the state as captured tensors and runs the hooks it was traced with: each must be seen)
STATE_CHANGES = [
    ("opt.state.clear()", "state:clear"),
    ("opt.state.pop(model[2].weight)", "state:pop"),
    ("opt.load_state_dict(copy.deepcopy(opt.state_dict()))", "state:load"),
    ("model[0].weight.register_hook(halve)", "hook:grad"),
    ("model[2].bias.register_post_accumulate_grad_hook(double_grad)", "hook:post-accumulate"),
]
HOOKS = ["import copy", "def halve(g):", "    return g * 0.5", "def double_grad(p):", "    p.grad.mul_(2.0)"]


def generate(seed: int) -> Scenario:
    """A small model trained by a random optimizer whose hyperparameters change between calls."""
    r = random.Random(seed)
    b = Builder(seed)
    name = r.choice(sorted(SPECS))
    dtype = "float64" if name in SIGN_BASED or r.random() < 0.5 else "float32"
    n, d, h, k = r.randint(2, 4), r.randint(1, 5), r.randint(2, 6), r.randint(1, 4)
    x = b.float_input((n, d), dtype)
    y = b.float_input((n, k), dtype)
    b.setup += [f"kiln.manual_seed({seed % 1000})",
                f"model = nn.Sequential(nn.Linear({d}, {h}), nn.Tanh(), nn.Linear({h}, {k})).to(kiln.{dtype})"]  # fmt: skip
    b.state_names.append("model")
    groups = 2 if r.random() < 0.3 and name != "LBFGS" else 1  # LBFGS takes one group
    values = optimizer(b, r, name, "model.parameters()", groups, default_values=False)
    weight = None
    if name == "LBFGS":
        b.preamble += CLOSURE
        b.stmt(f"loss = {step_line(name, 'model', x, y, 'F.mse_loss')}", f"step:{name}")
    else:
        # a loss weight passed as a float, another at each call: an input of the program once two
        # traces agree (frontend/jit/scalar_args.py), the loss returned with its graph or detached
        weight = b.argument("float(rng.choice([0.25, 0.5, 1.0, 2.0]))", prefix="w") if r.random() < 0.3 else None
        b.stmt(zero_grad_line(r), "zero_grad")
        if weight is None:
            b.stmt(f"loss = F.mse_loss(model({x}), {y})", "mse_loss")
        else:
            b.stmt(f"loss = F.mse_loss(model({x}), {y}) * {weight}", "mse_loss weighted by a float argument")
        b.stmt("loss.backward()", "backward")
        b.stmt("opt.step()", f"step:{name}")
    changes(b, r, name, values, groups, r.randint(1, 4))
    if r.random() < 0.3:
        line, tag = r.choice(STATE_CHANGES)
        b.preamble += HOOKS
        b.action(r.randint(1, 5), f"({line}) if model[2].weight in opt.state or 'hook' in {tag!r} else None", tag)
    if r.random() < 0.5 and name != "LBFGS":
        scheduler(b, r, name, values, inside=r.random() < 0.2)
    rtol = 1e-8 if dtype == "float64" else 1e-4
    returns = "loss" if name != "LBFGS" and weight is not None and r.random() < 0.5 else "loss.detach()"
    return b.scenario("optim", returns, scale=1.0, rtol=rtol)
