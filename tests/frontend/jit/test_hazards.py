"""Tracing hazards: Python state around a compiled call. Each test runs the compiled function and
the plain function side by side over several calls with the hazard applied between or inside the
calls; results must equal eager's, or the call runs eagerly and the events say why."""

from __future__ import annotations

import datetime
import os
import random
import time

import numpy as np
import pytest

import kiln
import kiln.nn as nn

from .helpers import compiled_calls, events

counter = 0


def _breaks(f) -> list[str]:
    return [e.detail for e in events(f, "break")]


def _close(a, b) -> None:
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------- paths to captured tensors
def test_dict_entry_replaced_while_the_old_tensor_is_alive():
    table = {"w": kiln.ones(3)}

    def f(x):
        return x * table["w"]

    g = kiln.compile(f)
    x = kiln.arange(3.0)
    keep = []
    for i in range(6):
        _close(g(x), f(x))
        if i % 2:
            keep.append(table["w"])  # the old tensor stays alive
            table["w"] = kiln.full((3,), float(i + 2))
    assert sum(compiled_calls(g)) >= 2
    assert any("table['w'] changed" in e.detail for e in events(g, "compiled"))


def test_parameter_replaced_while_the_optimizer_holds_the_old_one():
    def make():
        kiln.manual_seed(0)
        m = nn.Linear(3, 2)
        return m, kiln.optim.SGD(m.parameters(), lr=0.1)

    def step(m, opt, x):
        opt.zero_grad()
        loss = m(x).pow(2).sum()
        loss.backward()
        opt.step()
        return loss

    (m, opt), (me, opte) = make(), make()
    g = kiln.compile(lambda x: step(m, opt, x))
    x = kiln.arange(6.0).reshape(2, 3) / 6
    for i in range(6):
        _close(g(x), step(me, opte, x))
        _close(m.weight, me.weight)
        if i == 2:
            m.weight = nn.Parameter(kiln.zeros(2, 3))  # the optimizer still updates the old one
            me.weight = nn.Parameter(kiln.zeros(2, 3))
    assert sum(compiled_calls(g)) >= 2


def test_plain_attribute_of_a_module_changed_between_calls():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 1.0
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x) * self.scale

    kiln.manual_seed(0)
    m = Scale()
    g = kiln.compile(m)
    x = kiln.ones(2, 3)
    for s in (1.0, 1.0, 3.0, 3.0, 0.5, 0.5):
        m.scale = s
        _close(g(x), m.forward(x))
    assert sum(compiled_calls(g)) >= 3
    assert any("scale" in e.detail for e in events(g, "compiled"))


def test_plain_attribute_of_an_object_the_function_reads():
    class Config:
        scale = 0.0

    cfg = Config()
    cfg.scale = 2.0

    def f(x):
        return x * cfg.scale

    g = kiln.compile(f)
    x = kiln.arange(3.0)
    for s in (2.0, 2.0, 5.0, 5.0, -1.0):
        cfg.scale = s
        _close(g(x), f(x))
    assert sum(compiled_calls(g)) >= 2


def test_submodule_swapped_between_calls():
    kiln.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    g = kiln.compile(m)
    x = kiln.randn(2, 3)
    for i in range(4):
        if i == 2:
            m[1] = nn.Tanh()
        _close(g(x), m.forward(x))


# ---------------------------------------------------------------------- state the call changes
def test_tensor_data_assigned_inside_the_call_runs_eagerly():
    w = kiln.ones(3)

    def f(x):
        w.data = x * 2
        return w + 1

    g = kiln.compile(f)
    for i in range(4):
        x = kiln.full((3,), float(i))
        np.testing.assert_allclose(g(x).numpy(), 2 * i + 1)
        np.testing.assert_allclose(w.numpy(), 2 * i)
    assert compiled_calls(g) == [] and "Tensor.data" in _breaks(g)[0]
    assert "Tensor.data" in str(kiln.explain(g))


def test_tensor_data_inside_with_fullgraph_raises():
    w = kiln.ones(3)

    @kiln.compile(fullgraph=True)
    def f(x):
        w.data = x
        return w + 1

    with pytest.raises(kiln.jit.TraceBreakError, match="Tensor.data"):
        f(kiln.zeros(3))


def test_store_into_a_global_with_fullgraph_raises_with_the_line():
    @kiln.compile(fullgraph=True)
    def f(x):
        global counter
        counter += 1
        return x + 1

    with pytest.raises(kiln.jit.TraceBreakError, match=r"global variable 'counter'.*test_hazards.py"):
        f(kiln.zeros(3))


