"""A compiled training step honours every change to an optimizer's ``param_groups`` (kiln issue 35).

For every optimizer in kiln.optim, a compiled step and the eager step run the same schedule of
changes to the hyperparameters, numbers and flags, at fixed and at random calls; parameters and
state must agree after every call. Numbers are read at each call (a change never retraces), flags
and zero tests are guards (a change traces again); the same schedules run in PyTorch give the
eager reference its meaning, including the KeyError PyTorch raises for state a step never made.
"""

import numpy as np
import pytest

import kiln
import kiln.optim as optim
from tests.conftest import assert_close

RNG = np.random.default_rng(35)
A = RNG.standard_normal((6, 4))
Y = RNG.standard_normal(6)
W0 = RNG.standard_normal(4)
B0 = RNG.standard_normal(6)
CALLS = 10
TIGHT = {"rtol": 1e-9, "atol": 1e-12}  # float64: a stale hyperparameter is off by far more

# (optimizer, constructor arguments, {call: {key: value}}: set in param_groups[0] before that call)
SCHEDULES = [
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.1},
     {2: {"lr": 0.03}, 3: {"dampening": 0.4}, 4: {"weight_decay": 0.0}, 5: {"momentum": 0.5},
      6: {"weight_decay": 0.05}, 7: {"maximize": True}, 8: {"momentum": 0.0}, 9: {"momentum": 0.8}}),
    ("SGD", {"lr": 0.05, "momentum": 0.9}, {3: {"nesterov": True}, 6: {"nesterov": False, "momentum": 0.6}}),
    ("SGD", {"lr": 0.05}, {3: {"momentum": 0.9}, 6: {"dampening": 0.5}}),  # momentum 0 -> not 0: a buffer
    ("SGD", {"lr": 0.05, "momentum": 0.9, "fused": True}, {3: {"fused": False}, 5: {"foreach": True}, 6: {"nesterov": True, "dampening": 0.0}}),
    ("Adam", {"lr": 0.05, "betas": (0.8, 0.9), "eps": 1e-3, "weight_decay": 0.1},
     {2: {"eps": 1e-6}, 3: {"betas": (0.7, 0.95)}, 4: {"weight_decay": 0.0}, 5: {"weight_decay": 0.2},
      6: {"decoupled_weight_decay": True}, 7: {"maximize": True}, 8: {"lr": 0.01}}),
    ("Adam", {"lr": 0.05, "amsgrad": True}, {3: {"amsgrad": False}, 6: {"amsgrad": True, "eps": 0.1}}),
    ("Adam", {"lr": 0.05}, {4: {"amsgrad": True}}),  # KeyError: the state has no max_exp_avg_sq
    ("Adam", {"lr": 0.05, "fused": True}, {3: {"fused": False}, 5: {"foreach": True}, 7: {"amsgrad": True}}),
    ("AdamW", {"lr": 0.05, "foreach": True}, {3: {"foreach": False}, 5: {"fused": True}, 6: {"weight_decay": 0.0}}),
    ("AdamW", {"lr": 0.05, "weight_decay": 0.1},
     {2: {"weight_decay": 0.3}, 4: {"weight_decay": 0.0}, 6: {"weight_decay": 0.05}, 7: {"eps": 0.01},
      8: {"betas": (0.5, 0.99)}}),
    ("AdamW", {"lr": 0.05, "amsgrad": True},
     {3: {"amsgrad": False}, 5: {"maximize": True}, 6: {"decoupled_weight_decay": False}, 7: {"lr": 0.01}}),
    ("Adamax", {"lr": 0.05},
     {2: {"eps": 1e-2}, 3: {"betas": (0.5, 0.99)}, 4: {"weight_decay": 0.1}, 6: {"maximize": True}, 7: {"lr": 0.1}}),
    ("Adagrad", {"lr": 0.1},
     {2: {"lr_decay": 0.1}, 3: {"eps": 1e-2}, 4: {"weight_decay": 0.1}, 6: {"weight_decay": 0.0},
      7: {"maximize": True}, 8: {"lr": 0.05}}),
    ("Adadelta", {"lr": 0.5},
     {2: {"rho": 0.5}, 3: {"eps": 1e-3}, 4: {"weight_decay": 0.1}, 6: {"lr": 1.0}, 7: {"maximize": True}}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True},
     {2: {"alpha": 0.5}, 3: {"eps": 1e-3}, 4: {"weight_decay": 0.1}, 5: {"momentum": 0.5}, 6: {"momentum": 0.0},
      7: {"maximize": True}, 8: {"centered": False}, 9: {"lr": 0.02, "momentum": 0.3}}),
    ("RMSprop", {"lr": 0.01}, {4: {"momentum": 0.9}}),  # KeyError: no momentum_buffer
    ("RMSprop", {"lr": 0.01}, {4: {"centered": True}}),  # KeyError: no grad_avg
    ("NAdam", {"lr": 0.05},
     {2: {"momentum_decay": 0.05}, 3: {"betas": (0.8, 0.95)}, 4: {"eps": 1e-3}, 5: {"weight_decay": 0.1},
      6: {"decoupled_weight_decay": True}, 7: {"maximize": True}, 8: {"lr": 0.02}}),
    ("RAdam", {"lr": 0.05},  # beta2 moves rho_inf and with it the step where rectification starts
     {2: {"betas": (0.9, 0.95)}, 3: {"eps": 1e-3}, 4: {"weight_decay": 0.1}, 5: {"decoupled_weight_decay": True},
      6: {"betas": (0.8, 0.99)}, 7: {"lr": 0.02}, 8: {"maximize": True}}),
    ("ASGD", {"lr": 0.02, "t0": 3},
     {2: {"lambd": 0.01}, 3: {"alpha": 0.5}, 4: {"t0": 1.0}, 5: {"weight_decay": 0.1}, 6: {"lr": 0.05},
      7: {"maximize": True}}),
    ("Rprop", {"lr": 0.05}, {2: {"etas": (0.3, 1.5)}, 4: {"step_sizes": (1e-3, 0.02)}, 6: {"maximize": True}}),
]  # fmt: skip

