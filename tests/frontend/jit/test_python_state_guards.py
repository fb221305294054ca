"""Python state a traced call reads through less direct paths: each one a guard, never a stale constant.

Every case changes the state between calls and compares the compiled function with the same
function run eagerly on the same state, call by call (the values a stale constant would give
differ from the second call on), then checks how the compiled function took the change: a new
trace whose reason names the state, or eager calls with the reason said.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest

import kiln

from .helpers import compiled_calls, events

RTOL, ATOL = 1e-6, 1e-7


def _against_eager(make, calls: int = 4):
    """``make() -> (fn, change)``: run a fresh pair eagerly and compiled, calling ``change(i)`` before
    call ``i``; the values must agree call by call. Returns the compiled function."""
    results = []
    for compiled in (False, True):
        fn, change = make()
        f = kiln.compile(fn, wait=True) if compiled else fn
        outs = []
        for i in range(calls):
            change(i)
            outs.append(f(kiln.ones(3)).numpy().copy())
        results.append((outs, f))
    (expected, _), (got, f) = results
    for call, (a, b) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"call {call}")
    return f


def _reasons(f) -> list[str]:
    return [e.detail for e in events(f)]


def test_a_default_argument_of_a_function_the_call_runs():
    def make():
        cfg = {"scale": 1}  # (ints: a float there is read at each call, test_state_floats.py)

        def helper(x, c=cfg):
            return x * c["scale"]

        return (lambda x: helper(x) + 1), lambda i: cfg.__setitem__("scale", i + 1)

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "<default c>['scale'] changed: 1 -> 2" in _reasons(f)[1]


def test_the_keywords_of_a_partial():
    def make():
        p = functools.partial(lambda x, s: x * s, s=1.0)
        return (lambda x: p(x)), lambda i: p.keywords.__setitem__("s", float(i + 1))

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "keywords['s'] changed" in _reasons(f)[1]


def test_the_object_a_bound_method_in_a_closure_belongs_to():
    class Scaler:
        def __init__(self) -> None:
            self.s = 1  # (an int: a float there is read at each call, test_state_floats.py)

        def scaled(self, x):
            return x * self.s

    def make():
        c = Scaler()
        scaled = c.scaled
        return (lambda x: scaled(x)), lambda i: setattr(c, "s", i + 1)

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "__self__.s changed: 1 -> 2" in _reasons(f)[1]


@pytest.mark.parametrize("kind", ["module", "object"])
def test_a_class_attribute_read_through_an_instance(kind):
    class Scaled(kiln.nn.Module):
        scale = 1.0

        def forward(self, x):
            return x * self.scale

    class Plain:
        scale = 1.0

        def __call__(self, x):
            return x * self.scale

    cls = Scaled if kind == "module" else Plain

    def make():
        cls.scale = 1.0
        m = cls()
        return (lambda x: m(x)), lambda i: setattr(cls, "scale", float(i + 1))

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "scale changed: 1.0 -> 2.0" in _reasons(f)[1], _reasons(f)


_ARRAYS = {
    "small": lambda: np.array([1.0, 5.0]),
    # past the 4,096 elements that were once the limit of a guard by contents (stale beyond it)
    "large": lambda: np.arange(100_000.0),
    "fortran order": lambda: np.asfortranarray(np.arange(20_000.0).reshape(100, 200)),
    "strided view": lambda: np.arange(40_000.0)[::2],
    "float32": lambda: np.arange(10_000, dtype=np.float32),
    "object": lambda: np.array([1.0, 5.0, None], dtype=object),
}


@pytest.mark.parametrize("kind", list(_ARRAYS))
def test_a_value_python_reads_out_of_a_numpy_array(kind):
    def make():
        table = _ARRAYS[kind]()
        first = (0,) * table.ndim
        return (lambda x: x * float(table[first])), lambda i: table.__setitem__(first, float(i + 1))

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "a value of the numpy array" in _reasons(f)[1]


def test_a_dataset_shuffled_in_place_between_calls():
    data = np.random.default_rng(0).random((20_000, 4))

    def make():
        order = np.arange(len(data))

        def change(i):
            np.random.default_rng(i).shuffle(order)

        return (lambda x: x * float(data[order[0], 0])), change

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "order changed" in _reasons(f)[1]


def test_a_read_only_array_is_guarded_by_identity_without_a_copy(tmp_path):
    from kiln.frontend.jit.snapshots import Contents  # noqa: PLC0415

    path = tmp_path / "table.npy"
    np.save(path, np.arange(100_000.0))
    table = np.load(path, mmap_mode="r")  # nothing can write it: no copy to compare with
    frozen = np.arange(10.0)
    frozen.flags.writeable = False
    assert Contents(table).data is None and Contents(frozen).data is None and Contents(frozen[2:]).data is None
    f = kiln.compile(lambda x: x * float(table[7]) + float(frozen[3]), wait=True)
    for _ in range(3):
        np.testing.assert_allclose(f(kiln.ones(3)).numpy(), 10.0, rtol=RTOL, atol=ATOL)
    assert sum(compiled_calls(f)) == 2


def test_an_array_too_large_to_copy_makes_the_call_run_eagerly(monkeypatch):
    from kiln.frontend.jit import snapshots  # noqa: PLC0415

    monkeypatch.setattr(snapshots, "GUARDED_BYTES", 1 << 16)  # (a test's stand-in for 64 MiB)

    def make():
        data = np.arange(20_000.0)  # 160 KB
        return (lambda x: x * float(data[0])), lambda i: data.__setitem__(0, float(i + 1))

    f = _against_eager(make)
    assert compiled_calls(f) == [] and "a numpy array of 0.2 MiB in Python state" in _reasons(f)[0]


def test_a_large_numpy_array_the_call_writes_runs_eagerly():
    """A store into Python state's array is not something a compiled call repeats: each call runs
    eagerly, with the reason said (a compiled call stored nothing before, past 4,096 elements)."""
    counts = np.zeros(10_000)

    def count(x):
        counts[0] += 1
        return x * 2

    f = kiln.compile(count, wait=True)
    for _ in range(3):
        f(kiln.ones(3))
    assert counts[0] == 3 and compiled_calls(f) == []
    assert "the call changed counts" in _reasons(f)[0]


def test_a_numpy_argument_changed_in_place_that_python_reads():
    def fn(x, a):
        return x * float(a.max())

    f = kiln.compile(fn, wait=True)
    a = np.ones(3)
    for i in range(4):
        a[1] = i + 2.0
        np.testing.assert_allclose(f(kiln.ones(3), a).numpy(), fn(kiln.ones(3), a).numpy(), rtol=RTOL, atol=ATOL)
    assert len(compiled_calls(f)) == 4


def test_a_buffer_made_a_tensor_in_the_call_keeps_its_program():
    buf = np.zeros(3, np.float32)  # the caller refills it; the trace reads it as a graph input
    f = kiln.compile(lambda x: x + kiln.from_numpy(buf), wait=True)
    for i in range(4):
        buf[:] = i
        np.testing.assert_allclose(f(kiln.ones(3)).numpy(), 1.0 + i, rtol=RTOL, atol=ATOL)
    assert len(compiled_calls(f)) == 1 and sum(compiled_calls(f)) >= 3


@pytest.mark.parametrize("how", ["environ.get", "getenv", "environ[]"])
def test_an_environment_variable(how, monkeypatch):
    read = {
        "environ.get": lambda: os.environ.get("KILN_TEST_SCALE", "1"),
        "getenv": lambda: os.getenv("KILN_TEST_SCALE", "1"),
        "environ[]": lambda: os.environ["KILN_TEST_SCALE"],
    }[how]

    def make():
        monkeypatch.setenv("KILN_TEST_SCALE", "1")
        return (lambda x: x * float(read())), lambda i: monkeypatch.setenv("KILN_TEST_SCALE", str(i + 1))

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "os.environ" in _reasons(f)[1], _reasons(f)


def test_the_command_line(monkeypatch):
    def make():
        monkeypatch.setattr(sys, "argv", ["prog"])
        return (lambda x: x * len(sys.argv)), lambda i: sys.argv.append(str(i)) if i else None

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "sys.argv" in _reasons(f)[1], _reasons(f)


def test_a_generator_the_call_resumes_runs_eagerly():
    def make():
        def counting():
            k = 0
            while True:  # every resumption stops at the same yield: only its frame's locals move on
                k += 1
                yield float(k)

        g = counting()
        return (lambda x: x * next(g)), lambda i: None

    f = _against_eager(make, calls=5)
    assert sum(compiled_calls(f)) == 0
    assert any("resumes the generator counting()" in r for r in _reasons(f)), _reasons(f)


def test_a_loop_over_a_dict_whose_order_changed():
    def make():
        d = {"a": 1.0, "b": 2.0}

        def fn(x):
            out = x
            for v in d.values():
                out = out * 10 + v
            return out

        def change(i):
            if i == 2:
                d["a"] = d.pop("a")  # the same entries, "a" now last

        return fn, change

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 2 and "the order of its keys" in _reasons(f)[1], _reasons(f)


@pytest.mark.parametrize("read", ["attribute", "dict entry", "submodule"])
def test_a_setting_of_the_users_own_module(read, tmp_path, monkeypatch):
    # ``import config`` then ``config.SCALE``: a module of the program, not of a library (ints: a float
    # there is read at each call, test_state_floats.py)
    (tmp_path / "kiln_test_settings").mkdir()
    (tmp_path / "kiln_test_settings" / "__init__.py").write_text("SCALE = 1\nTABLE = {'s': 1}\n")
    (tmp_path / "kiln_test_settings" / "inner.py").write_text("SCALE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import kiln_test_settings as settings  # noqa: PLC0415
    import kiln_test_settings.inner  # noqa: F401, PLC0415

    monkeypatch.delitem(sys.modules, "kiln_test_settings")
    monkeypatch.delitem(sys.modules, "kiln_test_settings.inner")
    fn, change = {
        "attribute": (lambda x: x * settings.SCALE, lambda i: setattr(settings, "SCALE", i + 1)),
        "dict entry": (lambda x: x * settings.TABLE["s"], lambda i: settings.TABLE.__setitem__("s", i + 1)),
        "submodule": (lambda x: x * settings.inner.SCALE, lambda i: setattr(settings.inner, "SCALE", i + 1)),
    }[read]
    f = kiln.compile(fn, wait=True)
    for i in range(4):
        change(i)
        np.testing.assert_allclose(f(kiln.ones(3)).numpy(), fn(kiln.ones(3)).numpy(), rtol=RTOL, atol=ATOL)
    assert len(compiled_calls(f)) == 4, _reasons(f)


@pytest.mark.parametrize("wait", [True, False])
def test_a_call_that_cannot_be_cached_for_the_same_reason_each_time_stops_tracing(wait):
    # The result needs gradients through a weight the step updated in place: no program can serve
    # it, at any call. Tracing every call costs more than running it eagerly; after the retries
    # that lazily made state gets, the calls run eagerly without a trace, and say so.
    w = kiln.ones(3, requires_grad=True)
    opt = kiln.optim.SGD([w], lr=0.1)

    def step(x):
        opt.zero_grad()
        (w * x).sum().backward()
        opt.step()
        return w * 1.0

    f = kiln.compile(step, wait=wait)
    for i in range(6):
        np.testing.assert_allclose(f(kiln.ones(3)).detach().numpy(), 1.0 - 0.1 * (i + 1), rtol=RTOL, atol=ATOL)
    kinds = [e.kind for e in events(f)]
    assert kinds == ["not cached", "not cached", "break"], _reasons(f)
    assert "changed in place" in _reasons(f)[-1]
