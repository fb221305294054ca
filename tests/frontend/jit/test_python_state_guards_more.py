"""Python state held in neither a dict, a list nor a set, and reached through less direct paths.

Each case was silently wrong before ``snapshots.View`` and the paths ``reads.reach`` now follows: the
compiled call replayed the value its trace read (or skipped the store its trace made) with no reason
said. As in ``test_python_state_guards.py``, the state changes between calls and the compiled
function is compared with the same function run eagerly on the same state, call by call; then the
reason (a new trace naming the state, or eager calls with the store said) is checked.
"""

from __future__ import annotations

import argparse
import array
import collections
import contextvars
import dataclasses
import itertools
import sys
import types

import numpy as np
import pytest

import kiln

from .helpers import compiled_calls
from .test_python_state_guards import ATOL, RTOL, _against_eager, _reasons


@dataclasses.dataclass(slots=True)
class _Slotted:
    s: int = 1


class _Meta(type):
    base = 1

    @property
    def scale(cls):
        return cls.base


class _Configured(metaclass=_Meta):
    pass


def _deque():
    q = collections.deque([1, 2], maxlen=2)  # a window of recent values: appending drops the oldest
    return (lambda x: x * sum(q)), lambda i: q.append(i + 3)


def _array():
    a = array.array("i", [1, 2])
    return (lambda x: x * a[0]), lambda i: a.__setitem__(0, i + 1)


def _bytearray():
    b = bytearray(b"\x01")
    return (lambda x: x * b[0]), lambda i: b.__setitem__(0, i + 1)


def _mapping_proxy():
    table = {"s": 1}
    view = types.MappingProxyType(table)
    return (lambda x: x * view["s"]), lambda i: table.__setitem__("s", i + 1)


def _context_var():
    var = contextvars.ContextVar("kiln_test_scale", default=1)
    return (lambda x: x * var.get()), lambda i: var.set(i + 1)


def _slots_in_a_dict():
    state = {"cfg": _Slotted()}
    return (lambda x: x * state["cfg"].s), lambda i: setattr(state["cfg"], "s", i + 1)


def _metaclass_property():
    _Meta.base = 1
    return (lambda x: x * _Configured.scale), lambda i: setattr(_Meta, "base", i + 1)


def _helper_closure():
    alpha = 1

    def loss(x):
        return x * alpha

    def change(i):
        nonlocal alpha
        alpha = i + 1

    return (lambda x: loss(x)), change


def _helper_default():
    def scaled(x, s=1):
        return x * s

    return (lambda x: scaled(x)), lambda i: setattr(scaled, "__defaults__", (i + 1,))


def _namespace_in_a_dict():
    state = {"cfg": types.SimpleNamespace(s=1)}
    return (lambda x: x * state["cfg"].s), lambda i: setattr(state["cfg"], "s", i + 1)


def _parsed_arguments_in_a_list():
    args = argparse.Namespace(s=1)
    held = [args]
    return (lambda x: x * held[0].s), lambda i: setattr(args, "s", i + 1)


def _chain_map():
    defaults = {"s": 1}
    settings = collections.ChainMap({}, defaults)
    return (lambda x: x * settings["s"]), lambda i: defaults.__setitem__("s", i + 1)


def _user_dict_in_a_dict():
    table = collections.UserDict(s=1)
    state = {"table": table}
    return (lambda x: x * state["table"]["s"]), lambda i: table.__setitem__("s", i + 1)


# (ints: a float there would be read at each call or retraced, test_state_floats.py)
READS = {
    "deque": (_deque, "q[0] changed"),
    "array.array": (_array, "a changed: its contents (array)"),
    "bytearray": (_bytearray, "b changed: its contents (bytearray)"),
    "MappingProxyType": (_mapping_proxy, "view['s'] changed: 1 -> 2"),
    "ContextVar": (_context_var, "var.value changed: 1 -> 2"),
    "slots object in a dict": (_slots_in_a_dict, "state['cfg'].s changed: 1 -> 2"),
    "metaclass property": (_metaclass_property, "(metaclass of _Configured).base changed: 1 -> 2"),
    "helper's closure variable": (_helper_closure, "loss.<closure>.alpha changed: 1 -> 2"),
    "helper's default": (_helper_default, "scaled.__defaults__ changed: (1,) -> (2,)"),
    "SimpleNamespace in a dict": (_namespace_in_a_dict, "state['cfg'].s changed: 1 -> 2"),
    "argparse.Namespace in a list": (_parsed_arguments_in_a_list, "held[0].s changed: 1 -> 2"),
    "ChainMap": (_chain_map, "settings.maps[1]['s'] changed: 1 -> 2"),
    "UserDict in a dict": (_user_dict_in_a_dict, "state['table'].data['s'] changed: 1 -> 2"),
}