# Per optimizer, how to draw a new value of each number (never 0: that is a structural change).
_U = lambda low, high: lambda rng: float(rng.uniform(low, high))
_LOG = lambda low, high: lambda rng: float(np.exp(rng.uniform(np.log(low), np.log(high))))
_PAIR = lambda a, b: lambda rng: (a(rng), b(rng))
_COMMON = {"lr": _U(0.005, 0.08), "weight_decay": _U(0.01, 0.3), "eps": _LOG(1e-8, 1e-2)}
_BETAS = {"betas": _PAIR(_U(0.5, 0.95), _U(0.9, 0.999))}
RANDOM = [
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.1},
     {"momentum": _U(0.1, 0.95), "dampening": _U(0.01, 0.5)}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}, {"momentum": _U(0.1, 0.95)}),
    ("Adam", {"lr": 0.05, "weight_decay": 0.1, "amsgrad": True}, _BETAS),
    ("AdamW", {"lr": 0.05}, _BETAS),
    ("Adamax", {"lr": 0.05, "weight_decay": 0.1}, _BETAS),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1}, {"lr_decay": _U(0.001, 0.2)}),
    ("Adadelta", {"lr": 0.5, "weight_decay": 0.1}, {"lr": _U(0.1, 1.0), "rho": _U(0.5, 0.99)}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.5, "centered": True, "weight_decay": 0.1},
     {"alpha": _U(0.5, 0.999), "momentum": _U(0.1, 0.9)}),
    ("NAdam", {"lr": 0.05, "weight_decay": 0.1}, {**_BETAS, "momentum_decay": _LOG(1e-3, 5e-2)}),
    ("RAdam", {"lr": 0.05, "weight_decay": 0.1}, _BETAS),
    ("ASGD", {"lr": 0.02, "t0": 3, "weight_decay": 0.1},
     {"lambd": _LOG(1e-4, 1e-2), "alpha": _U(0.5, 1.0), "t0": _U(1.0, 6.0)}),
    ("Rprop", {"lr": 0.05}, {"etas": _PAIR(_U(0.3, 0.7), _U(1.1, 1.5)), "step_sizes": _PAIR(_LOG(1e-6, 1e-3),
                                                                                               _U(0.01, 1.0))}),
]  # fmt: skip
# Rprop reads lr only for a parameter's first step size (PyTorch too): its schedule leaves it alone.
_NO_COMMON = {"Rprop": ("lr", "weight_decay", "eps"), "SGD": ("eps",), "ASGD": ("eps",)}


