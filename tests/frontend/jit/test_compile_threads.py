"""Threads racing on a compiled function's first call: one specialization per key, results as eager.

Twelve threads start together (a barrier) on the first call of one key; one traces it and the
others wait and run what it compiled. Waiting never deadlocks: nested compiled calls trace
through, and a thread that holds one function's compile lock (a call made after a trace break)
runs a busy function eagerly instead of waiting for it.
"""

from __future__ import annotations

import threading

import numpy as np

import kiln

from .helpers import array, compiled_calls, state_of

THREADS = 12
JOIN_SECONDS = 120  # a deadlock fails the test instead of hanging the suite


def run_together(target, count: int = THREADS) -> list:
    """Run ``target(i)`` in ``count`` threads released at once; their results, or the first error."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list = []

    def work(i):
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            errors.append(error)

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(JOIN_SECONDS)
    assert not any(worker.is_alive() for worker in workers), "threads are still waiting: a deadlock"
    if errors:
        raise errors[0]
    return results


def inputs(seed: int, shape=(8, 24)) -> kiln.Tensor:
    return kiln.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def model(x, w):
    h = (x * w).tanh() + x.sum(-1, keepdim=True)
    return kiln.softmax(h, -1) * 2 - 1


def test_racing_first_calls_make_one_specialization():
    w = inputs(100, (24,))
    compiled = kiln.compile(model, options=kiln.CompileOptions(recompile_limit=2))
    xs = [inputs(i) for i in range(THREADS)]

    def calls(i):
        return [compiled(xs[i], w) for _ in range(3)]

    results = run_together(calls)
    assert len(state_of(compiled).specializations) == 1
    assert [e.kind for e in state_of(compiled).events] == ["compiled"]
    assert compiled_calls(compiled)[0] > 0, "the compiled program never ran"
    for i, outs in enumerate(results):
        expected = array(model(xs[i], w))
        for out in outs:
            np.testing.assert_allclose(array(out), expected, rtol=1e-5, atol=1e-6)
    # Racing calls used one specialization of the limit of 2: a new shape still compiles.
    y = inputs(7, (5, 24))
    for _ in range(3):
        out = compiled(y, w)
    np.testing.assert_allclose(array(out), array(model(y, w)), rtol=1e-5, atol=1e-6)
    assert len(state_of(compiled).specializations) == 2
    assert compiled_calls(compiled)[1] == 2
    assert not [e for e in state_of(compiled).events if e.kind == "recompile limit"]


def test_racing_calls_of_functions_that_call_each_other():
    inner = kiln.compile(lambda x: x.exp() - x)

    def outer(x):
        return inner(x * 3) + 1  # traced through: one graph for outer

    compiled_outer = kiln.compile(outer)
    xs = [inputs(i) for i in range(THREADS)]

    def calls(i):  # half the threads start with the inner function itself
        if i % 2:
            return [inner(xs[i]) for _ in range(3)]
        return [compiled_outer(xs[i]) for _ in range(3)]

    results = run_together(calls)
    for i, outs in enumerate(results):
        expected = array(xs[i].exp() - xs[i]) if i % 2 else array((xs[i] * 3).exp() - xs[i] * 3 + 1)
        for out in outs:
            np.testing.assert_allclose(array(out), expected, rtol=1e-5, atol=1e-5)
    assert len(state_of(inner).specializations) == 1
    assert len(state_of(compiled_outer).specializations) == 1


def test_two_functions_calling_each_other_after_a_trace_break_do_not_deadlock():
    # Each thread traces one function, stops at .item(), and -- still holding that function's
    # compile lock -- calls the other function, whose lock the other thread holds. Waiting there
    # would be a cycle; the call runs eagerly instead.
    both_tracing = threading.Barrier(2, timeout=JOIN_SECONDS)

    def ping(x, depth):
        s = (x * 2).sum().item()
        if depth:
            both_tracing.wait()
            return pong_compiled(x + s / 100, depth - 1)
        return x * 2

    def pong(x, depth):
        s = (x - 1).sum().item()
        if depth:
            both_tracing.wait()
            return ping_compiled(x - s / 100, depth - 1)
        return x - 1

    ping_compiled, pong_compiled = kiln.compile(ping), kiln.compile(pong)
    x = inputs(3, (4, 6))
    results = run_together(lambda i: (ping_compiled, pong_compiled)[i](x, 1), count=2)
    expected_ping = (x + (x * 2).sum().item() / 100) - 1  # ping's last step is pong's depth-0 branch
    expected_pong = (x - (x - 1).sum().item() / 100) * 2
    np.testing.assert_allclose(array(results[0]), array(expected_ping), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(array(results[1]), array(expected_pong), rtol=1e-5, atol=1e-5)
