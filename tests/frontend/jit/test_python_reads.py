"""Python values a trace reads or writes besides tensors (kiln issue 35): containers and objects
reached from the function's globals, closures and arguments.

Each test calls the compiled function and the plain function side by side over several calls,
with the Python state changed inside the call (a counter, a list appended to) or between calls
(a config); the results and the state after each call must equal eager's. A store into a
container from outside the call breaks the trace with the reason and the user's line; a changed
value the trace read makes a new specialization, whose reason names the entry.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn

from .helpers import compiled_calls, events

counts = {"step": 0}
seen: list = []
CFG = {"scale": 2.0}


def _close(a, b) -> None:
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-6, atol=1e-7)


def _breaks(f) -> list[str]:
    """Why traces stopped: for good ("break"), or on a change of Python state, which the next calls
    of the key forgive twice (a lazy initialization) before they run eagerly for good."""
    return [e.detail for e in events(f, "break")] + [
        e.detail.split("; this call ran eagerly")[0]
        for e in events(f, "not cached")
        if "a change made once" in e.detail
    ]


def _compiled_reasons(f) -> list[str]:
    return [e.detail for e in events(f, "compiled")]


# ---------------------------------------------------------------------- stores into containers
def test_counter_dict_in_a_closure():
    def make():
        counter = {"step": 0}

        def f(x):
            counter["step"] += 1
            return x * counter["step"]

        return f, counter

    (f, c_eager), (g_fn, c_compiled) = make(), make()
    g = kiln.compile(g_fn)
    x = kiln.ones(3)
    for _ in range(4):
        _close(g(x), f(x))
        assert c_compiled == c_eager
    assert c_compiled["step"] == 4
    (reason,) = set(_breaks(g))
    line = g_fn.__code__.co_firstlineno + 1  # counter["step"] += 1
    assert "counter['step']" in reason and f"test_python_reads.py:{line}" in reason, reason


def _global_counter(x):
    counts["step"] += 1
    return x * counts["step"]


def test_counter_dict_in_a_global():
    g = kiln.compile(_global_counter)
    x = kiln.ones(2)
    counts["step"] = 0
    compiled = [g(x) for _ in range(4)]
    assert counts["step"] == 4
    for i, y in enumerate(compiled, 1):
        np.testing.assert_allclose(y.numpy(), np.full(2, float(i)))
    assert any("counts" in b for b in _breaks(g))


def _appends(x):
    seen.append(len(seen))
    return x + float(len(seen))


def test_list_appended_to():
    g = kiln.compile(_appends)
    seen.clear()
    got = [g(kiln.zeros(2)) for _ in range(4)]
    assert seen == [0, 1, 2, 3]
    for i, y in enumerate(got, 1):
        np.testing.assert_allclose(y.numpy(), np.full(2, float(i)))
    (reason,) = set(_breaks(g))
    assert "seen" in reason and "append" in reason and "test_python_reads.py" in reason


def test_dict_argument_mutated():
    def f(x, state):
        state["n"] += 1
        return x * state["n"]

    g = kiln.compile(f)
    s_eager, s_compiled = {"n": 0}, {"n": 0}
    x = kiln.ones(2)
    for _ in range(4):
        _close(g(x, s_compiled), f(x, s_eager))
        assert s_compiled == s_eager
    # a break, not a new trace at every call
    assert len(state_of_specs(g)) == 0 and _breaks(g)


def test_set_and_delete_in_a_closure_container():
    registry = {"a": 1, "b": 2}
    names = set()

    def f(x):
        names.add("seen")
        del registry["a"]
        return x + 1.0

    g = kiln.compile(f)
    g(kiln.ones(2))
    assert names == {"seen"} and registry == {"b": 2}
    (reason,) = _breaks(g)
    assert "names" in reason and "add" in reason


def test_a_modules_own_dict_changed_in_forward_runs_eagerly():
    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.stats = {"calls": 0}

        def forward(self, x):
            self.stats["calls"] += 1
            return self.lin(x) * float(self.stats["calls"])

    kiln.manual_seed(0)
    m = Counting()
    g = kiln.compile(m)
    x = kiln.ones(1, 2)
    for i in range(1, 4):
        with kiln.no_grad():
            expected = m.lin(x) * float(2 * i - 1)
            _close(g(x), expected)
            m(x)  # an eager call in between: both count
    assert m.stats["calls"] == 6
    assert any("self.stats['calls']" in b for b in _breaks(g)), _breaks(g)


def test_a_store_into_a_container_with_fullgraph_raises_with_the_line():
    table = {}

    def f(x):
        table["last"] = 1.0
        return x + 1.0

    g = kiln.compile(f, fullgraph=True)
    with pytest.raises(kiln.jit.TraceBreakError, match=r"table\['last'\].*test_python_reads.py"):
        g(kiln.ones(2))


def test_local_containers_are_no_hazard():
    def f(x):
        out = {}
        parts = []
        for i in range(3):
            parts.append(x * float(i))
        out["sum"] = parts[0] + parts[1] + parts[2]
        return out["sum"]

    g = kiln.compile(f)
    x = kiln.arange(3.0)
    for _ in range(3):
        _close(g(x), f(x))
    assert not _breaks(g) and sum(compiled_calls(g)) == 2


def state_of_specs(g):
    return [e for e in events(g, "compiled")]


# ---------------------------------------------------------------------- values read, changed between calls
def _scaled(x):
    return x * CFG["scale"]


def test_global_config_dict_entry_changed_between_calls():
    g = kiln.compile(_scaled)
    x = kiln.ones(2)
    for scale in (2.0, 2.0, 3.0, 3.0, 0.5):
        CFG["scale"] = scale
        np.testing.assert_allclose(g(x).numpy(), np.full(2, scale))
    CFG["scale"] = 2.0
    assert sum(compiled_calls(g)) >= 2  # the compiled programs ran
    assert any("CFG['scale']" in r and "changed" in r for r in _compiled_reasons(g))


def test_a_config_given_as_a_default_argument_is_guarded_and_watched():
    defaults = {"scale": 2.0}
    log: list = []

    def scaled(x, cfg=defaults):
        return x * cfg["scale"]

    def logging(x, seen=log):
        seen.append(1)
        return x + 1.0

    g, h = kiln.compile(scaled), kiln.compile(logging)
    x = kiln.ones(2)
    for scale in (2.0, 2.0, 3.0, 3.0):
        defaults["scale"] = scale
        np.testing.assert_allclose(g(x).numpy(), np.full(2, scale))
        h(x)
    assert any("default cfg['scale'] changed: 2.0 -> 3.0" in r for r in _compiled_reasons(g)), _compiled_reasons(g)
    assert log == [1, 1, 1, 1]
    assert any("default seen (list.append)" in b for b in _breaks(h)), _breaks(h)


class _Config:
    def __init__(self) -> None:
        self.scale = 2.0
        self.table = {"shift": 1.0}
        self.inner = None


def test_config_attributes_and_nested_entries_changed_between_calls():
    cfg = _Config()
    cfg.inner = _Config()

    def f(x):
        return x * cfg.scale + cfg.table["shift"] + cfg.inner.table["shift"]

    g = kiln.compile(f)
    x = kiln.ones(2)
    for i in range(6):
        _close(g(x), f(x))
        if i == 1:
            cfg.scale = 5.0
        elif i == 3:
            cfg.inner.table["shift"] = -4.0
    assert sum(compiled_calls(g)) >= 3
    reasons = _compiled_reasons(g)
    assert any("['shift']" in r for r in reasons), reasons


def test_module_config_dict_changed_between_calls():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.cfg = {"k": 2.0, "nested": {"bias": 0.0}}

        def forward(self, x):
            return self.lin(x) * self.cfg["k"] + self.cfg["nested"]["bias"]

    kiln.manual_seed(0)
    m = Scaled()
    g = kiln.compile(m)
    x = kiln.ones(2, 3)
    for i in range(6):
        _close(g(x), m(x))
        if i == 1:
            m.cfg["k"] = 3.0
        elif i == 3:
            m.cfg["nested"]["bias"] = 1.5
    assert sum(compiled_calls(g)) >= 3


def test_argument_object_config_read_through_attributes():
    def f(x, cfg):
        return x * cfg.table["shift"]

    g = kiln.compile(f)
    cfg = _Config()
    x = kiln.ones(2)
    for i in range(5):
        _close(g(x, cfg), f(x, cfg))
        cfg.table["shift"] = float(i)


def test_a_list_of_layers_that_grows_between_calls():
    kiln.manual_seed(0)
    layers = [nn.Linear(2, 2)]

    def f(x):
        for layer in layers:
            x = layer(x)
        return x

    g = kiln.compile(f)
    x = kiln.ones(1, 2)
    for i in range(5):
        _close(g(x), f(x))
        if i == 2:
            layers.append(nn.Linear(2, 2))


def test_lr_scheduler_between_compiled_steps_makes_no_new_specialization():
    kiln.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = kiln.optim.SGD(model.parameters(), lr=0.1)
    sched = kiln.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def step(x):
        opt.zero_grad()
        loss = model(x).pow(2).sum()
        loss.backward()
        opt.step()
        return loss

    g = kiln.compile(step)
    x = kiln.ones(4, 3)
    g(x)
    g(x)  # the second call sees .grad set: a specialization of its own
    made = len(events(g, "compiled"))
    for _ in range(6):
        sched.step()
        g(x)
    assert opt.param_groups[0]["lr"] == 0.1 * 0.5**6
    assert len(events(g, "compiled")) == made, _compiled_reasons(g)
    assert not _breaks(g) and sum(compiled_calls(g)) >= 6


# ---------------------------------------------------------------------- explain
def test_explain_lists_the_python_values_read():
    cfg = {"scale": 2.0, "mode": "fast"}

    def f(x):
        y = x * cfg["scale"]
        return y if cfg["mode"] == "fast" else y + 1.0

    report = kiln.explain(f, kiln.ones(2))
    reads = report.specializations[0].python_reads
    whats = {r.what: r for r in reads}
    assert "cfg['scale'] == 2.0" in whats and whats["cfg['scale'] == 2.0"].kind == "guard"
    assert "cfg['mode'] == 'fast'" in whats
    assert whats["cfg['scale'] == 2.0"].loc is not None
    assert whats["cfg['scale'] == 2.0"].loc.line == f.__code__.co_firstlineno + 1
    text = report.summary()
    assert "Python values read" in text and "cfg['scale'] == 2.0" in text


def test_a_new_list_of_tensors_as_argument_each_call_is_no_new_trace():
    # the arguments' own lists and dicts are the call's key (shapes), never guarded by identity
    def f(xs, opts):
        return xs[0] * opts["k"] + xs[1]

    g = kiln.compile(f)
    for i in range(4):
        xs = [kiln.full((2,), float(i)), kiln.ones(2)]
        _close(g(xs, {"k": 2.0}), f(xs, {"k": 2.0}))
    assert len(events(g, "compiled")) == 1 and sum(compiled_calls(g)) == 3


class Settings:
    """Configuration in class attributes, read through the class."""

    scale = 2.0


def _by_class(x):
    return x * Settings.scale


def test_a_class_attribute_changed_between_calls():
    g = kiln.compile(_by_class)
    x = kiln.ones(2)
    try:
        for scale in (2.0, 2.0, 5.0, 5.0):
            Settings.scale = scale
            np.testing.assert_allclose(g(x).numpy(), np.full(2, scale))
    finally:
        Settings.scale = 2.0
    assert sum(compiled_calls(g)) == 2
    assert any("Settings.scale changed: 2.0 -> 5.0" in r for r in _compiled_reasons(g)), _compiled_reasons(g)


def test_globals_of_a_helper_in_another_module():
    # the compiled function names only the helper: the helper's own globals are guarded and watched
    from . import _helper_globals as helper

    def f(x):
        return helper.scaled(x)

    g = kiln.compile(f)
    x = kiln.ones(2)
    try:
        for scale, shift in ((2.0, 0.0), (2.0, 0.0), (3.0, 0.0), (3.0, 0.0), (3.0, 1.0), (3.0, 1.0)):
            helper.SCALE, helper.TABLE["shift"] = scale, shift
            np.testing.assert_allclose(g(x).numpy(), np.full(2, scale + shift))
    finally:
        helper.SCALE, helper.TABLE["shift"] = 2.0, 0.0
    reasons = _compiled_reasons(g)
    assert any("_helper_globals.SCALE changed: 2.0 -> 3.0" in r for r in reasons), reasons
    assert any("_helper_globals.TABLE['shift'] changed: 0.0 -> 1.0" in r for r in reasons), reasons
    assert sum(compiled_calls(g)) == 3

    h = kiln.compile(lambda x: helper.logged(x))
    helper.LOG.clear()
    for _ in range(3):
        h(x)
    assert helper.LOG == [1, 1, 1]
    assert any("_helper_globals.LOG (list.append)" in b for b in _breaks(h)), _breaks(h)


def test_a_read_reported_by_the_traced_code_is_listed_by_explain():
    # what makes a Python value a graph input (an optimizer's lr) says so through Trace.on_python_read
    from kiln.frontend.jit import state

    def f(x):
        state.current.get().on_python_read("opt.param_groups[0]['lr']", "input")
        return x * 2.0

    report = kiln.explain(f, kiln.ones(2))
    (read,) = [r for r in report.specializations[0].python_reads if r.kind == "input"]
    assert read.what == "opt.param_groups[0]['lr']" and read.loc.line == f.__code__.co_firstlineno + 1
    assert "input  opt.param_groups[0]['lr']" in report.summary()