def _random_schedule(name: str, draws: dict, seed: int) -> dict:
    """At random calls (after the first two, which make the state and trace), random new numbers."""
    rng = np.random.default_rng(seed)
    draws = {**{k: v for k, v in _COMMON.items() if k not in _NO_COMMON.get(name, ())}, **draws}
    schedule: dict = {}
    for key, draw in draws.items():
        for call in rng.choice(np.arange(2, CALLS), size=3, replace=False):
            schedule.setdefault(int(call), {})[key] = draw(rng)
    return schedule


def _run(lib, name: str, kwargs: dict, schedule, compiled: bool = False, dtype: str = "float64",
         second_group: dict | None = None):  # fmt: skip
    """Run the schedule (``{call: changes to param_groups[0]}``, or ``schedule(opt, call)``); per call,
    copies of the parameters and the state, or the name of the exception raised. ``second_group``:
    the bias in a group of its own, with these hyperparameters."""
    dtype = getattr(lib, dtype)
    w = lib.tensor(W0.copy(), dtype=dtype, requires_grad=True)
    b = lib.tensor(B0.copy(), dtype=dtype, requires_grad=True)
    params = [w, b] if second_group is None else [{"params": [w]}, {"params": [b], **second_group}]
    opt = getattr(lib.optim, name)(params, **kwargs)
    a, y = lib.tensor(A, dtype=dtype), lib.tensor(Y, dtype=dtype)
    change = schedule if callable(schedule) else lambda opt, call: opt.param_groups[0].update(schedule.get(call, {}))

    def step(a, y):
        opt.zero_grad()
        loss = ((a @ w + b - y) ** 2).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    f = kiln.compile(step) if compiled else step
    history = []
    for call in range(CALLS):
        change(opt, call)
        try:
            f(a, y)
        except Exception as error:  # noqa: BLE001 - compared with what eager raised at that call
            history.append(type(error).__name__)
            break
        state = [{k: _copy(v) for k, v in opt.state[p].items()} for p in (w, b)]
        history.append([_copy(w), _copy(b), state])
    return history, f


def _copy(t) -> np.ndarray:
    return t.detach().numpy().copy()


def _assert_same(got: list, expected: list, what: str, tolerance: dict) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} calls ran, expected {len(expected)}"
    for call, (g, e) in enumerate(zip(got, expected, strict=True)):
        if isinstance(e, str) or isinstance(g, str):
            assert g == e, f"{what}, call {call}: {g} where {e} was expected"
            continue
        for name, x, z in (("w", g[0], e[0]), ("b", g[1], e[1])):
            np.testing.assert_allclose(x, z, **tolerance, err_msg=f"{what}, call {call}: parameter {name}")
        for p, (state, expected_state) in enumerate(zip(g[2], e[2], strict=True)):
            assert state.keys() == expected_state.keys(), f"{what}, call {call}: state keys of parameter {p}"
            for key in state:
                np.testing.assert_allclose(state[key], expected_state[key], **tolerance,
                                           err_msg=f"{what}, call {call}: state {key!r} of parameter {p}")  # fmt: skip


def _compiled_calls(f) -> int:
    return sum(spec.calls for spec in f.state.specializations)


def _label(case) -> str:
    return f"{case[0]}-{'-'.join(sorted({k for change in case[2].values() for k in change}))}"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", SCHEDULES, ids=map(_label, SCHEDULES))
def test_compiled_step_follows_every_change(case, dtype):
    name, kwargs, schedule = case
    eager, _ = _run(kiln, name, kwargs, schedule, dtype=dtype)
    compiled, f = _run(kiln, name, kwargs, schedule, compiled=True, dtype=dtype)
    # float32: rounding differences of the fused kernels, seen through cancellations (0.01 of 20)
    _assert_same(compiled, eager, f"compiled {name}", TIGHT if dtype == "float64" else {"rtol": 1e-5, "atol": 1e-5})
    if not isinstance(eager[-1], str):
        assert _compiled_calls(f) >= 3, "the compiled program hardly ran: the test would prove nothing"


