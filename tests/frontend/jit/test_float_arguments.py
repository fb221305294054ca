"""Python float arguments: read as inputs, one program for every value once two traces agree (scalar_args.py).

Each test calls the compiled function and the plain one on the same inputs at several values, and
compares them; those about specializations check the count PyTorch's unspecialized floats give (a
static program, then one for every value) or that the float stays keyed by value where its value
decides more than an input could carry.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
import kiln.nn as nn

VALUES = [0.5, 0.625, 0.75, 1.25, -0.375, 3.0]


def _same(compiled, eager) -> None:
    if isinstance(eager, tuple):
        assert isinstance(compiled, tuple) and len(compiled) == len(eager)
        for c, e in zip(compiled, eager, strict=True):
            _same(c, e)
    elif isinstance(eager, kiln.Tensor):
        assert isinstance(compiled, kiln.Tensor) and compiled.dtype == eager.dtype and compiled.shape == eager.shape
        np.testing.assert_allclose(compiled.detach().numpy(), eager.detach().numpy(), rtol=1e-6, atol=1e-7)
    else:
        assert type(compiled) is type(eager) and compiled == eager


def _calls(fn, make_args, values=VALUES, wait=True):
    """The compiled ``fn`` after calls at each of ``values``, each compared with ``fn`` itself."""
    compiled = kiln.compile(fn, wait=wait)
    for value in values:
        args, kwargs = make_args(value)
        got = compiled(*args, **kwargs)
        if not wait:
            compiled.wait_compiled()
        _same(got, fn(*args, **kwargs))
    return compiled


def _details(compiled) -> str:
    return "\n".join(e.detail for e in compiled.state.events)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, s: (x * s + x / 4).sum(),
        lambda x, s: x.clamp(max=s),
        lambda x, s: kiln.where(x > 0, x, s),
        lambda x, s: (s - x) / s,
    ],
)
def test_a_float_that_only_enters_tensor_ops_makes_one_program_for_every_value(fn):
    x = kiln.randn(16)
    compiled = _calls(fn, lambda s: ((x, s), {}))
    assert len(compiled.state.specializations) == 2  # main: one per value (6)
    assert "argument 1: a float read at each call" in _details(compiled)
    assert "argument 1: float, any value (an input of the program)" in str(kiln.explain(compiled, x, 0.1))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, s: s * x + (1 - s) * x.flip(0),  # mixup's lam and 1 - lam
        lambda x, s: x * (s * 0.1) + x * s**2 - abs(-s),
        lambda x, s: x / (2 * s),
    ],
)
def test_numbers_python_computes_from_the_float_become_ops_of_the_program(fn):
    x = kiln.randn(16, dtype=kiln.float64)
    compiled = _calls(fn, lambda s: ((x, s), {}))
    # the first trace read them as constants: the next two, watched, agree
    assert len(compiled.state.specializations) == 3
    assert "argument 1: a float read at each call" in _details(compiled)


def test_keyword_floats_and_two_floats_each_read_at_each_call():
    x = kiln.randn(4, 8)

    def fn(x, a, *, b):
        return x * a - b

    compiled = _calls(fn, lambda s: ((x, s), {"b": 0.25}))
    compiled = _calls(fn, lambda s: ((x, 0.3), {"b": s}))
    assert len(compiled.state.specializations) == 2
    both = kiln.compile(fn, wait=True)
    for a, b in zip(VALUES, reversed(VALUES), strict=True):
        _same(both(x, a, b=b), fn(x, a, b=b))
    assert len(both.state.specializations) == 2


@pytest.mark.parametrize("dtype", [kiln.float64, kiln.float32, kiln.int64, kiln.float16])
def test_the_float_promotes_and_rounds_as_a_python_number(dtype):
    x = (kiln.arange(6) - 2).to(dtype)
    values = [0.1, 1 / 3, 2.5e-8, 7.0]
    compiled = _calls(lambda x, s: x * s, lambda s: ((x, s), {}), values)
    assert len(compiled.state.specializations) == 2
    if dtype is kiln.float64:  # no rounding through float32 on the way
        assert compiled(x, 1 / 3).numpy().tolist() == (x * (1 / 3)).numpy().tolist()


def test_a_branch_on_the_value_is_a_guard_of_a_program_for_the_values_on_its_side():
    x = kiln.randn(8)

    def fn(x, s):
        if s > 0.7:
            return x * 2
        return x * s

    compiled = _calls(fn, lambda s: ((x, s), {}))
    # 0.5, 0.625: one program for s <= 0.7; 0.75 (the other side of 0.625: keyed), 1.25: one for s > 0.7
    assert len(compiled.state.specializations) == 4, _details(compiled)
    assert "comes out otherwise at the other value" in _details(compiled)
    assert "argument 1 > 0.7 is True" in str(kiln.explain(compiled, x, 2.0))
    for value in [0.1, 0.7, 0.70001, 5.0, -3.0]:  # no more traces, and the right side each time
        _same(compiled(x, value), fn(x, value))
    assert len(compiled.state.specializations) == 4


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, s: x * min(s, 1.0),  # a comparison inside min
        lambda x, s: x * max(0.0, s - 0.25) if s != 0 else x,
        lambda x, s: kiln.nn.functional.dropout(x, s * s / 16, training=False),  # kiln's own check of it
        lambda x, s: x * (s if 1 - s < 2 * s else -s),  # numbers computed from it, compared
    ],
)
def test_comparisons_that_hold_at_both_values_become_guards(fn):
    x = kiln.randn(8)
    values = [0.5, 0.625, 0.75, 0.875, 0.5, 0.625]  # one side of each comparison
    compiled = _calls(fn, lambda s: ((x, s), {}), values)
    assert len(compiled.state.specializations) <= 3, _details(compiled)
    assert "argument 1: a float read at each call" in _details(compiled)
    _calls(fn, lambda s: ((x, s), {}), [0.5, 0.625, 1.5, -2.0, 3.0, 0.375, 0.0, 2.0, 0.625])  # both sides


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, s: x * (s // 0.25),  # a number Python computes otherwise than a program would
        lambda x, s: x * math.exp(s),  # one C computes
        lambda x, s: x * float(np.float32(s)),
        lambda x, s: (x * s, s * 2),  # a Python result that follows it
        lambda x, s: x * 2 if s // 1 > 0 else x,  # a comparison of a number a guard cannot compute again
    ],
)
def test_what_follows_the_value_outside_an_input_keeps_it_keyed_by_value(fn):
    x = kiln.randn(8)
    compiled = _calls(fn, lambda s: ((x, s), {}))
    assert "argument 1: a float read at each call" not in _details(compiled)


def test_a_constant_that_is_the_same_object_as_the_argument_is_not_taken_for_it():
    x = kiln.randn(8)
    scale = 0.375

    def fn(x, s):
        return x * s + x * scale  # the caller passes ``scale`` itself first

    compiled = kiln.compile(fn, wait=True)
    for value in [scale, 0.5, 2.0, scale]:
        _same(compiled(x, value), fn(x, value))


def test_one_float_object_at_two_positions_then_two_values():
    x = kiln.randn(8)
    fn = lambda x, a, b: x * a - b  # noqa: E731
    compiled = kiln.compile(fn, wait=True)
    for a, b in [(0.5, None), (0.75, None), (0.25, 4.0), (2.0, -1.0), (3.0, 0.125), (1.5, None)]:
        b = a if b is None else b
        _same(compiled(x, a, b), fn(x, a, b))
    assert len(compiled.state.specializations) <= 4  # (traced with one object at two places, it is retried)


@pytest.mark.parametrize("keep_graph", [False, True])  # True: the loss returned, its graph consumed
def test_a_training_step_taking_its_learning_rate_compiles_twice_and_matches_eager(keep_graph):
    kiln.manual_seed(0)
    models = [nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    x, y = kiln.randn(32, 6), kiln.randn(32, 1)

    def make_step(model):
        def step(x, y, lr):
            loss = ((model(x) - y) ** 2).mean()
            model.zero_grad()
            loss.backward()
            with kiln.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
            return loss if keep_graph else loss.detach()

        return step

    compiled, eager = kiln.compile(make_step(models[0]), wait=True), make_step(models[1])
    for i in range(8):
        lr = 0.1 * 0.5 * (1 + math.cos(math.pi * i / 8))  # a cosine schedule
        _same(compiled(x, y, lr), eager(x, y, lr))
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert len(compiled.state.specializations) <= 3  # (a first step may set .grad: one more trace)
    assert "argument 2: a float read at each call" in _details(compiled)


def test_results_that_need_gradients_outside_the_call_keep_it_keyed_by_value():
    w = kiln.randn(5, dtype=kiln.float64, requires_grad=True)
    compiled = kiln.compile(lambda w, s: (w * s).sum(), wait=True)
    for value in VALUES[:4]:
        w.grad = None
        compiled(w, value).backward()
        np.testing.assert_allclose(w.grad.numpy(), np.full(5, value), rtol=1e-12, atol=0)
    assert "results need gradients outside the call" in _details(compiled)


def test_in_the_background_the_values_are_right_and_one_program_serves_them():
    x = kiln.randn(16)
    compiled = _calls(lambda x, s: (x * s).exp(), lambda s: ((x, s), {}), wait=False)
    compiled.wait_compiled()
    for value in VALUES:
        _same(compiled(x, value), (x * value).exp())
    assert len(compiled.state.specializations) == 2


def test_check_mode_compares_a_call_at_a_new_value():
    x = kiln.randn(8)
    compiled = kiln.compile(lambda x, s: x * s, wait=True, check=True)
    for value in VALUES:
        _same(compiled(x, value), x * value)
    assert len(compiled.state.specializations) == 2


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, s: x * abs(s),
        lambda x, s: x + kiln.full((8,), abs(s) * 2),
        lambda x, s: kiln.nn.functional.leaky_relu(x, abs(s) / 4),
        lambda x, s: x * (s * 0 + 1) + s**2,
    ],
)
def test_a_number_that_is_the_same_at_both_traced_values_is_not_taken_for_the_value(fn):
    x = kiln.randn(8)
    _calls(fn, lambda s: ((x, s), {}), [-0.5, 0.5, 0.8, -2.0, 0.5, 1.5])


def test_after_a_change_of_state_a_dynamic_float_is_traced_at_its_value_first():
    # the trace after the change reads ``1 - s`` as a constant: it must serve its value only
    x = kiln.randn(3, dtype=kiln.float64)
    cfg = {"scale": 1.5}

    def fn(x, s):
        return x * cfg["scale"] * (1 - s)

    compiled = kiln.compile(fn, wait=True)
    for i, value in enumerate([-1.25, 1.5, 0.75, 0.5, 0.5, 0.25, 2.0, -0.5, 0.125]):
        if i == 4:
            cfg["scale"] = -2.0
        _same(compiled(x, value), fn(x, value))
    assert _details(compiled).count("a float read at each call") == 2  # before the change, and after it


@pytest.mark.parametrize("container", ["dict", "list", "nested dict", "keyword dict"])
def test_a_float_in_a_dict_or_list_argument_is_read_at_each_call(container):
    x = kiln.randn(8)

    def fn(x, hp=None, **kw):
        hp = hp if hp is not None else kw["hp"]
        lr = hp["lr"] if container in ("dict", "keyword dict") else hp[1] if container == "list" else hp["opt"]["lr"]
        return x * lr + (1 - lr) * x.flip(0)

    def make(v):
        hp = {"dict": {"lr": v, "tag": "a"}, "list": ["a", v], "nested dict": {"opt": {"lr": v}},
              "keyword dict": {"lr": v}}[container]  # fmt: skip
        return ((x,), {"hp": hp}) if container == "keyword dict" else ((x, hp), {})

    compiled = _calls(fn, make)
    assert len(compiled.state.specializations) == 3  # (1 - lr: the first trace's constant)
    assert "a float read at each call" in _details(compiled)


def test_a_float_in_a_tuple_argument_stays_keyed_by_value():
    x = kiln.randn(8)
    compiled = _calls(lambda x, hp: x * hp[0], lambda v: ((x, (v, 2)), {}))
    assert len(compiled.state.specializations) == len(set(VALUES))


def test_the_callers_dict_holds_its_own_float_after_a_watched_call():
    x = kiln.randn(8)
    compiled = kiln.compile(lambda x, hp: x * hp["lr"], wait=True)
    for value in VALUES:
        hp = {"lr": value}
        _same(compiled(x, hp), x * value)
        assert hp["lr"] is value  # the caller's own float object, not a copy
    shared = {"lr": 0.5}
    for value in VALUES:  # one dict passed again, changed between calls
        shared["lr"] = value
        _same(compiled(x, shared), x * value)
        assert type(shared["lr"]) is float


def test_a_dynamic_float_the_trace_read_at_one_value_does_not_become_dynamic_again():
    # after a change of state, a trace whose partner differs only in b reads 1 - a as a constant: its
    # program must not serve other values of a
    cfg = {"k": 1}
    x = kiln.ones(3, dtype=kiln.float64)

    def fn(x, a, b):
        return x * (1 - a) + x * b * cfg["k"]

    compiled = kiln.compile(fn, wait=True)
    calls = [(0.5, 1.0), (0.6, 1.0), (0.7, 1.0), (0.75, 1.0), None, (0.8, 1.0), (0.8, 2.0), (0.8, 3.0), (0.9, 4.0),
             (0.1, 5.0), (0.3, 0.5)]  # fmt: skip
    for call in calls:
        if call is None:
            cfg["k"] = 2
            continue
        _same(compiled(x, *call), fn(x, *call))


_TABLE = {0.5: True, 0.625: True, 0.75: False}


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, s: x * s if _TABLE[s] else x - s,  # a lookup by its value (its hash)
        lambda x, s: x * s if {0.75} - {s} else x - s,  # a set of it
        lambda x, s: x * s if str(s) != "0.75" else x - s,  # its text
        lambda x, s: x * s if f"{s:.2f}" != "0.75" else x - s,
        lambda x, s: x * s if repr(s) != "0.75" else x - s,
    ],
)
def test_what_python_reads_of_the_value_besides_comparisons_keeps_it_keyed_by_value(fn):
    # the first two values take one branch and make one program; the third takes the other
    x = kiln.randn(8)
    compiled = _calls(fn, lambda s: ((x, s), {}), [0.5, 0.625, 0.75, 0.5])
    assert "argument 1: a float read at each call" not in _details(compiled)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, s: x * 2 if float(s) > 0.6 else x - 1,  # a copy of it (lr = float(lr), as code often starts)
        lambda x, s: x * 2 if s.real > 0.6 else x - 1,
        lambda x, s: x * 2 if s.conjugate() > 0.6 else x - 1,
        lambda x, s: x * 2 if divmod(s, 0.25)[0] < 2.5 else x - 1,
        lambda x, s: x * 2 if s.hex() < "0x1.3" else x - 1,
    ],
)
def test_a_copy_or_a_method_of_the_value_keeps_it_keyed_by_value_or_follows_it(fn):
    # 0.5 and 0.55 take one branch with programs that read no input (the same program), 0.7 the other
    x = kiln.randn(8)
    _calls(fn, lambda s: ((x, s), {}), [0.5, 0.55, 0.7, 0.9, 0.5])
