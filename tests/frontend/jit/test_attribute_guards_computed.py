"""Guards on the user's objects' attributes where the traced call may read them by computed names (issue 33).

``getattr``/``hasattr`` with a computed name, ``vars``, ``__dict__``, ``attrgetter`` under another
name, a property of a C reader, ``__getattr__`` on the class, a library's reader given the object,
the user's code run with the watch paused or another profiler: a change to any attribute of the
objects so read must make a new trace (the whole table is guarded), with eager's values; a read by
computed name of a function's own argument counts for that object only.
"""

from __future__ import annotations

import dataclasses
import operator

import kiln
import kiln.nn as nn

from .test_attribute_guards import _against_eager, _close, _Holder, _reasons, _specializations


def _changed_after_two_calls(f, change):
    """``f`` compiled, called 5 times on ``arange(3)`` against eager, with ``change()`` after the second call."""

    def between(i):
        if i == 1:
            change()

    return _against_eager(f, between, 5)


def test_getattr_by_computed_name_keeps_every_attribute_guarded():
    h = _Holder()
    names = ["shift"]

    def f(x):
        return x * getattr(h, names[0])

    def between(i):
        if i == 1:
            h.count += 1  # any attribute

    g = _against_eager(f, between, 5)
    assert _specializations(g) == 2, _reasons(g)
    assert any("count changed: 0 -> 1" in r for r in _reasons(g)), _reasons(g)


def test_getattr_and_hasattr_with_constant_names_read_those_names():
    h = _Holder()

    def f(x):
        return x * getattr(h, "shift", 0.0) + hasattr(h, "bonus_of_the_hasattr_test")

    def between(i):
        h.count += 1  # not read: no new trace
        if i == 1:
            h.shift = 2.5
        elif i == 3:
            h.bonus_of_the_hasattr_test = 1  # absent when traced: hasattr's answer changes

    g = _against_eager(f, between, 7)
    reasons = _reasons(g)
    assert _specializations(g) == 3, reasons
    assert any("shift changed: 1.0 -> 2.5" in r for r in reasons), reasons
    assert any("bonus_of_the_hasattr_test changed: (absent) -> 1" in r for r in reasons), reasons


def test_getattr_by_computed_name_on_an_argument_guards_that_object_whole():
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc0, self.fc1 = nn.Linear(3, 3), nn.Linear(3, 3)
            self.depth = 2
            self.note = 0

        def forward(self, x):
            for i in range(self.depth):
                x = getattr(self, f"fc{i}")(x)  # a computed name: any attribute of self counts
            return x

    class Runner:
        def __init__(self) -> None:
            kiln.manual_seed(0)
            self.net = Stack()
            self.iter_num = 0

    r = Runner()

    def f(x):
        return r.net(x)

    def between(i):
        r.iter_num += 1  # the runner is read by names: no new trace
        if i == 2:
            r.net.note = 1  # the stack is read by computed names: a new trace

    g = _against_eager(f, between, 6, kiln.ones(2, 3))
    assert _specializations(g) == 2, _reasons(g)
    assert any("note" in reason for reason in _reasons(g)), _reasons(g)


def _first_of(obj, names):
    return getattr(obj, names[0])  # a computed name, on whichever object each call is given


def test_helper_reading_each_argument_by_computed_name_guards_each_object_whole():
    a, b = _Holder(), _Holder()
    names = ["shift"]

    def f(x):
        return x * _first_of(a, names) + _first_of(b, names)

    def between(i):
        if i == 1:
            b.count += 1  # b, the second object the helper read

    g = _against_eager(f, between, 5)
    assert _specializations(g) == 2, _reasons(g)


def test_dict_of_self_in_a_method_guards_that_object_whole():
    class Weights:
        def __init__(self) -> None:
            self.a, self.b = 1.0, 2.0

        def total(self):
            return sum(v for v in self.__dict__.values() if isinstance(v, float))

    class Runner:
        def __init__(self) -> None:
            self.weights = Weights()
            self.iter_num = 0

    r = Runner()

    def f(x):
        return x * r.weights.total()

    def between(i):
        r.iter_num += 1  # read by names: no new trace
        if i == 2:
            r.weights.c = 4.0  # a new attribute total() sums

    g = _against_eager(f, between, 6)
    assert _specializations(g) == 2, _reasons(g)