@pytest.mark.parametrize("case", SCHEDULES, ids=map(_label, SCHEDULES))
def test_eager_schedule_matches_torch(torch, case):
    name, kwargs, schedule = case
    ours, _ = _run(kiln, name, kwargs, schedule)
    theirs, _ = _run(torch, name, kwargs, schedule)
    _assert_same(ours, theirs, f"kiln {name} against torch", {"rtol": 1e-7, "atol": 1e-9})


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", RANDOM, ids=[f"{c[0]}-{i}" for i, c in enumerate(RANDOM)])
def test_random_numbers_are_inputs_never_retraced(case, seed):
    name, kwargs, draws = case
    schedule = _random_schedule(name, draws, seed)
    eager, _ = _run(kiln, name, kwargs, schedule)
    compiled, f = _run(kiln, name, kwargs, schedule, compiled=True)
    _assert_same(compiled, eager, f"compiled {name}, schedule {schedule}", TIGHT)
    # The first call traces while it makes the state (kiln.jit.make_state: the state is captured, no
    # value of the call), so every later call runs the compiled program, whatever the numbers became.
    # SGD's momentum buffer starts as the first gradient: a zero buffer updated as at every later
    # step when dampening is 0, but with dampening the first call stores a clone of the gradient and
    # cannot be reused: the second traces again.
    first_calls = 2 if name == "SGD" and kwargs.get("dampening", 0) != 0 else 1
    assert _compiled_calls(f) == CALLS - first_calls, [e.detail for e in f.state.events]


def _two_groups(opt, call: int) -> None:
    if call == 3:
        opt.param_groups[1].update(eps=1e-2, weight_decay=0.1)
    if call == 5:
        opt.param_groups[1]["amsgrad"] = False
    if call == 6:
        opt.param_groups[0]["betas"] = (0.5, 0.9)


def _load_state(opt, call: int) -> None:
    """A checkpoint with other hyperparameters, loaded between two calls."""
    if call == 4:
        state = opt.state_dict()
        state["param_groups"][0].update(eps=0.1, maximize=True, weight_decay=0.2, betas=[0.6, 0.8])
        opt.load_state_dict(state)


OTHER_CHANGES = {
    "two groups": ("Adam", {"lr": 0.05}, _two_groups, {"lr": 0.1, "amsgrad": True}),
    "load_state_dict": ("Adam", {"lr": 0.05}, _load_state, None),
}


@pytest.mark.parametrize("what", list(OTHER_CHANGES))
def test_changes_to_any_group_and_by_load_state_dict(what, torch):
    name, kwargs, change, second_group = OTHER_CHANGES[what]
    eager, _ = _run(kiln, name, kwargs, change, second_group=second_group)
    compiled, f = _run(kiln, name, kwargs, change, compiled=True, second_group=second_group)
    _assert_same(compiled, eager, f"compiled {name}, {what}", TIGHT)
    assert _compiled_calls(f) >= 3
    theirs, _ = _run(torch, name, kwargs, change, second_group=second_group)
    _assert_same(eager, theirs, f"kiln {name} against torch, {what}", {"rtol": 1e-7, "atol": 1e-9})


def test_numbers_given_as_ints_lists_and_nan():
    """A checkpoint read from JSON gives lists; ints and nan are numbers too (nan never equals the
    value written before: it is written again at each call)."""
    schedule = {2: {"betas": [0.5, 0.9]}, 3: {"lr": 0}, 4: {"lr": 1, "betas": [0.5, 0.8]}, 6: {"eps": float("nan")},
                8: {"eps": 1e-8}}  # fmt: skip
    eager, _ = _run(kiln, "Adam", {"lr": 0.05}, schedule)
    compiled, f = _run(kiln, "Adam", {"lr": 0.05}, schedule, compiled=True)
    _assert_same(compiled, eager, "compiled Adam", TIGHT)
    assert np.isnan(eager[-1][0]).all() and _compiled_calls(f) == CALLS - 1


def _grow(compiled: bool):
    """SGD over ``w``; the bias joins in a group of its own at the fifth call."""
    w = kiln.tensor(W0.copy(), dtype=kiln.float64, requires_grad=True)
    b = kiln.tensor(B0.copy(), dtype=kiln.float64, requires_grad=True)
    a, y = kiln.tensor(A), kiln.tensor(Y)
    opt = optim.SGD([w], lr=0.05, momentum=0.9)

    def step(a, y):
        opt.zero_grad()
        b.grad = None  # the same whether or not b is in the optimizer yet
        ((a @ w + b - y) ** 2).sum().backward()
        opt.step()

    f = kiln.compile(step) if compiled else step
    for call in range(8):
        if call == 4:
            opt.add_param_group({"params": [b], "lr": 0.1})
        f(a, y)
    return [_copy(w), _copy(b)], f


