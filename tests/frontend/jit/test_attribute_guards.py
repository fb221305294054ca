"""Guards on the user's objects' attributes depend on the attributes the traced call could read (issue 33).

A training loop compiles a step that closes over ``self`` and sets other attributes of ``self``
between steps (minGPT's trainer: ``self.iter_num += 1``, ``self.iter_time``, ``self.loss``): the
step must stay one specialization. An attribute the call reads -- on the instance, its class or its
slots, or added later under a name it reads -- must still make a new trace, with eager's values;
and where the code reads attributes by computed names (``getattr``, ``vars``, ``attrgetter``, a
library's reader given the object), any change counts.
"""

from __future__ import annotations

import time

import numpy as np

import kiln
import kiln.nn as nn
import kiln.nn.functional as F

from .helpers import compiled_calls, events, state_of

RTOL, ATOL = 1e-5, 1e-6


def _close(a, b) -> None:
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=RTOL, atol=ATOL)


def _reasons(f) -> list[str]:
    return [e.detail for e in events(f, "compiled")]


def _specializations(f) -> int:
    return len(state_of(f).specializations)


def _against_eager(f, between, calls: int, x=None):
    """``f`` compiled and called ``calls`` times on ``x`` (``arange(3)``), each call's result compared with
    ``f``'s own, and ``between(i)`` run after call ``i`` (the caller's changes of state); the compiled ``f``."""
    g = kiln.compile(f)
    x = kiln.arange(3.0) if x is None else x
    for i in range(calls):
        _close(g(x), f(x))
        between(i)
    return g


# ---------------------------------------------------------------------- the trainer
class _Trainer:
    """minGPT's trainer, in short: the compiled step closes over ``self``; the loop sets attributes."""

    def __init__(self, compiled: bool) -> None:
        kiln.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.optimizer = kiln.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.grad_norm_clip = 1.0
        self.iter_num = 0
        self.iter_time = time.time()
        self.loss = None
        self.history: dict = {}

        def step(x, y):
            logits = self.model(x)
            loss = F.cross_entropy(logits, y)
            self.model.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_norm_clip)
            self.optimizer.step()
            return loss.detach()

        self.step = kiln.compile(step, wait=True) if compiled else step

    def run(self, xs, ys) -> list:
        losses = []
        for x, y in zip(xs, ys, strict=True):
            self.loss = self.step(x, y)
            losses.append(self.loss)
            self.iter_num += 1
            now = time.time()
            self.iter_dt = now - self.iter_time  # a new attribute after the first step
            self.iter_time = now
            self.history[self.iter_num] = float(self.loss)
        return losses


def _data(n: int):
    rng = np.random.default_rng(0)
    xs = [kiln.tensor(rng.standard_normal((5, 8)).astype(np.float32)) for _ in range(n)]
    ys = [kiln.tensor(rng.integers(0, 4, 5)) for _ in range(n)]
    return xs, ys


