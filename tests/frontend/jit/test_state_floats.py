"""Floats held in Python state (an attribute, a dict's entry, a module's global) read at each call (state_floats.py).

Each test changes the state between calls and compares the compiled function with the same function
run eagerly on the same state, call by call. Those about specializations check the count PyTorch's
unspecialized floats give, plus one (the first trace read the float as a constant: the second and
third, watched, are compared), or that the float stays guarded by value where its value decides
more than an input could carry.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

import kiln
import kiln.nn as nn

from .helpers import compiled_calls

VALUES = [0.5, 0.625, 0.75, 1.25, -0.375, 3.0, 0.625]
RTOL, ATOL = 1e-6, 1e-7


def _against_eager(make, values=VALUES, wait: bool = True):
    """``make() -> (fn, set_value, args)``: a fresh eager pair and compiled pair, ``set_value(v)`` before
    each call; the values must agree call by call. Returns the compiled function."""
    runs = []
    for compiled in (False, True):
        kiln.manual_seed(0)  # (the same arguments and weights for both)
        fn, set_value, args = make()
        f = kiln.compile(fn, wait=wait) if compiled else fn
        outs = []
        for value in values:
            set_value(value)
            out = f(*args)
            if compiled and not wait:
                f.wait_compiled()
            outs.append([o.detach().numpy().copy() for o in (out if isinstance(out, tuple) else (out,))])
        runs.append((outs, f))
    (expected, _), (got, f) = runs
    for call, (a, b) in enumerate(zip(got, expected, strict=True)):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"call {call}")
    return f


def _details(f) -> str:
    return "\n".join(e.detail for e in f.state.events)


class _Schedule:
    def __init__(self) -> None:
        self.beta = 0.0
        self.cfg = {"w": 1.0, "inner": {"t": 2.0}}


@pytest.mark.parametrize(
    "where",
    ["attribute", "dict entry", "nested dict in an attribute", "list item", "global", "helper's global",
     "module attribute", "closure variable"],
)  # fmt: skip
def test_a_float_in_python_state_that_only_enters_tensor_ops_makes_one_program_for_every_value(where):
    def make():
        sched, table, items = _Schedule(), {"w": 1.0}, [1.0, 2.0]
        helper_globals = {"W": 1.0}
        helper = types.FunctionType((lambda x: x * W).__code__, helper_globals)  # noqa: F821
        module = nn.Linear(3, 3).requires_grad_(False)  # (results needing gradients outside: by value)
        module.gain = 1.0
        x = kiln.randn(4, 3)
        fn, set_value = {
            "attribute": (lambda x: x * sched.beta + 1, lambda v: setattr(sched, "beta", v)),
            "dict entry": (lambda x: (x - table["w"]).exp(), lambda v: table.__setitem__("w", v)),
            "nested dict in an attribute": (lambda x: x * sched.cfg["inner"]["t"],
                                            lambda v: sched.cfg["inner"].__setitem__("t", v)),
            "list item": (lambda x: x / items[1], lambda v: items.__setitem__(1, v)),
            "global": (lambda x: x * _GLOBAL["g"] + _SCALE, lambda v: globals().__setitem__("_SCALE", v)),
            "helper's global": (lambda x: helper(x).sum(), lambda v: helper_globals.__setitem__("W", v)),
            "module attribute": (lambda x: module(x) * module.gain, lambda v: setattr(module, "gain", v)),
            "closure variable": _closure_pair(),
        }[where]  # fmt: skip
        return fn, set_value, (x,)

    f = _against_eager(make)
    assert len(f.state.specializations) == 3, _details(f)  # main: one per value (6)
    assert "a float read at each call (one program for every value)" in _details(f)
    assert sum(compiled_calls(f)) == len(VALUES) - 3


_SCALE = 1.0
_GLOBAL = {"g": 2.0}


def _closure_pair():
    """A function reading a variable of its enclosing function, and a setter that rebinds it."""
    beta = 1.0

    def fn(x):
        return x * beta - 1

    def set_value(v):
        nonlocal beta
        beta = v

    return fn, set_value


def test_numbers_python_computes_from_it_become_ops_of_the_program():
    def make():
        sched = _Schedule()
        x = kiln.randn(8, dtype=kiln.float64)
        return (lambda x: sched.beta * x + (1 - sched.beta) * x.flip(0) + x / (2 * sched.beta) ** 2,
                lambda v: setattr(sched, "beta", v), (x,))  # fmt: skip

    f = _against_eager(make)
    assert len(f.state.specializations) == 3
    assert "sched.beta: a float read at each call" in _details(f)


@pytest.mark.parametrize(
    "body",
    [
        lambda x, s: x * math.exp(s.beta),  # a number C computes from it
        lambda x, s: x * (s.beta // 0.25),  # a number Python computes otherwise than a program would
        lambda x, s: x * abs(s.beta),  # the same at two values (-0.375 and 0.375)
        lambda x, s: kiln.nn.functional.dropout(x, abs(s.beta) / 8, training=False),  # kiln's own check
    ],
)
def test_what_follows_the_value_outside_an_input_keeps_it_guarded_by_value(body):
    def make():
        sched = _Schedule()
        x = kiln.randn(8)
        return (lambda x: body(x, sched)), lambda v: setattr(sched, "beta", v), (x,)

    f = _against_eager(make, [0.5, -0.375, 0.375, 0.875, 1.25, 0.5, 2.0])
    assert "a float read at each call (one program" not in _details(f)


def test_a_warmup_with_min_is_two_programs_one_on_each_side():
    # beta = min(1.0, step / warmup): guarded by the comparison inside min, a program on each side
    def make():
        sched = _Schedule()
        x = kiln.randn(8)
        return (lambda x: x * min(1.0, sched.beta)), lambda v: setattr(sched, "beta", v), (x,)

    f = _against_eager(make, [0.1, 0.2, 0.3, 0.4, 0.9, 1.0, 1.1, 1.2, 1.3, 2.0, 0.5])
    assert len(f.state.specializations) <= 6, _details(f)
    assert _details(f).count("a float read at each call (one program") == 2


def test_a_training_step_with_an_annealed_loss_weight_matches_eager():
    # KL annealing: the weight lives in the scheduler, the step reads it
    def make():
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
        opt = kiln.optim.Adam(model.parameters(), lr=0.01)
        sched = _Schedule()
        x, y = kiln.randn(32, 6), kiln.randn(32, 2)

        def step(x, y):
            out = model(x)
            loss = ((out - y) ** 2).mean() + sched.beta * out.abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach(), model[0].weight.detach().clone()

        return step, lambda v: setattr(sched, "beta", v), (x, y)

    betas = [min(1.0, i / 6) * 0.1 for i in range(10)]
    f = _against_eager(make, betas)
    assert len(f.state.specializations) <= 4, _details(f)  # (the first step creates Adam's state: one more)
    assert "sched.beta: a float read at each call" in _details(f)
    assert "sched.beta: any float" in str(kiln.explain(f, kiln.randn(32, 6), kiln.randn(32, 2)))


def test_a_module_hyperparameter_changed_between_steps():
    # BatchNorm's momentum and eps, changed by the user between calls: read where kiln's op reads them
    def make():
        kiln.manual_seed(1)
        bn = nn.BatchNorm1d(5)
        x = kiln.randn(16, 5)

        def set_value(v):
            bn.momentum = abs(v) / 4

        return (lambda x: (bn(x), bn.running_mean.clone())), set_value, (x,)

    _against_eager(make)


def test_results_that_need_gradients_outside_the_call_keep_it_guarded_by_value():
    sched = _Schedule()
    w = kiln.randn(5, dtype=kiln.float64, requires_grad=True)
    f = kiln.compile(lambda w: (w * sched.beta).sum(), wait=True)
    for value in VALUES[:5]:
        sched.beta = value
        w.grad = None
        f(w).backward()
        np.testing.assert_allclose(w.grad.numpy(), np.full(5, value), rtol=1e-12, atol=0)
    assert "results need gradients outside the call" in _details(f)


def test_an_entry_that_becomes_another_type_traces_again():
    sched = _Schedule()
    x = kiln.randn(4)
    f = kiln.compile(lambda x: x * sched.beta, wait=True)
    for value in [0.5, 0.75, 1.5, 2.5, 3, True, 0.25]:
        sched.beta = value
        np.testing.assert_allclose(f(x).numpy(), (x * value).numpy(), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 5  # (3 at 0.5, 0.75, 1.5: one for every float; 3, True by value)


def test_an_entry_removed_or_another_entry_changed_traces_again():
    table = {"w": 1.0, "mode": "a"}
    x = kiln.randn(4)

    def fn(x):
        return x * table["w"] if table["mode"] == "a" else x - table["w"]

    f = kiln.compile(fn, wait=True)
    for w, mode in [(1.0, "a"), (2.0, "a"), (3.0, "a"), (4.0, "b"), (5.0, "b"), (6.0, "a"), (7.0, "b")]:
        table["w"], table["mode"] = w, mode
        np.testing.assert_allclose(f(x).numpy(), fn(x).numpy(), rtol=RTOL, atol=ATOL)


def test_in_the_background_the_values_are_right():
    def make():
        sched = _Schedule()
        x = kiln.randn(16)
        return (lambda x: (x * sched.beta).exp()), lambda v: setattr(sched, "beta", v), (x,)

    f = _against_eager(make, VALUES + [0.1, 0.2, 0.3], wait=False)
    assert "sched.beta: a float read at each call" in _details(f)


def test_two_functions_read_one_entry_each_with_its_own_programs():
    sched = _Schedule()
    x = kiln.randn(4)
    f = kiln.compile(lambda x: x * sched.beta, wait=True)
    g = kiln.compile(lambda x: x + sched.beta, wait=True)
    for value in VALUES:
        sched.beta = value
        np.testing.assert_allclose(f(x).numpy(), (x * value).numpy(), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(g(x).numpy(), (x + value).numpy(), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(f(x).numpy(), (x * value).numpy(), rtol=RTOL, atol=ATOL)


def test_the_call_storing_into_the_entry_runs_eagerly_and_keeps_its_value():
    sched = _Schedule()
    x = kiln.randn(4)

    def fn(x):
        out = x * sched.beta
        sched.beta = sched.beta * 0.5  # Python state a compiled call would not change
        return out

    f = kiln.compile(fn, wait=True)
    for value in VALUES:
        sched.beta = value
        np.testing.assert_allclose(f(x).numpy(), (x * value).numpy(), rtol=RTOL, atol=ATOL)
        assert type(sched.beta) is float and sched.beta == value * 0.5  # (never a watched number)


def test_the_entry_holds_the_users_own_float_after_a_watched_trace():
    sched = _Schedule()
    x = kiln.randn(4)
    f = kiln.compile(lambda x: x * sched.beta, wait=True)
    for value in [float(v) + 0.5 for v in range(6)]:
        sched.beta = value
        f(x)
        assert sched.beta is value


def test_integers_stay_guarded_by_value():
    sched = types.SimpleNamespace(k=1)
    x = kiln.randn(4)
    f = kiln.compile(lambda x: x * sched.k, wait=True)
    for value in [1, 2, 3, 4]:
        sched.k = value
        np.testing.assert_allclose(f(x).numpy(), (x * value).numpy(), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 4


def test_an_entry_reached_by_two_paths_is_one_input():
    cfg = {"w": 0.5}
    holder = types.SimpleNamespace(cfg=cfg)
    x = kiln.randn(4)
    f = kiln.compile(lambda x: x * cfg["w"] + x * holder.cfg["w"] ** 2, wait=True)
    for value in VALUES:
        cfg["w"] = value
        np.testing.assert_allclose(f(x).numpy(), (x * value + x * value**2).numpy(), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 3
    assert f.state.specializations[-1].graph is not None
    assert str(kiln.explain(f, x)).count("cfg['w']: any float") == 1


def test_a_float_argument_and_a_float_of_state_both_changed_at_each_call():
    # a learning rate passed in, a loss weight annealed in the scheduler: both inputs at any value
    sched = _Schedule()
    x = kiln.randn(8, dtype=kiln.float64)
    fn = lambda x, lr: x * lr + x.exp() * sched.beta  # noqa: E731
    f = kiln.compile(fn, wait=True)
    for i, value in enumerate(VALUES + [2.5, 0.125]):
        sched.beta = 0.1 * i
        np.testing.assert_allclose(f(x, value).numpy(), fn(x, value).numpy(), rtol=1e-12, atol=0)
    assert len(f.state.specializations) == 3, _details(f)
    assert "sched.beta: a float read at each call" in _details(f)
    assert "argument 1: a float read at each call" in _details(f)


def test_a_dict_keyed_by_tensors_that_lost_an_entry_is_compared_by_identity():
    # an optimizer's state is keyed by parameters: their == is elementwise (fuzz seed 1313001052)
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 3)).to(kiln.float64)
    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = kiln.randn(2, 5, dtype=kiln.float64), kiln.randn(2, 3, dtype=kiln.float64)

    def step(x, y, w):
        opt.zero_grad()
        loss = kiln.nn.functional.mse_loss(model(x), y) * w
        loss.backward()
        opt.step()
        return loss.detach()

    f = kiln.compile(step, wait=True)
    for call in range(6):
        if call == 2:
            opt.state.pop(model[2].weight)
        if call == 4:
            opt.state[model[2].weight] = {"momentum_buffer": kiln.zeros(3, 3, dtype=kiln.float64)}
        f(x, y, 0.5 + call)


def test_in_the_background_an_argument_and_a_float_of_state_together_make_one_program():
    # each call a new key (its lr) while the earlier program still compiles: the state is compared with it
    sched = _Schedule()
    x = kiln.randn(64, 32)
    fn = lambda x, lr: (x * lr).tanh().sum() + x.abs().mean() * sched.beta  # noqa: E731
    f = kiln.compile(fn, wait=False)
    for i in range(20):
        sched.beta, lr = 0.01 * i, 0.5 + 0.125 * i
        got = f(x, lr)
        np.testing.assert_allclose(got.numpy(), fn(x, lr).numpy(), rtol=1e-5, atol=1e-6)
    f.wait_compiled()
    assert len(f.state.specializations) <= 4, _details(f)
    assert "sched.beta: a float read at each call" in _details(f)