def test_a_new_param_group_retraces():
    (w, b), f = _grow(True)
    (w_eager, b_eager), _ = _grow(False)
    np.testing.assert_allclose(w, w_eager, **TIGHT)
    np.testing.assert_allclose(b, b_eager, **TIGHT)
    assert any("SGD has 2 parameter group(s), not 1" in e.detail for e in f.state.events)


def test_every_optimizer_and_every_key_is_scheduled():
    """Each optimizer in kiln.optim (LBFGS: below) has a schedule, and the schedules change every
    number, flag and zero test it declares; a key its step reads outside ``scalars`` is a flag or
    a zero test, never a number read as a Python float."""
    names = {n for n in optim.__all__ if isinstance(getattr(optim, n), type) and n not in ("Optimizer", "LBFGS")}
    assert names == {case[0] for case in SCHEDULES}
    for name in names:
        cls = getattr(optim, name)
        changed = {k for case in SCHEDULES if case[0] == name for change in case[2].values() for k in change}
        assert set(cls.numbers + cls.flags + cls.zero_skips) <= changed, name
        reads = _keys_read_by_update(name)
        assert reads <= set(cls.flags + cls.zero_skips) | {"params"}, f"{name} reads {reads}"


class _Recording(dict):
    def __init__(self, group: dict) -> None:
        super().__init__(group)
        self.read: set = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)


def _keys_read_by_update(name: str) -> set:
    """The param_groups keys ``_update_group`` reads itself, with weight decay and momentum on."""
    w = kiln.tensor(W0.copy(), requires_grad=True)
    cls = getattr(optim, name)
    on = {k: 0.1 for k in ("weight_decay", "momentum") if k in cls([w]).defaults}
    opt = cls([w], **on)
    group = _Recording(opt.param_groups[0])
    (w * w).sum().backward()
    opt.step()  # the state exists from here on
    with kiln.no_grad():
        opt._update_group(group, opt.sync_hyperparameters()[0])
    return group.read


def test_retrace_reasons_and_explain_name_the_param_groups_entry():
    kwargs = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1}
    _, f = _run(kiln, "SGD", kwargs, {3: {"nesterov": True}, 5: {"weight_decay": 0.0}}, compiled=True)
    reasons = [e.detail for e in f.state.events if e.kind == "compiled"]
    assert any("SGD.param_groups[0]['nesterov'] changed from False to True" in r for r in reasons), reasons
    assert any("SGD.param_groups[0]['weight_decay'] is zero now, positive when traced" in r for r in reasons)
    summary = kiln.explain(f).summary()
    for what in ("SGD.param_groups[0]['dampening']", "SGD.param_groups[0]['nesterov']",
                 "the sign of SGD.param_groups[0]['momentum']"):  # fmt: skip
        assert what in summary, summary
    assert "test_compiled_hyperparameters.py" in summary  # the user's line that ran the step
    # Per specialization: with weight decay 0 the graph does not read it; its sign stays a guard.
    table = [{(read.what, read.kind) for read in spec.python_reads} for spec in f.state.specializations]
    assert {("SGD.param_groups[0]['weight_decay']", "input"), ("SGD.param_groups[0]['lr']", "input"),
            ("SGD.param_groups[0]['nesterov']", "guard")} <= table[0]  # fmt: skip
    assert ("SGD.param_groups[0]['weight_decay']", "input") not in table[-1]
    assert ("the sign of SGD.param_groups[0]['weight_decay']", "guard") in table[-1]
    assert ("SGD.param_groups[0]['lr']", "input") in table[-1]
    assert all(
        read.loc is not None and read.loc.filename == __file__ for read in f.state.specializations[0].python_reads
    )


def _lbfgs(compiled: bool) -> np.ndarray:
    w = kiln.tensor(W0.copy(), requires_grad=True)
    a, y = kiln.tensor(A), kiln.tensor(Y)
    opt = optim.LBFGS([w], lr=0.5, max_iter=3)

    def closure():
        opt.zero_grad()
        loss = ((a @ w - y) ** 2).sum()
        loss.backward()
        return loss

    def step():
        return opt.step(closure)

    f = kiln.compile(step) if compiled else step
    for call in range(4):
        opt.param_groups[0]["lr"] = 0.5 / (call + 1)
        f()
    assert not compiled or not f.state.specializations  # the trace stopped: every call ran eagerly
    return _copy(w)


