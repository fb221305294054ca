"""The LLVM backend's executor end to end: compiled results equal eager, the memory plan's arena
(peak bytes, no allocation in steady state, one arena per thread), in-place parameter updates and
the thread pool's split of large kernels.

Every compiled function is called three times or more: the first call of a specialization is the
traced eager run, later calls run the ``CompiledProgram`` (``spec.calls`` counts them).
Tolerances: float32 rtol 1e-5 / atol 1e-6 for elementwise chains, rtol 1e-4 / atol 1e-5 where a
reduction or a matmul sums in another order; integer and bool results are exact.
"""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.optim as optim
from kiln.codegen.backend import LoweringReport
from kiln.runtime import threads as threads_module
from kiln.runtime.executor import CompiledProgram
from kiln.runtime.threads import PARALLEL_MIN_WORK_BYTES

from ..conftest import assert_close

ELEMENTWISE = {"rtol": 1e-5, "atol": 1e-6}
REDUCED = {"rtol": 1e-4, "atol": 1e-5}


def _rand(*shape, dtype=np.float32, seed=0) -> kiln.Tensor:
    return kiln.tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def _spec(cf):
    return cf.state.specializations[-1]


def _run_compiled(fn, *args, calls: int = 3):
    """``(compiled results of the last call, eager results, the specialization)``."""
    cf = kiln.compile(fn)
    for _ in range(calls):
        got = cf(*args)
    spec = _spec(cf)
    assert isinstance(spec.program, CompiledProgram), "not the LLVM backend's program"
    assert spec.calls == calls - 1, "the compiled program did not run"
    return got, fn(*args), spec


def _compare(got, expected, tol) -> None:
    got = got if isinstance(got, tuple | list) else (got,)
    expected = expected if isinstance(expected, tuple | list) else (expected,)
    assert len(got) == len(expected)
    for a, e in zip(got, expected, strict=True):
        assert_close(a, e, **tol)


# ----------------------------------------------------------------------------- results equal eager
def test_matmul_bias_relu_is_matmul_plus_one_epilogue_kernel():
    def f(x, w, b):
        return kiln.relu(x @ w + b)

    x, w, b = _rand(16, 24), _rand(24, 12, seed=1), _rand(12, seed=2)
    got, expected, spec = _run_compiled(f, x, w, b)
    _compare(got, expected, REDUCED)
    assert spec.report.kernels == 1 and spec.report.externs == {"matmul": 1} and not spec.report.declined
    assert (got.numpy() >= 0).all() and (got.numpy() == 0).any()  # relu really clamps


@pytest.mark.parametrize("shape", [(8, 33), (3, 5, 128), (2, 1)])
def test_softmax_log_softmax_layer_norm_over_the_last_dim(shape):
    def f(x, w, b):
        return kiln.softmax(x, -1), kiln.log_softmax(x, -1), F.layer_norm(x, (shape[-1],), w, b)

    x = _rand(*shape) * 10  # large values: the max subtraction matters
    w, b = _rand(shape[-1], seed=1), _rand(shape[-1], seed=2)
    got, expected, spec = _run_compiled(f, x, w, b)
    _compare(got, expected, REDUCED)
    assert_close(got[0].sum(-1), np.ones(shape[:-1], np.float32), rtol=1e-5, atol=1e-5)
    assert spec.report.kernels >= 1 and not spec.report.declined
    assert all(n.op in ("kernel", "constant") for n in spec.graph.nodes), spec.graph


def test_transposed_argument_is_read_through_its_strides():
    def f(a, b):
        return (a * 2 + b).exp() - a

    base = _rand(12, 20)
    a = base.t()  # [20, 12] with strides (4, 80): not C-contiguous
    assert not a.numpy().flags.c_contiguous
    got, expected, spec = _run_compiled(f, a, _rand(20, 12, seed=1))
    _compare(got, expected, ELEMENTWISE)
    assert spec.program._input_checks[0][2] == a.numpy().strides  # specialized on the transposed layout
    base.mul_(-1.0)  # new values behind the same view: the compiled call reads them
    _compare(kiln.compile(f)(a, _rand(20, 12, seed=1)), f(a, _rand(20, 12, seed=1)), ELEMENTWISE)


