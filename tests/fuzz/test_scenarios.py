"""The scenario kinds' instrument: programs print and read back, the harness adds no difference of
its own, and a compiled copy that skips the state changes of later calls is caught."""

from __future__ import annotations

import pytest

import kiln

from .kinds import GENERATORS, from_source, generate, parse_kinds
from .runner import run
from .stateful import differences, view

SCENARIO_KINDS = ("models", "optim", "pystate", "loops")


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_programs_read_back_from_their_source(kind):
    for seed in range(20):
        program = generate(seed, (kind,))
        again = from_source(program.source)
        assert again.source == program.source
        assert type(again) is type(program)


def test_kinds_mix_and_parse():
    mixed = {generate(seed).kind for seed in range(60)}
    assert mixed == set(GENERATORS)
    assert parse_kinds("all") == tuple(GENERATORS)
    assert parse_kinds("models, optim") == ("models", "optim")
    with pytest.raises(SystemExit, match="--kinds"):
        parse_kinds("models,nope")


@pytest.mark.parametrize("kind", SCENARIO_KINDS)
def test_no_difference_when_compiled_is_eager(kind, monkeypatch):
    """With KILN_JIT=0 both copies run eagerly: the harness itself must report nothing."""
    monkeypatch.setenv("KILN_JIT", "0")
    outcomes = [run(generate(seed, (kind,))) for seed in range(12 if kind == "models" else 30)]
    assert [str(o.difference or o.crash) for o in outcomes if o.finding] == []
    assert sum(o.calls["fallback"] for o in outcomes) > 0


@pytest.mark.parametrize("kind", SCENARIO_KINDS)
def test_a_compiled_copy_that_replays_nothing_is_caught(kind, monkeypatch):
    """A planted bug: the 'compiled' copy runs the function once, then returns that first result
    and changes no state. Every scenario changes its state per call, so each must be reported."""
    original = kiln.compile

    def frozen(fn, **kwargs):
        first = []

        def call(*args):
            if not first:
                first.append(fn(*args))
            return first[0]

        call.state = original(fn).state  # the runner reads the (empty) history
        return call

    monkeypatch.setattr(kiln, "compile", frozen)
    outcomes = [run(generate(seed, (kind,))) for seed in range(8)]
    assert all(o.difference is not None for o in outcomes), [str(o.crash) for o in outcomes if not o.difference]


def test_state_views_compare_containers_and_tensors():
    e = {"log": [1, kiln.tensor([1.0, 2.0])], "n": 2, "cfg": {"flag": True}}
    c = {"log": [1, kiln.tensor([1.0, 2.5])], "n": 2, "cfg": {"flag": True}}
    assert [d.where for d in differences("s", view(e), view(c), 1.0, 1e-6)] == ["s['log'][1]"]
    assert differences("s", view({"a": [1]}), view({"a": [1, 2]}), 1.0, 1e-6)[0].check == "container"
    assert differences("s", view({"a": 1}), view({"b": 1}), 1.0, 1e-6)[0].check == "container"
    assert differences("s", 1, True, 1.0, 1e-6)[0].check == "type"
    assert differences("s", 0.5, 0.5 + 1e-12, 1.0, 1e-9) == []


def test_optimizer_view_holds_hyperparameters_and_state():
    w = kiln.tensor([1.0, 2.0], requires_grad=True)
    opt = kiln.optim.Adam([w], lr=0.1, weight_decay=0.01)
    w.grad = kiln.tensor([0.5, -0.5])
    opt.step()
    seen = view(opt)
    assert seen["param_groups"][0]["weight_decay"] == 0.01
    assert set(seen["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