def test_manual_seed_inside_the_call_leaves_the_generator_as_eager():
    def f(x):
        kiln.manual_seed(3)
        return x + kiln.rand(3)

    g = kiln.compile(f)
    x = kiln.zeros(3)
    for _ in range(4):
        got = g(x)
        after = kiln.rand(2)  # draws between calls move the stream; the call must reset it again
        expected = f(x)
        after_eager = kiln.rand(2)
        _close(got, expected)
        _close(after, after_eager)
    assert sum(compiled_calls(g)) >= 2


@pytest.mark.parametrize("reseed", ["kiln.seed", "Generator.seed"])
def test_a_seed_from_the_system_inside_the_call_runs_eagerly(reseed):
    # eager draws new numbers after each fresh seed; a compiled call replayed the trace's seed
    gen = kiln.Generator()

    def f(x):
        if reseed == "kiln.seed":
            kiln.seed()
            return x + kiln.rand(3)
        gen.seed()
        return x + kiln.rand(3, generator=gen)

    g = kiln.compile(f)
    x = kiln.zeros(3)
    draws = {float(g(x).numpy()[0]) for _ in range(4)}
    assert len(draws) == 4 and compiled_calls(g) == []
    assert f"{reseed}() draws a seed from the operating system" in events(g)[0].detail


def test_python_counters_inside_run_eagerly_with_the_line():
    n = 0

    class Box:
        count = 0

    box = Box()

    def with_global(x):
        global counter
        counter += 1
        return x + 1

    def with_nonlocal(x):
        nonlocal n
        n += 1
        return x + 1

    def with_attribute(x):
        box.count += 1
        return x + 1

    x = kiln.ones(2)
    for fn, read, what in (
        (with_global, lambda: counter, "global variable 'counter'"),
        (with_nonlocal, lambda: n, "'n' of an enclosing function"),
        (with_attribute, lambda: box.count, "box.count"),
    ):
        g = kiln.compile(fn)
        start = read()
        for _ in range(4):
            g(x)
        assert read() == start + 4, what
        assert compiled_calls(g) == [] and what in _breaks(g)[0], _breaks(g)
        assert "test_hazards.py" in _breaks(g)[0]


@pytest.mark.parametrize("draw", [random.random, np.random.rand], ids=["python", "numpy"])
def test_python_and_numpy_random_inside_run_eagerly(draw):
    def f(x):
        return x * draw()

    g = kiln.compile(f)
    x = kiln.ones(1)
    values = {float(g(x).numpy()[0]) for _ in range(4)}
    assert len(values) == 4
    assert compiled_calls(g) == [] and "random generator" in _breaks(g)[0]


_VOLATILE_READS = {
    "time.time": lambda: time.time() % 1,
    "time.perf_counter": lambda: time.perf_counter() % 1,
    "time.monotonic_ns": lambda: time.monotonic_ns() % 1000,
    "datetime.now": lambda: datetime.datetime.now().microsecond,
    "os.urandom": lambda: os.urandom(1)[0],
}


@pytest.mark.parametrize("read", list(_VOLATILE_READS), ids=list(_VOLATILE_READS))
def test_a_clock_or_entropy_read_inside_runs_eagerly(read):
    # a compiled call would replay the number the trace read (a stale constant, every call)
    value = _VOLATILE_READS[read]

    def f(x):
        return x * value()

    g = kiln.compile(f)
    x = kiln.ones(1)
    outs = [float(g(x).numpy()[0]) for _ in range(6)]
    assert compiled_calls(g) == [], outs
    method = read.split(".")[1]
    assert f"{method}()" in _breaks(g)[0] and "test_hazards.py" in _breaks(g)[0], _breaks(g)
    assert "replay" in str(kiln.explain(g, x))


def test_a_clock_read_by_a_library_the_step_calls_is_not_the_users():
    # logging stamps each record with time.time_ns(); a step that logs still compiles
    import logging  # noqa: PLC0415

    log = logging.getLogger("kiln_test_clock")
    log.addHandler(logging.NullHandler())
    log.setLevel(logging.INFO)
    log.info("before")  # (fills the logger's level cache, a change the first traced call would make)

    def f(x):
        log.info("step")
        return x * 2

    _runs_compiled_as_eager(f)