def test_slice_and_permute_views_of_an_argument_read_by_a_kernel():
    def f(x):
        y = x[:, 1:7:2].permute(2, 0, 1)  # a strided, permuted view, fused as index remapping
        return kiln.tanh(y) * 3 + x[:, 0].permute(1, 0).unsqueeze(-1)

    x = _rand(5, 9, 4)
    got, expected, spec = _run_compiled(f, x)
    _compare(got, expected, ELEMENTWISE)
    assert tuple(got.shape) == (4, 5, 3)
    assert spec.report.kernels >= 1 and not spec.report.declined


def test_backward_with_a_non_contiguous_incoming_gradient():
    """The backward program is specialized on a C-contiguous seed; a transposed gradient is copied
    into that layout by the executor's guard, and the result is still right."""

    def f(x, w):
        return (x * w).sin() * x

    rng = np.random.default_rng(3)
    w = _rand(6, 4, seed=1)
    cf = kiln.compile(f)
    for call in range(4):
        xv = rng.standard_normal((6, 4)).astype(np.float32)
        g = kiln.tensor(rng.standard_normal((4, 6)).astype(np.float32)).t()  # [6, 4], strides (4, 24)
        assert not g.numpy().flags.c_contiguous
        x = kiln.tensor(xv, requires_grad=True)
        y = cf(x, w)
        y.backward(g)
        x_eager = kiln.tensor(xv, requires_grad=True)
        f(x_eager, w).backward(g)
        assert_close(x.grad, x_eager.grad, **ELEMENTWISE)
        if call > 0:
            assert y.grad_fn.name() == "CompiledFunctionBackward"
    spec = _spec(cf)
    assert spec.calls == 3 and isinstance(spec.backward.program, CompiledProgram)


def test_integer_function_is_exact():
    def f(a, b):
        return (a * b - a // b + a % b) * 3 - kiln.maximum(a, b), (a + b).abs()

    rng = np.random.default_rng(4)
    for dtype in (np.int32, np.int64):
        a = kiln.tensor(rng.integers(-1000, 1000, (7, 9)).astype(dtype))
        b = kiln.tensor(np.where((v := rng.integers(-9, 9, (7, 9))) == 0, 5, v).astype(dtype))
        got, expected, spec = _run_compiled(f, a, b)
        _compare(got, expected, {"rtol": 0, "atol": 0})
        assert got[0].dtype == expected[0].dtype and spec.report.kernels >= 1 and not spec.report.declined


def test_bool_function_is_exact():
    def f(x, y, m):
        keep = ((x > 0) & ~m) | (x == y)
        return keep, kiln.where(keep, x, y), keep.to(kiln.int32) + m.to(kiln.int32)

    rng = np.random.default_rng(5)
    x = kiln.tensor(rng.integers(-3, 3, (6, 10)).astype(np.float32))
    y = kiln.tensor(rng.integers(-3, 3, (6, 10)).astype(np.float32))
    m = kiln.tensor(rng.random((1, 10)) < 0.5)  # broadcast along rows
    got, expected, spec = _run_compiled(f, x, y, m)
    _compare(got, expected, {"rtol": 0, "atol": 0})
    assert got[0].dtype == kiln.bool and got[0].numpy().dtype == np.bool_
    assert spec.report.kernels >= 1 and not spec.report.declined


def test_float16_runs_on_eager_kernels_with_correct_results():
    def f(x):
        return (x * 2 + 1).tanh()

    x = _rand(4, 5, dtype=np.float16)
    got, expected, spec = _run_compiled(f, x)
    _compare(got, expected, {"rtol": 1e-3, "atol": 1e-3})
    assert got.dtype == kiln.float16
    assert spec.report.kernels == 0  # nothing float16 is compiled
    text = str(kiln.explain(kiln.compile(f), x))
    assert "tanh" in text


def test_float16_explain_names_the_reason():
    def f(x):
        return (x * 2 + 1).tanh()

    cf = kiln.compile(f)
    x = _rand(4, 5, dtype=np.float16)
    for _ in range(2):
        cf(x)
    code = "\n".join(_spec(cf).report.describe())
    assert "float16" in code, code


# ----------------------------------------------------------------------------- memory
def _mlp():
    kiln.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))