@pytest.mark.parametrize("kind", list(READS))
def test_state_read_by_the_call_changed_between_calls(kind):
    make, reason = READS[kind]
    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and reason in _reasons(f)[1], _reasons(f)


def _deque_appended():
    q = collections.deque(maxlen=3)

    def f(x):
        q.append(1)
        return x * len(q)

    return f, "the call changes q (deque.append)"


def _array_written():
    a = array.array("i", [1])

    def f(x):
        a[0] += 1
        return x * a[0]

    return f, "the call changed a,"


def _bytearray_written():
    b = bytearray(b"\x01")

    def f(x):
        b[0] += 1
        return x * b[0]

    return f, "the call changed b,"


def _slot_written():
    c = _Slotted()

    def f(x):
        c.s += 1
        return x * c.s

    return f, "the call changed c.s"


def _context_var_set():
    var = contextvars.ContextVar("kiln_test_count", default=1)

    def f(x):
        var.set(var.get() + 1)
        return x * var.get()

    return f, "the call changed var.value"


def _namespace_written():
    state = {"cfg": types.SimpleNamespace(calls=0)}

    def f(x):
        state["cfg"].calls += 1
        return x * state["cfg"].calls

    return f, "the call changed state['cfg'].calls"


WRITES = {
    "deque": _deque_appended,
    "array.array": _array_written,
    "bytearray": _bytearray_written,
    "slot": _slot_written,
    "ContextVar": _context_var_set,
    "SimpleNamespace in a dict": _namespace_written,
}


@pytest.mark.parametrize("kind", list(WRITES))
def test_state_the_call_writes_runs_eagerly(kind):
    def make():
        fn, _ = WRITES[kind]()
        return fn, lambda i: None

    f = _against_eager(make)
    assert compiled_calls(f) == [] and WRITES[kind]()[1] in _reasons(f)[-1], _reasons(f)


@pytest.mark.parametrize("held", ["dict entry", "attribute"])
def test_an_iterator_held_by_state_that_the_call_advances_runs_eagerly(held):
    def make():
        if held == "dict entry":
            state = {"ids": itertools.count(1)}
            return (lambda x: x * next(state["ids"])), lambda i: None
        trainer = types.SimpleNamespace(batches=iter(range(1, 100)))
        return (lambda x: x * next(trainer.batches)), lambda i: None

    f = _against_eager(make)
    path = "state['ids'], a count iterator" if held == "dict entry" else "trainer.batches, a range_iterator"
    assert compiled_calls(f) == [] and f"the call may consume {path}" in _reasons(f)[-1], _reasons(f)


def test_an_iterator_held_by_state_that_the_call_never_names_keeps_its_program():
    state = {"ids": itertools.count(1), "scale": 2}
    f = kiln.compile(lambda x: x * state["scale"], wait=True)
    for _ in range(4):
        next(state["ids"])
        np.testing.assert_allclose(f(kiln.ones(3)).numpy(), 2.0, rtol=RTOL, atol=ATOL)
    assert compiled_calls(f) == [3], _reasons(f)


@pytest.fixture
def settings(tmp_path, monkeypatch):
    """A module of the user's program (``import kiln_test_config``), removed after the test."""
    (tmp_path / "kiln_test_config.py").write_text("SCALE = 1\nCALLS = 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kiln_test_config", raising=False)  # (absent again after the test)
    import kiln_test_config  # noqa: PLC0415

    return kiln_test_config


@pytest.mark.parametrize("how", ["import", "from import"])
def test_a_module_imported_inside_the_function(how, settings):
    def imports(x):
        import kiln_test_config  # noqa: PLC0415

        return x * kiln_test_config.SCALE

    def imports_from(x):
        from kiln_test_config import SCALE  # noqa: PLC0415

        return x * SCALE

    def make():
        settings.SCALE = 1
        return (imports if how == "import" else imports_from), lambda i: setattr(settings, "SCALE", i + 1)

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "kiln_test_config.SCALE changed: 1 -> 2" in _reasons(f)[1], _reasons(f)


def test_a_global_of_a_users_module_that_the_call_sets_runs_eagerly(settings):
    config = settings

    def make():
        config.CALLS = 0

        def count(x):
            config.CALLS += 1
            return x * config.CALLS

        return count, lambda i: None

    f = _against_eager(make)
    assert compiled_calls(f) == [] and "the call changed config.CALLS" in _reasons(f)[-1], _reasons(f)