def _module_on_path(tmp_path, monkeypatch, name: str, source: str) -> None:
    """A module ``name`` with ``source``, importable for this test."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))


def _code_at(path: str, source: str) -> dict:
    """The namespace of ``source`` run as if it were the file ``path`` (kiln's, a library's)."""
    namespace: dict = {}
    exec(compile(source, path, "exec"), namespace)
    return namespace


def _runs_compiled_as_eager(f) -> None:
    """``f`` compiled gives eager's results over several calls, with no trace break: it really runs compiled."""
    g = kiln.compile(f)
    for _ in range(3):
        _close(g(kiln.ones(2)), f(kiln.ones(2)))
    assert _breaks(g) == [] and sum(compiled_calls(g)) >= 2


def test_a_private_generator_the_user_draws_from_runs_eagerly():
    rng = random.Random(0)

    def f(x):
        return x * rng.random()

    g = kiln.compile(f)
    x = kiln.ones(1)
    assert len({float(g(x).numpy()[0]) for _ in range(3)}) == 3
    assert compiled_calls(g) == [] and "random generator" in _breaks(g)[0]


def test_kilns_own_draws_from_a_private_generator_are_not_the_users():
    # a kernel kiln compiles during the trace (CUDA's, through numba) names temporary files with
    # tempfile's generator of its own: code under kiln's folder drawing from it breaks no trace
    from kiln.frontend.jit.locations import KILN_DIR

    source = "import random\ndef build():\n    return random.Random().random()\n"
    machinery = _code_at(KILN_DIR + "codegen/_test_machinery.py", source)

    def f(x):
        machinery["build"]()
        return x * 2

    _runs_compiled_as_eager(f)


def test_a_draw_in_library_code_that_kilns_frontend_calls_is_the_users():
    # a model from an installed package: kiln's Module.__call__ calls its forward, which draws from
    # a generator of its own; the compiled step would freeze the draw, so the call runs eagerly
    import sysconfig  # noqa: PLC0415

    source = (
        "import random\nimport kiln\nrng = random.Random(0)\n"
        "class Noisy(kiln.nn.Module):\n    def forward(self, x):\n        return x * rng.random()\n"
    )
    package = _code_at(sysconfig.get_paths()["purelib"] + "/kiln_test_fake_package.py", source)
    g = kiln.compile(package["Noisy"]())
    assert len({float(g(kiln.ones(1)).numpy()[0]) for _ in range(3)}) == 3
    assert "random generator" in _breaks(g)[0]


def test_a_module_imported_during_the_trace_is_not_a_hazard(tmp_path, monkeypatch):
    # its body (and what the body calls) stores into the module's globals once, at the import
    _module_on_path(
        tmp_path, monkeypatch, "kiln_lazy_module",
        "global SCALE\nSCALE = 3.0\nTABLE = {}\ndef _fill():\n    global TABLE\n    TABLE = {'k': 1}\n_fill()\n"
        "def bump():\n    global SCALE\n    SCALE += 1\n",
    )  # fmt: skip

    def f(x):
        import kiln_lazy_module  # noqa: PLC0415 - the lazy import is the point

        return x * kiln_lazy_module.SCALE

    _runs_compiled_as_eager(f)

    def bumps(x):
        import kiln_lazy_module  # noqa: PLC0415

        kiln_lazy_module.bump()  # a store into a global at each call: still a hazard
        return x * kiln_lazy_module.SCALE

    h = kiln.compile(bumps)  # traced again twice (a change made once is forgiven), then eager for good
    assert [float(h(kiln.ones(1)).numpy()[0]) for _ in range(4)] == [4.0, 5.0, 6.0, 7.0]
    assert "global variable 'SCALE'" in _breaks(h)[0]


def test_a_compiled_function_called_while_its_module_is_imported_still_sees_stores(tmp_path, monkeypatch):
    # the import is the caller here, not something the call does: a store into a global stays a hazard
    _module_on_path(
        tmp_path, monkeypatch, "kiln_importing_caller",
        "import kiln\ncounter = 0\ndef bump(x):\n    global counter\n    counter += 1\n    return x + 1\n"
        "f = kiln.compile(bump)\nresults = [f(kiln.ones(1)) for _ in range(4)]\n",
    )  # fmt: skip
    import kiln_importing_caller as module  # noqa: PLC0415 - importing it runs the calls

    assert module.counter == 4
    assert "global variable 'counter'" in _breaks(module.f)[0]


def test_iterators_consumed_inside_run_eagerly():
    it = iter(range(100))

    def from_closure(x):
        return x + next(it)

    g = kiln.compile(from_closure)
    x = kiln.zeros(1)
    assert [float(g(x).numpy()[0]) for _ in range(4)] == [0, 1, 2, 3]

    h = kiln.compile(lambda x, items: x + next(items))
    gen = (i * 10 for i in range(10))
    assert [float(h(x, gen).numpy()[0]) for _ in range(3)] == [0, 10, 20]
    assert compiled_calls(g) == [] == compiled_calls(h) and "iterator" in _breaks(h)[0]