def test_mlp_memory_plan_peak_and_explain():
    model = _mlp()
    x = _rand(64, 64)
    cf = kiln.compile(lambda x: model(x))
    with kiln.no_grad():
        for _ in range(3):
            got = cf(x)
        expected = model(x)
    _compare(got, expected, REDUCED)
    spec = _spec(cf)
    assert spec.calls == 2 and isinstance(spec.report, LoweringReport)
    plan = spec.program.plan
    assert len(plan.offsets) >= 4  # the matmul results and the hidden activations, 32 KiB each
    assert 0 < plan.peak_bytes <= plan.intermediate_bytes
    assert plan.arena_bytes >= plan.peak_bytes
    assert plan.arena_bytes < plan.intermediate_bytes  # dead buffers were reused
    assert all(offset % 64 == 0 for offset in plan.offsets.values())
    text = str(kiln.explain(cf))
    assert "memory plan" in text and "eager would hold" in text, text


def test_no_allocation_in_steady_state_and_the_arena_stays_put():
    """A chain of kernels around a matmul: every intermediate is planned, so a steady-state call
    allocates no more than its output (from the caching allocator) plus small Python objects."""

    def f(x, w):
        h = (x * 0.5 + 1).exp()
        y = h @ w
        return (y.tanh() * 2 - y).sigmoid()

    x, w = _rand(256, 256), _rand(256, 256, seed=1) * 0.05  # every intermediate: 256 KiB
    cf = kiln.compile(f)
    for _ in range(5):
        out = cf(x, w)
    _compare(out, f(x, w), REDUCED)
    spec = _spec(cf)
    program = spec.program
    assert program.plan.intermediate_bytes >= 2 * 256 * 1024  # the exp kernel's and the matmul's results
    arena = program._frame().arena.ctypes.data
    slack = 16 * 1024  # tensor objects, argument lists, the pointer-table updates
    del out
    tracemalloc.start()
    try:
        for _ in range(3):
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            out = cf(x, w)
            _, peak = tracemalloc.get_traced_memory()
            assert peak - before <= out.numpy().nbytes + slack, (peak - before, out.numpy().nbytes)
            del out
    finally:
        tracemalloc.stop()
    assert program._frame().arena.ctypes.data == arena
    assert spec.calls == 7