def test_lbfgs_compiled_step_runs_eagerly_and_follows_lr():
    """LBFGS decides with Python numbers read from tensors: its compiled step stops the trace and runs
    eagerly, so a changed lr is honoured."""
    np.testing.assert_allclose(_lbfgs(True), _lbfgs(False), **TIGHT)


def test_an_unpickled_optimizer_steps_and_follows_its_numbers():
    """__getstate__ drops the hyperparameter tensors; __setstate__ makes room for them again."""
    import copy
    import pickle

    model = kiln.nn.Linear(3, 2)
    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(kiln.randn(4, 3)).sum().backward()
    opt.step()
    for clone in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        (param,) = clone.param_groups[0]["params"][:1]
        param.grad = kiln.ones_like(param)
        before = param.detach().clone()
        clone.param_groups[0]["lr"] = 0.5
        clone.step()
        moved = (before - param.detach()).abs().max().item()
        assert moved > 0


def _sgd_model(seed=0):
    kiln.manual_seed(seed)
    model = kiln.nn.Linear(3, 2)
    return model, kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)


def test_a_warm_up_written_into_param_groups_inside_the_compiled_step_is_not_lost():
    """``g["lr"] = ...`` inside the function is a store a compiled call would not repeat: the trace
    stops there (the optimizers' param_groups are watched for stores, never guarded by value)."""
    results = []
    for compile_it in (False, True):
        model, opt = _sgd_model()

        def step(x, lr, model=model, opt=opt):
            for group in opt.param_groups:
                group["lr"] = lr
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = kiln.compile(step) if compile_it else step
        kiln.manual_seed(1)
        for i in range(4):
            fn(kiln.randn(4, 3), 0.05 * (i + 1))
        results.append((model.weight.detach().clone(), opt.param_groups[0]["lr"]))
        if compile_it:
            assert (
                "opt.param_groups[0]['lr'], Python state from outside"
                in kiln.explain(fn, kiln.randn(4, 3), 0.3).summary()
            )
    assert results[0][1] == results[1][1] == 0.2
    assert_close(results[1][0], results[0][0], rtol=1e-6, atol=1e-7)


def test_a_scheduler_stepped_inside_the_compiled_step_stops_the_trace():
    epochs = []
    for compile_it in (False, True):
        model, opt = _sgd_model()
        sched = kiln.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

        def step(x, model=model, opt=opt, sched=sched):
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            return loss.detach()

        fn = kiln.compile(step) if compile_it else step
        for _ in range(5):
            fn(kiln.ones(4, 3))
        epochs.append((sched.last_epoch, opt.param_groups[0]["lr"], model.weight.detach().clone()))
        if compile_it:
            assert "StepLR.step() changes the learning rate" in kiln.explain(fn, kiln.ones(4, 3)).summary()
    assert epochs[0][:2] == epochs[1][:2] == (5, 0.025)
    assert_close(epochs[1][2], epochs[0][2], rtol=1e-6, atol=1e-7)


class _UsersSGD(optim.Optimizer):
    """An optimizer written in the user's program, as research code subclasses torch.optim.Optimizer."""

    numbers = ("lr",)

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr, "maximize": False})

    def _update_group(self, group, scalars):
        for p in group["params"]:
            if p.grad is not None:
                p.sub_(p.grad * scalars["lr"])


def test_a_users_optimizer_with_a_schedule_compiles_and_follows_it():
    """The refresh of the hyperparameter tensors before each call is no store into the user's object
    (a user's subclass is watched as the user's): the step compiles and follows the schedule."""
    weights = []
    for compile_it in (False, True):
        kiln.manual_seed(0)
        model = kiln.nn.Linear(3, 2)
        opt = _UsersSGD(model.parameters())
        sched = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

        def step(x, model=model, opt=opt):
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = kiln.compile(step) if compile_it else step
        for _ in range(6):
            fn(kiln.ones(2, 3))
            sched.step()
        weights.append(model.weight.detach().clone())
        if compile_it:
            assert "0 trace break(s)" in kiln.explain(fn, kiln.ones(2, 3)).summary()
            assert sum(e.kind == "compiled" for e in fn.state.events) <= 2  # the first .grad is one retrace
    assert_close(weights[1], weights[0], rtol=1e-6, atol=1e-7)