# ---------------------------------------------------------------------- inputs and global modes
def test_numpy_array_argument_mutated_between_calls():
    def f(x, a):
        return x + kiln.tensor(a)

    g = kiln.compile(f)
    a = np.ones(3, dtype=np.float64)
    x = kiln.zeros(3, dtype=kiln.float64)
    for i in range(5):
        a[:] = i
        _close(g(x, a), f(x, a))
    assert sum(compiled_calls(g)) >= 3


def test_numpy_array_in_closure_read_and_written_through_from_numpy():
    a = np.arange(3, dtype=np.float32)
    b = a.copy()

    def f(x, arr):
        t = kiln.from_numpy(arr)
        t.mul_(2)
        return x + t

    g = kiln.compile(lambda x: f(x, a))
    x = kiln.ones(3)
    for i in range(4):
        _close(g(x), f(x, b))
        np.testing.assert_array_equal(a, b)
        a[0] = b[0] = i  # changed between calls
    assert sum(compiled_calls(g)) >= 2


def test_default_dtype_is_part_of_the_key():
    def f(x):
        return x + kiln.ones(3) / 3

    g = kiln.compile(f)
    x = kiln.zeros(3, dtype=kiln.float16)
    try:
        for dtype in (kiln.float32, kiln.float32, kiln.float64, kiln.float64, kiln.float32):
            kiln.set_default_dtype(dtype)
            got, expected = g(x), f(x)
            assert got.dtype == expected.dtype
            _close(got, expected)
    finally:
        kiln.set_default_dtype(kiln.float32)
    assert any("default dtype" in e.detail for e in events(g, "compiled"))


# ---------------------------------------------------------------------- gradient hooks
def test_hook_on_an_argument_is_applied_once():
    def f(x):
        return (x * 3).sum()

    g = kiln.compile(f)
    for _ in range(4):
        x, xe = kiln.ones(3, requires_grad=True), kiln.ones(3, requires_grad=True)
        x.register_hook(lambda grad: grad * 2)
        xe.register_hook(lambda grad: grad * 2)
        g(x).backward()
        f(xe).backward()
        _close(x.grad, xe.grad)
    assert sum(compiled_calls(g)) >= 2


def test_hook_registered_on_an_argument_inside_runs_eagerly():
    seen = []

    def f(x):
        x.register_hook(lambda grad: seen.append(1) or grad * 2)
        return (x * 3).sum()

    g = kiln.compile(f)
    for i in range(3):
        x = kiln.ones(3, requires_grad=True)
        g(x).backward()
        np.testing.assert_allclose(x.grad.numpy(), 6.0)
        assert len(seen) == i + 1
    assert compiled_calls(g) == [] and "register_hook" in _breaks(g)[0]


def test_a_profiler_running_during_the_trace_keeps_running_and_stores_are_still_seen():
    import cProfile

    global counter
    counter = 0

    def pure(x):
        return x * 2 + 1

    def with_global(x):
        global counter
        counter += 1
        return x + 1

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        f, g = kiln.compile(pure), kiln.compile(with_global)
        for _ in range(3):
            np.testing.assert_array_equal(f(kiln.ones(2)).numpy(), [3.0, 3.0])
            g(kiln.ones(2))
    finally:
        profiler.disable()
    assert sum(compiled_calls(f)) >= 2
    assert counter == 3 and compiled_calls(g) == [] and "global variable 'counter'" in _breaks(g)[0]
    assert any(getattr(entry.code, "co_name", "") == "pure" for entry in profiler.getstats())  # it kept profiling


def test_state_made_lazily_on_the_first_call_stops_only_that_call():
    """PyTorch's word_language_model sets ``self.src_mask`` on its first forward; that call stops its
    trace, the next traces again and compiles (its trace broke on every step before)."""

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask = None
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            if self.mask is None or self.mask.shape[0] != x.shape[0]:
                self.mask = kiln.tril(kiln.ones(x.shape[0], x.shape[0]))
            return self.mask @ self.lin(x)

    model = Masked()
    step = kiln.compile(model)
    for _ in range(5):
        x = kiln.randn(3, 4)
        np.testing.assert_allclose(step(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6, atol=1e-6)
    report = kiln.explain(step, x)
    assert "1 specialization(s), 0 trace break(s)" in report.summary()
    assert "Masked.mask" in report.summary()  # the first call's reason, under "Calls not cached"
    assert sum(compiled_calls(step)) >= 3