def test_eager_would_allocate_what_the_plan_saves():
    """The allocation counter above can fail: the same measurement on the eager function sees the
    intermediates (several 256 KiB arrays) allocated."""

    def f(x):
        return ((x * 0.5 + 1).exp() * 2 - x).sigmoid()

    x = _rand(256, 256)
    f(x)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = f(x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before >= 2 * out.numpy().nbytes


# ----------------------------------------------------------------------------- threads
def test_two_threads_call_one_compiled_function_with_their_own_arenas():
    def f(x, w):
        return ((x * 2).exp() @ w).tanh() + 1

    cf = kiln.compile(f)
    w = _rand(32, 32, seed=9) * 0.1
    for _ in range(2):
        cf(_rand(64, 32), w)
    program = _spec(cf).program
    assert program.plan.arena_bytes > 0
    inputs = [[_rand(64, 32, seed=100 * t + i) for i in range(30)] for t in range(2)]
    results: dict[int, list] = {0: [], 1: []}
    frames: dict[int, object] = {}
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            for x in inputs[t]:
                results[t].append(cf(x, w))
            frames[t] = program._frame()
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert frames[0] is not frames[1]
    assert frames[0].arena.ctypes.data != frames[1].arena.ctypes.data
    for t in range(2):
        for x, got in zip(inputs[t], results[t], strict=True):
            assert_close(got, f(x, w), **REDUCED)
    assert _spec(cf).calls >= 1 + 60


# ----------------------------------------------------------------------------- in place
def test_compiled_sgd_momentum_step_updates_parameters_in_place():
    def make():
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        return model, optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def make_step(model, opt):
        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    rng = np.random.default_rng(7)
    data = [(kiln.tensor(rng.standard_normal((16, 6)).astype(np.float32)), kiln.tensor(rng.integers(0, 3, 16)))
            for _ in range(6)]  # fmt: skip
    model, opt = make()
    eager_model, eager_opt = make()
    step = kiln.compile(make_step(model, opt))
    eager_step = make_step(eager_model, eager_opt)
    params = list(model.parameters())
    arrays, versions = None, None
    for i, (x, y) in enumerate(data):
        loss = step(x, y)
        eager_loss = eager_step(x, y)
        assert_close(loss, eager_loss, **REDUCED)
        if i >= 2:  # the momentum buffers exist from the first step on: the compiled program runs from here
            assert [p._data for p in params] == arrays and all(
                p._data is a for p, a in zip(params, arrays, strict=True)
            ), "a parameter's array was replaced instead of updated in place"
            assert all(p._version[0] > v for p, v in zip(params, versions, strict=True)), "version not bumped"
        arrays = [p._data for p in params]
        versions = [p._version[0] for p in params]
    for p, e in zip(params, eager_model.parameters(), strict=True):
        assert_close(p, e, **REDUCED)
    spec = _spec(step)
    assert spec.calls >= 3
    # the kernels write the parameters (and momentum buffers) straight into the caller's arrays
    in_place = spec.program.written_in_place()
    assert len(in_place) >= len(params), in_place


# ----------------------------------------------------------------------------- the thread pool
def test_large_gelu_is_split_across_the_thread_pool(monkeypatch):
    def f(x):
        return F.gelu(x, approximate="tanh")

    chunks: list[tuple[int, int, int]] = []  # (begin, end, thread) of every kernel call through the pool
    parallel_for = threads_module.parallel_for

    def spy(kernel, args, extent, work_bytes, spin=False):
        def chunk(a, begin, end):
            chunks.append((begin, end, threading.get_ident()))
            kernel(a, begin, end)

        return parallel_for(chunk, args, extent, work_bytes)

    monkeypatch.setattr(threads_module, "parallel_for", spy)
    x = _rand(2 * 1024 * 1024) * 4
    x.numpy()[:4] = [np.inf, -np.inf, np.nan, 0.0]
    previous = kiln.get_num_threads()
    kiln.set_num_threads(2)
    try:
        got, expected, spec = _run_compiled(f, x)
    finally:
        kiln.set_num_threads(previous)
    _compare(got, expected, ELEMENTWISE)
    assert got.numpy()[0] == np.inf and np.isnan(got.numpy()[2])  # inf and nan propagate as in eager
    (kstep,) = spec.program.kernel_calls
    assert kstep.work_bytes >= PARALLEL_MIN_WORK_BYTES and kstep.extent > 1  # large enough to be split
    # each of the 2 compiled calls: disjoint chunks covering [0, extent), claimed by at most two threads
    count = min(kstep.extent, 2 * threads_module.CHUNKS_PER_THREAD)
    assert len(chunks) == 2 * count, chunks
    for call in (chunks[:count], chunks[count:]):
        assert sorted((b, e) for b, e, _ in call) == [
            (kstep.extent * c // count, kstep.extent * (c + 1) // count) for c in range(count)
        ]
        assert len({ident for _, _, ident in call}) <= 2


def test_a_kernel_the_code_generator_declines_runs_on_its_body(monkeypatch):
    """Every kernel declined (as float16 or an unknown op would be): the program interprets the bodies,
    including those whose outputs live in the arena, and explain names the reason."""
    from kiln.codegen.llvm import Unsupported
    from kiln.codegen.llvm.kernels import KernelModule

    def decline(self, node, layouts):
        raise Unsupported("declined for this test")

    monkeypatch.setattr(KernelModule, "add", decline)
    w = kiln.randn(16, 8)

    def f(x):
        return ((x * 2).tanh() @ w).softmax(-1) + 1

    cf = kiln.compile(f)
    x = kiln.randn(4, 16)
    for _ in range(3):
        got = cf(x)
    np.testing.assert_allclose(got.numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)
    report = cf.state.specializations[-1].report
    assert report.kernels == 0 and report.declined and cf.state.specializations[-1].calls == 2
    assert "declined for this test" in str(kiln.explain(cf))