def test_vars_keeps_every_attribute_guarded():
    h = _Holder()

    def f(x):
        return x * sum(v for v in vars(h).values() if isinstance(v, float))

    g = _changed_after_two_calls(f, lambda: setattr(h, "extra", 10.0))  # a new attribute the sum reads
    assert _specializations(g) == 2, _reasons(g)


_GET_SHIFT = operator.attrgetter("shift")


def test_attrgetter_under_another_name_keeps_every_attribute_guarded():
    h = _Holder()

    def f(x):
        return x * _GET_SHIFT(h)

    g = _changed_after_two_calls(f, lambda: setattr(h, "shift", 7.0))
    assert _specializations(g) == 2, _reasons(g)


def test_property_of_a_c_reader_keeps_every_attribute_guarded():
    class Opaque:
        scale = property(operator.attrgetter("_scale"))

        def __init__(self) -> None:
            self._scale = 2.0

    obj = Opaque()

    def f(x):
        return x * obj.scale

    g = _changed_after_two_calls(f, lambda: setattr(obj, "_scale", 3.0))
    assert _specializations(g) == 2, _reasons(g)


def test_getattr_hook_on_the_class_keeps_every_attribute_guarded():
    class Dynamic:
        def __init__(self) -> None:
            self.values = {"scale": 2.0}
            self.count = 0

        def __getattr__(self, name):
            return self.values[name]

    obj = Dynamic()

    def f(x):
        return x * obj.scale

    def between(i):
        if i == 1:
            obj.count += 1

    g = _against_eager(f, between, 5)
    assert _specializations(g) == 2, _reasons(g)


@dataclasses.dataclass
class _Cfg:
    scale: float = 2.0
    steps: int = 0


def test_library_reader_given_the_object_keeps_every_attribute_guarded():
    cfg = _Cfg()

    def f(x):
        return x * dataclasses.asdict(cfg)["scale"]  # dataclasses reads the fields with getattr

    g = _changed_after_two_calls(f, lambda: setattr(cfg, "scale", 3.0))
    assert _specializations(g) == 2, _reasons(g)


def test_dict_of_the_object_keeps_every_attribute_guarded():
    h = _Holder()
    h.gain_of_the_dict_test = 2.0  # a name no code that runs spells
    suffix = "of_the_dict_test"

    def f(x):
        return x * h.__dict__["gain_" + suffix]  # a computed key

    g = _changed_after_two_calls(f, lambda: setattr(h, "gain_of_the_dict_test", 4.0))
    assert _specializations(g) == 2, _reasons(g)


def test_library_code_reading_by_computed_name_keeps_every_attribute_guarded():
    import string  # noqa: PLC0415 - a library whose Python code reads attributes with getattr

    cfg = _Cfg()

    def f(x):
        return x * float(string.Formatter().vformat("{0.scale}", (cfg,), {}))

    g = _changed_after_two_calls(f, lambda: setattr(cfg, "scale", 3.0))
    assert _specializations(g) == 2, _reasons(g)


class _Knobs:
    def __init__(self) -> None:
        self.knob_read_unseen = 2.0  # a name only the unwatched code spells


def test_users_code_run_with_the_watch_paused_keeps_every_attribute_guarded():
    knobs = _Knobs()

    class Scale(nn.Module):
        kiln_only = True  # claims to call no user code: its forward runs with the watch paused

        def forward(self, x):
            return x * knobs.knob_read_unseen

    m = Scale()

    def f(x):
        return m(x) + knobs.__class__.__name__.count("K")  # names knobs, reads no knob

    g = _changed_after_two_calls(f, lambda: setattr(knobs, "knob_read_unseen", 5.0))
    assert _specializations(g) == 2, _reasons(g)


def test_another_profiler_keeps_every_attribute_guarded():
    import sys  # noqa: PLC0415

    knobs = _Knobs()

    def helper():
        return knobs.knob_read_unseen  # runs unseen: the other profiler holds the hook

    def f(x):
        return x * helper()

    g = kiln.compile(f)
    x = kiln.arange(3.0)
    sys.setprofile(lambda *args: None)
    try:
        for i in range(5):
            _close(g(x), f(x))
            if i == 1:
                knobs.knob_read_unseen = 5.0
    finally:
        sys.setprofile(None)
    assert _specializations(g) == 2, _reasons(g)
