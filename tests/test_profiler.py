"""kiln.profiler: eager ops, compiled calls and their kernels recorded with times and bytes; the
table of key averages; the Chrome trace (valid JSON whose events nest)."""

from __future__ import annotations

import inspect
import json
import threading

import numpy as np
import pytest

import kiln
from kiln.profiler import ProfilerActivity, profile, record_function
from kiln.runtime import profiling
from kiln.runtime.executor import KernelCall


def _line_of(fn, marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def test_eager_ops_are_recorded_with_bytes_shapes_and_allocations():
    a = kiln.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = kiln.ones(3)
    with profile(record_shapes=True, profile_memory=True) as prof:
        c = a + b
        d = c.exp()
        v = d.T  # a view: allocates nothing
    np.testing.assert_allclose(v.numpy(), np.exp(np.arange(6).reshape(2, 3) + 1).T, rtol=1e-6)
    events = prof.events()
    assert [e.name for e in events] == ["add", "exp", "permute"]
    add, exp, permute = events
    assert add.cat == "op" and add.shapes == ((2, 3), (3,))
    assert add.nbytes == 24 + 12 + 24 and add.allocated == 24
    assert exp.nbytes == 48 and exp.allocated == 24
    assert permute.allocated == 0
    assert all(e.end >= e.start for e in events)
    assert not profiling.active and profiling.recorder is None


def test_nothing_is_recorded_outside_the_profile_and_profiles_do_not_nest():
    prof = profile()
    kiln.ones(2) + 1
    assert prof.events() == []
    with prof:
        with pytest.raises(RuntimeError, match="already recording"):
            profile().start()
        kiln.ones(2) + 1
    kiln.ones(2) * 3
    assert [e.name for e in prof.events()] == ["add"]  # kiln.ones makes its array directly, no op
    assert not profiling.active


def test_an_error_in_an_op_propagates_and_the_profile_stops():
    with pytest.raises(RuntimeError), profile() as prof:
        kiln.ones(2, 3) @ kiln.ones(2, 3)
    assert not profiling.active and all(e.name != "matmul" for e in prof.events())


def _compiled_mlp():
    kiln.manual_seed(0)
    w1, w2 = kiln.randn(8, 16), kiln.randn(16, 4)

    def f(x):
        return ((x @ w1).relu() @ w2).softmax(-1)

    return f, kiln.compile(f)


def test_compiled_calls_hold_their_kernels_with_bytes():
    f, cf = _compiled_mlp()
    x = kiln.randn(5, 8)
    cf(x)  # traced
    with profile(profile_memory=True) as prof:
        results = [cf(x) for _ in range(3)]
    for r in results:
        np.testing.assert_allclose(r.numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)
    program = cf.state.specializations[-1].program
    kernels = program.kernel_calls
    assert kernels and all(isinstance(k, KernelCall) for k in kernels)
    events = prof.events()
    calls = [e for e in events if e.cat == "compiled"]
    assert [e.name for e in calls] == [f"kiln.compile({f.__qualname__})"] * 3
    for call in calls:
        inside = [
            e for e in events if e.tid == call.tid and call.start <= e.start and e.end <= call.end and e is not call
        ]
        assert sum(e.cat == "kernel" for e in inside) == len(kernels)
        assert sum(e.name == "extern matmul" for e in inside) == 2
        kernel_bytes = sorted(e.nbytes for e in inside if e.cat == "kernel")
        assert kernel_bytes == sorted(k.work_bytes for k in kernels)
    softmax = [e for e in events if e.cat == "kernel" and "exp" in e.name]
    assert len(softmax) == 3 and softmax[0].allocated == 5 * 4 * 4  # the result, handed to the caller


def test_the_first_call_records_trace_and_compile_with_its_eager_ops_inside():
    f, cf = _compiled_mlp()
    x = kiln.randn(5, 8)
    with profile() as prof:
        got = cf(x)
    np.testing.assert_allclose(got.numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)
    events = prof.events()
    (compile_event,) = [e for e in events if e.cat == "compile"]
    assert (
        compile_event.name == f"kiln.compile({f.__qualname__}): trace and compile"
        and compile_event.args["reason"] == "first call"
    )
    ops = [e.name for e in events if e.cat == "op"]
    assert "matmul" in ops and "exp" in ops
    assert all(compile_event.start <= e.start and e.end <= compile_event.end for e in events if e.cat == "op")


def test_record_function_nests_and_self_time_excludes_children():
    @record_function("outer")
    def work(x):
        with record_function("inner"):
            y = x * 2
        return y + 1

    with profile() as prof:
        out = work(kiln.ones(3))
    np.testing.assert_allclose(out.numpy(), [3.0, 3.0, 3.0])
    events = {e.name: e for e in prof.events()}
    assert set(events) == {"outer", "inner", "mul", "add"}
    outer, inner, mul, add = events["outer"], events["inner"], events["mul"], events["add"]
    assert outer.start <= inner.start <= mul.start and mul.end <= inner.end <= add.start <= add.end <= outer.end
    averages = {a.key: a for a in prof.key_averages()}
    us = 1e-3
    assert averages["outer"].cpu_time_total == pytest.approx((outer.end - outer.start) * us)
    expected_self = (outer.end - outer.start) - (inner.end - inner.start) - (add.end - add.start)
    assert averages["outer"].self_cpu_time_total == pytest.approx(expected_self * us)
    assert averages["inner"].self_cpu_time_total == pytest.approx(
        ((inner.end - inner.start) - (mul.end - mul.start)) * us
    )
    assert averages["mul"].self_cpu_time_total == averages["mul"].cpu_time_total
    assert mul.nbytes == add.nbytes == 12 + 4 + 12  # x, the scalar as a 0-d tensor, the result
    assert averages["outer"].bytes == mul.nbytes + add.nbytes  # what the ops inside read and wrote
    assert averages["outer"].cpu_memory_usage == 24 and averages["outer"].self_cpu_memory_usage == 0


def test_key_averages_table_sorts_limits_and_counts():
    a = kiln.ones(64, 64)
    with profile(record_shapes=True, profile_memory=True) as prof:
        for _ in range(4):
            (a @ a).sum()
        kiln.ones(3) + kiln.ones(3)
    averages = prof.key_averages()
    counts = {avg.key: avg.count for avg in averages}
    assert counts["matmul"] == 4 and counts["reduce_sum"] == 4 and counts["add"] == 1
    table = averages.table(sort_by="self_cpu_time_total", row_limit=3)
    lines = table.splitlines()
    header = lines[1].split()
    assert header[:2] == ["Name", "Self"] and "Calls" in header and "Mem" in header
    rows = lines[3:-2]
    assert len(rows) == 3
    ordered = sorted(averages, key=lambda x: -x.self_cpu_time_total)[:3]
    assert [r.split()[0] for r in rows] == [x.key for x in ordered]
    assert lines[-1].startswith("Self CPU time total:")
    by_count = averages.table(sort_by="count", row_limit=1).splitlines()[3]
    assert by_count.split()[-2:] == [str(max(counts.values())), "numpy"]  # calls, then the kernel
    shaped = prof.key_averages(group_by_input_shape=True)
    assert {tuple(x.input_shapes) for x in shaped if x.key == "add"} == {((3,), (3,))}
    assert "Input Shapes" in shaped.table()
    with pytest.raises(ValueError, match="sort_by must be one of"):
        averages.table(sort_by="self_cuda_time")


def test_with_stack_names_the_users_line():
    def f():
        return kiln.ones(2) * 5  # OP

    with profile(with_stack=True) as prof:
        f()
    mul = next(e for e in prof.events() if e.name == "mul")
    assert mul.stack[0].endswith(f"test_profiler.py:{_line_of(f, '# OP')} in f"), mul.stack
    table = prof.key_averages(group_by_stack_n=1).table()
    assert f"test_profiler.py:{_line_of(f, '# OP')}" in table


def test_ops_of_other_threads_are_recorded_with_their_thread():
    def work():
        kiln.ones(3).neg()

    with profile() as prof:
        t = threading.Thread(target=work)
        t.start()
        t.join()
        kiln.ones(3).exp()
    events = prof.events()
    neg = next(e for e in events if e.name == "neg")
    exp = next(e for e in events if e.name == "exp")
    assert neg.tid != exp.tid


def test_chrome_trace_is_valid_json_whose_events_nest(tmp_path):
    f, cf = _compiled_mlp()
    x = kiln.randn(5, 8)
    with profile(record_shapes=True) as prof:
        with record_function("two steps"):
            cf(x)
            cf(x)
        (x * 2).sum()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(prof.events())
    for e in events:
        assert isinstance(e["name"], str) and isinstance(e["cat"], str)
        assert isinstance(e["ts"], float | int) and isinstance(e["dur"], float | int) and e["dur"] >= 0 and e["ts"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["args"], dict)
    metadata = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {e["tid"] for e in metadata} == {e["tid"] for e in events}
    # Nesting: per thread, any two events are disjoint or one holds the other (to the nanosecond).
    eps = 1e-3
    by_tid: dict = {}
    for e in events:
        by_tid.setdefault(e["tid"], []).append(e)
    for same in by_tid.values():
        same.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list = []
        for e in same:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + eps:
                stack.pop()
            if stack:
                parent = stack[-1]
                assert e["ts"] + e["dur"] <= parent["ts"] + parent["dur"] + eps, (parent["name"], e["name"])
            stack.append(e)
    outer = next(e for e in events if e["name"] == "two steps")
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert kernels and all(outer["ts"] <= k["ts"] and k["ts"] + k["dur"] <= outer["ts"] + outer["dur"] + eps
                           for k in kernels)  # fmt: skip
    assert any("Input Dims" in e["args"] for e in events)


def test_activities():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        kiln.ones(2).neg()
    assert [e.name for e in prof.events()][-1] == "neg"
    with pytest.raises(TypeError, match="ProfilerActivity"):
        profile(activities=["cpu"])


def test_with_stack_gives_compiled_kernels_the_line_that_made_them():
    def f(x):
        return (x * 3).exp()  # KERNEL

    cf = kiln.compile(f)
    x = kiln.ones(4)
    cf(x)
    with profile(with_stack=True) as prof:
        got = cf(x)
    np.testing.assert_allclose(got.numpy(), f(x).numpy(), rtol=1e-6)
    (kernel,) = [e for e in prof.events() if e.cat == "kernel"]
    assert kernel.name == "kernel elementwise (mul+exp)"
    assert len(kernel.stack) == 1 and kernel.stack[0].endswith(f"test_profiler.py:{_line_of(f, '# KERNEL')} in f")


def test_the_table_says_which_kernel_ran_each_eager_op(monkeypatch):
    """An eager op that ran kiln's compiled kernel (eager_kernels) is counted as such, per call."""
    from kiln.frontend import eager_kernels

    monkeypatch.setattr(eager_kernels.CACHE, "synchronous", False)  # the first call runs numpy

    x = kiln.tensor(np.random.default_rng(0).normal(size=(8, 3, 16, 16)).astype(np.float32))
    w = kiln.tensor(np.random.default_rng(1).normal(size=(5, 3, 5, 5)).astype(np.float32))
    eager_kernels.set_enabled(True)
    try:
        with profile() as prof:
            with record_function("convolutions"):
                kiln.nn.functional.conv2d(x, w)  # numpy: its compile starts now
                eager_kernels.wait()
                kiln.nn.functional.conv2d(x, w)
                kiln.nn.functional.conv2d(x, w)
            kiln.ones(3) + 1
    finally:
        eager_kernels.set_enabled(False)
        eager_kernels.CACHE.clear()
    ops = [e for e in prof.events() if e.cat == "op"]
    assert [e.args["kernel"] for e in ops if e.name == "conv"] == ["numpy", "compiled", "compiled"]
    averages = {a.key: a for a in prof.key_averages()}
    assert averages["conv"].kernel == "compiled 2/3"
    assert averages["add"].kernel == "numpy" and averages["convolutions"].kernel == "-"
    table = prof.key_averages().table()
    assert "Kernel" in table.splitlines()[1]
    assert next(line for line in table.splitlines() if line.startswith("conv ")).endswith("compiled 2/3")