def test_trainer_setting_attributes_it_does_not_read_keeps_one_specialization():
    xs, ys = _data(8)
    compiled, eager = _Trainer(True), _Trainer(False)
    got, expected = compiled.run(xs, ys), eager.run(xs, ys)
    for a, b in zip(got, expected, strict=True):
        _close(a, b)
    for (name, a), (_, b) in zip(compiled.model.state_dict().items(), eager.model.state_dict().items(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL, atol=ATOL, err_msg=name)
    assert _specializations(compiled.step) <= 2, _reasons(compiled.step)
    assert sum(compiled_calls(compiled.step)) >= 6
    assert not events(compiled.step, "recompile limit")


def test_explain_lists_the_attributes_the_step_reads_not_the_loops():
    xs, ys = _data(3)
    trainer = _Trainer(True)
    trainer.run(xs, ys)
    summary = kiln.explain(trainer.step).summary()
    assert "1 specialization(s), 0 trace break(s), 0 recompilation(s)" in summary.splitlines()[0], summary
    assert "self.grad_norm_clip == 1.0" in summary and "self.model is the same Sequential object" in summary
    assert "iter_num" not in summary and "iter_time" not in summary, summary


def test_trainer_attribute_the_step_reads_still_retraces():
    xs, ys = _data(6)
    compiled, eager = _Trainer(True), _Trainer(False)
    for trainer in (compiled, eager):
        trainer.run(xs[:3], ys[:3])
        trainer.grad_norm_clip = 1e-3
        trainer.run(xs[3:], ys[3:])
    for (name, a), (_, b) in zip(compiled.model.state_dict().items(), eager.model.state_dict().items(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL, atol=ATOL, err_msg=name)
    assert any("grad_norm_clip changed: 1.0 -> 0.001" in r for r in _reasons(compiled.step)), _reasons(compiled.step)


# ---------------------------------------------------------------------- reads by name
class _Holder:
    scale = 2.0  # a class attribute: an instance attribute of the same name shadows it

    def __init__(self) -> None:
        self.shift = 1.0
        self.count = 0
        self.w = kiln.ones(3)


def _scaled(h):
    def f(x):
        return x * h.scale + h.shift

    return f


def test_unread_attribute_changed_between_calls_makes_no_new_trace():
    h = _Holder()
    f = _scaled(h)

    def between(i):
        h.count += 1
        h.note = f"call {i}"  # added, then changed

    g = _against_eager(f, between, 5)
    assert _specializations(g) == 1 and sum(compiled_calls(g)) >= 3


def test_object_passed_as_an_argument_unread_attribute_changes():
    h = _Holder()

    def f(x, obj):
        return x * obj.shift

    g = kiln.compile(f)
    x = kiln.arange(3.0)
    for _ in range(5):
        _close(g(x, h), f(x, h))
        h.count += 1
    assert _specializations(g) == 1


def test_read_attribute_replaced_retraces_with_eagers_values():
    h = _Holder()
    f = _scaled(h)

    def between(i):
        if i == 1:
            h.shift = -3.0

    g = _against_eager(f, between, 6)
    assert any("shift changed: 1.0 -> -3.0" in r for r in _reasons(g)), _reasons(g)


def test_model_replaced_retraces():
    class Runner:
        def __init__(self) -> None:
            self.model = nn.Linear(3, 2)

    kiln.manual_seed(0)
    r = Runner()

    def f(x):
        return r.model(x)

    def between(i):
        if i == 1:
            r.model = nn.Linear(3, 2)

    g = _against_eager(f, between, 5, kiln.ones(4, 3))
    assert any("model" in reason for reason in _reasons(g)), _reasons(g)
    assert _specializations(g) == 2


def test_instance_attribute_shadowing_a_class_attribute_retraces():
    h = _Holder()
    f = _scaled(h)

    def between(i):
        if i == 1:
            h.scale = 5.0  # new on the instance: shadows _Holder.scale
        elif i == 3:
            del h.scale  # the class's again

    g = _against_eager(f, between, 7)
    reasons = _reasons(g)
    assert any("scale changed: (absent) -> 5.0" in r for r in reasons), reasons


def test_class_attribute_changed_retraces():
    class Config:
        scale = 2.0
        made = 0  # a class-level count the call never reads

    cfg = Config()

    def f(x):
        return x * cfg.scale

    def between(i):
        Config.made += 1
        if i == 1:
            Config.scale = 3.0

    g = _against_eager(f, between, 5)
    assert _specializations(g) == 2, _reasons(g)
    assert any("Config.scale changed: 2.0 -> 3.0" in r for r in _reasons(g)), _reasons(g)


def test_slot_changed_retraces():
    class Slotted:
        __slots__ = ("scale", "count")

        def __init__(self) -> None:
            self.scale = 2.0
            self.count = 0

    s = Slotted()

    def f(x):
        return x * s.scale

    def between(i):
        s.count += 1  # not read
        if i == 2:
            s.scale = 4.0

    g = _against_eager(f, between, 6)
    assert _specializations(g) == 2, _reasons(g)
    assert any("scale changed: 2.0 -> 4.0" in r for r in _reasons(g)), _reasons(g)


def test_property_reads_the_attributes_its_getter_spells():
    class Scheduled:
        def __init__(self) -> None:
            self._base = 2.0
            self.step_count = 0

        @property
        def scale(self) -> float:
            return self._base * 0.5

    obj = Scheduled()

    def f(x):
        return x * obj.scale

    def between(i):
        obj.step_count += 1
        if i == 2:
            obj._base = 6.0

    g = _against_eager(f, between, 6)
    assert _specializations(g) == 2, _reasons(g)


def test_user_module_attribute_counter_does_not_retrace():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.scale = 2.0
            self.calls = 0

        def forward(self, x):
            return self.lin(x) * self.scale

    kiln.manual_seed(0)
    net = Net()

    def between(i):
        net.calls += 1
        if i == 3:
            net.scale = 0.5

    g = _against_eager(net, between, 6, kiln.ones(2, 3))
    assert _specializations(g) == 2, _reasons(g)
