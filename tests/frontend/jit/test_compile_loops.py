"""Python loops over time steps and layers, compiled with their iterations rolled into loop nodes.

Every program runs compiled and eagerly from the same initial state over several calls; losses,
results, parameters (after SGD or Adam) and the arguments must agree. The compiled graph must not
grow with the trip count, and the loop nodes must really be there (and gone with ``loops=False``).
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.graph import LOOP
from kiln.runtime.executor import ExternCall, KernelCall
from kiln.runtime.loop_call import LoopCall

from .helpers import compiled_calls, state_of

nn = kiln.nn


def _lstm_cells(hidden, dtype):
    cell1, cell2, head = nn.LSTMCell(1, hidden), nn.LSTMCell(hidden, hidden), nn.Linear(hidden, 1)
    return [cell1, cell2, head], lambda x, state: _two_lstm_steps(cell1, cell2, head, x, state)


def _two_lstm_steps(cell1, cell2, head, x, state):
    h1, c1, h2, c2 = state
    h1, c1 = cell1(x, (h1, c1))
    h2, c2 = cell2(h1, (h2, c2))
    return head(h2), (h1, c1, h2, c2)


def _gru_cell(hidden, dtype):
    cell, head = nn.GRUCell(1, hidden), nn.Linear(hidden, 1)

    def step(x, state):
        (h,) = state
        h = cell(x, h)
        return head(h), (h,)

    return [cell, head], step


def _tanh_cell(hidden, dtype):
    inp, rec, head = nn.Linear(1, hidden), nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, 1)

    def step(x, state):
        (h,) = state
        h = kiln.tanh(inp(x) + rec(h))
        return head(h), (h,)

    return [inp, rec, head], step


CELLS = {"lstm": (_lstm_cells, 4), "gru": (_gru_cell, 1), "tanh": (_tanh_cell, 1)}


def _program(cell: str, hidden: int, dtype, optimizer: str | None):
    """A fresh model (seeded) and its step over the time steps of ``inputs``."""
    kiln.manual_seed(0)
    make, states = CELLS[cell]
    modules, cell_step = make(hidden, dtype)
    params = [p for m in modules for p in m.parameters()]
    for m in modules:
        m.to(dtype)
    opt = None
    if optimizer == "sgd":
        opt = kiln.optim.SGD(params, lr=0.1)
    elif optimizer == "adam":
        opt = kiln.optim.Adam(params, lr=0.01)

    def step(inputs, targets):
        rows = inputs.shape[0]
        state = tuple(kiln.zeros(rows, hidden, dtype=dtype) for _ in range(states))
        outputs = []
        for x in inputs.split(1, dim=1):  # the Python loop over time steps
            y, state = cell_step(x, state)
            outputs.append(y)
        predicted = kiln.cat(outputs, dim=1)
        loss = nn.functional.mse_loss(predicted, targets)
        if opt is None:
            return predicted, loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step, params


def _batches(steps: int, dtype, count: int = 4):
    rng = np.random.default_rng(1)
    return [tuple(kiln.tensor(rng.standard_normal((3, steps)).astype(dtype)) for _ in range(2)) for _ in range(count)]


def _loop_nodes(compiled):
    return [n for n in state_of(compiled).specializations[-1].graph.nodes if n.op == LOOP]


def _against_eager(cell, dtype, optimizer, steps=12, hidden=5, options=None):
    eager, eager_params = _program(cell, hidden, kiln.float64 if dtype == np.float64 else kiln.float32, optimizer)
    step, params = _program(cell, hidden, kiln.float64 if dtype == np.float64 else kiln.float32, optimizer)
    compiled = kiln.compile(step, options=options)
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == np.float64 else {"rtol": 2e-5, "atol": 2e-6}
    for inputs, targets in _batches(steps, dtype):
        got, want = compiled(inputs, targets), eager(inputs.clone(), targets.clone())
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                        strict=True):  # fmt: skip
            np.testing.assert_allclose(g.detach().numpy(), w.detach().numpy(), **tol)
        if optimizer is None:  # the compiled backward of the loss, outside the call (itself a compiled graph)
            got[1].backward()
            want[1].backward()
        for p, q in zip(params, eager_params, strict=True):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), **tol)
            if optimizer is None:
                np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), **tol)
                p.grad = q.grad = None
    assert sum(compiled_calls(compiled)) >= 2, "the compiled program ran"
    return compiled


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_over_time_steps_matches_eager_and_rolls(cell, optimizer):
    dtype = np.float64 if optimizer == "adam" else np.float32
    compiled = _against_eager(cell, dtype, optimizer)
    loops = _loop_nodes(compiled)
    assert len(loops) >= 2, "the forward steps and their backward each roll into a loop"
    assert max(n.attrs["trips"] for n in loops) >= 8


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_then_backward_outside_the_call_matches_eager(dtype):
    compiled = _against_eager("lstm", dtype, None)
    (loop,) = _loop_nodes(compiled)  # the forward graph's
    assert loop.attrs["trips"] >= 10


def test_each_trips_new_arrays_are_read_not_remembered():
    """A trip's carried and per-iteration inputs are new arrays every trip: the body's kernels read their
    pointers from the trip's environment, with no weak reference per input and trip, and views of them
    are made anew (``CompiledProgram.vary_inputs``); the invariants (the weights) are still remembered.
    The results match eager over several calls (``_against_eager``)."""
    compiled = _against_eager("lstm", np.float32, "sgd")
    program = state_of(compiled).specializations[-1].program
    calls = [s for s in program._steps if isinstance(s, LoopCall)]
    assert len(calls) >= 2, "the forward steps and their backward each roll into a loop"
    read = views = small = into = 0
    for call in calls:
        body, loop = call.program, call.loop
        for step, run in zip(body._steps, body._runs, strict=True):  # the call loop's cases, chosen once
            small += isinstance(step, KernelCall) and run == step._run_small
            into += isinstance(step, ExternCall) and run == step._run_into
        first = len(loop.carried) + loop.invariant
        varying = [*range(len(loop.carried)), *range(first, first + loop.per_iteration)]
        slots = {body._input_slots[i] for i in varying}
        for kernel in body.kernel_calls:
            assert not [slot for _, slot in kernel.stable if slot in slots], kernel.describe()
            read += sum(slot in slots for _, slot in kernel.dynamic)
        tables = body._frame().tables  # only the inputs some table holds are compared and remembered
        assert not set(tables._watched) & set(varying) and len(tables._refs) <= len(tables._watched)
        for step, run in zip(body._steps, body._runs, strict=True):
            if isinstance(step, ExternCall) and not step.normalize and set(step.args) & slots:
                assert not step.keep_views and step.last is None, step.describe()
                # the call loop's choice follows ``vary_inputs``: no kept view of a trip's array
                assert run != step._run_kept_view, step.describe()
                views += 1
    assert read and views, "no kernel or view reads a trip's input: the test tests nothing"
    assert small and into, "no body kernel or product runs on a short path (``runner``)"


def test_a_trips_extern_results_are_not_copied():
    """An extern's result (``rnn_scan``'s packed states, stacked for the backward) is new memory at every trip:
    the loop hands it on as it is; a view among the body's outputs is still copied. Results match eager."""
    compiled = _against_eager("lstm", np.float32, "sgd")
    program = state_of(compiled).specializations[-1].program
    seen = set()
    for call in (s for s in program._steps if isinstance(s, LoopCall)):
        producers = {v: n.op for n in call.loop.body.nodes for v in n.outputs}
        for j, v in enumerate(call.loop.body.outputs):
            seen.add(producers.get(v))
            if producers.get(v) == "rnn_scan":
                assert j not in call.copied
            if producers.get(v) == "reshape":
                assert j in call.copied
    assert "rnn_scan" in seen, "no rnn_scan among the loops' outputs: the test tests nothing"


def test_the_interpreter_runs_the_loops():
    compiled = _against_eager("gru", np.float64, "sgd", options=kiln.CompileOptions(backend="interpreter"))
    assert _loop_nodes(compiled)


def test_loops_off_leaves_the_steps_unrolled():
    compiled = _against_eager("tanh", np.float32, "sgd", options=kiln.CompileOptions(loops=False))
    assert not _loop_nodes(compiled)


def test_the_compiled_graph_does_not_grow_with_the_trip_count():
    """Only views outside the loops grow with T (the time steps' slices of the input and of its
    gradient, and the views of those: their attributes name the step, or they are views of a graph
    input that ``roll_loops`` moves in front), at most four a step; kernels, externs and the loops'
    bodies do not."""
    views = ("slice", "reshape", "permute")
    sizes, grown = [], []
    for steps in (10, 40):
        compiled = _against_eager("lstm", np.float32, "sgd", steps=steps)
        spec = state_of(compiled).specializations[-1]
        ops = [n.op for n in spec.graph.nodes]
        bodies = [len(n.attrs["bodies"][0].nodes) for n in spec.graph.nodes if n.op == LOOP]
        assert bodies, "the steps were not rolled"
        sizes.append((sorted(op for op in ops if op not in views), bodies, spec.report.kernels))
        grown.append(sum(ops.count(v) for v in views))
    assert sizes[0] == sizes[1]
    assert grown[1] - grown[0] <= 4 * (40 - 10)


def test_a_loop_over_layers_of_one_shape_trains_as_eager_does():
    def make():
        kiln.manual_seed(0)
        layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(20)])
        opt = kiln.optim.Adam(layers.parameters(), lr=0.01)

        def step(x):
            for layer in layers:
                x = kiln.tanh(layer(x))
            loss = (x * x).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        return step, list(layers.parameters())

    eager, eager_params = make()
    step, params = make()
    compiled = kiln.compile(step)
    rng = np.random.default_rng(2)
    for _ in range(4):
        x = kiln.tensor(rng.standard_normal((4, 6)).astype(np.float32))
        np.testing.assert_allclose(compiled(x).numpy(), eager(x.clone()).numpy(), rtol=2e-5, atol=1e-6)
        for p, q in zip(params, eager_params, strict=True):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=2e-5, atol=1e-6)
    assert sum(compiled_calls(compiled)) >= 2
    assert _loop_nodes(compiled), "the layers' forward (weights per iteration) rolls"


def test_explain_reports_the_loops():
    compiled = _against_eager("tanh", np.float32, None)
    text = str(kiln.explain(compiled))
    assert "trips of a" in text and " loop(s), " in text and "compiled primitives: loop" not in text


def test_kiln_loops_0_switches_rolling_off(monkeypatch):
    monkeypatch.setenv("KILN_LOOPS", "0")
    assert kiln.CompileOptions().loops is False
    monkeypatch.setenv("KILN_LOOPS", "1")
    assert kiln.CompileOptions().loops is True
    with pytest.raises(ValueError, match="loops must be True or False"):
        kiln.CompileOptions(loops="yes")


def test_a_cache_hit_loads_the_loops_and_their_bodies(tmp_path, monkeypatch):
    """The program cache stores the graph with its loop nodes; a hit compiles each body again
    (itself a hit) and runs as the first compile did."""
    from kiln.codegen.llvm import kernel_cache
    from kiln.compiler import program_cache
    from kiln.runtime.cache import DiskCache

    cache = DiskCache(tmp_path / "programs")
    monkeypatch.setattr(program_cache, "disk_cache", lambda: cache)
    monkeypatch.setattr(kernel_cache, "kernel_cache", lambda: DiskCache(tmp_path / "kernels"))
    first = _against_eager("gru", np.float64, "sgd")
    second = _against_eager("gru", np.float64, "sgd")
    reports = [state_of(c).specializations[-1].report for c in (first, second)]
    assert [r.cache for r in reports] == ["miss", "hit"]
    described = [[line for line in r.loops if not line.startswith(" ")] for r in reports]
    assert _loop_nodes(second) and described[0] == described[1] and "trips of a" in described[0][0]
    assert "compile cache: hit" in "\n".join(reports[1].loops)  # the bodies' own entries


def test_a_loop_that_mutates_its_argument_in_place_writes_it_back():
    def f(state, xs, w):
        for t in range(xs.shape[0]):
            state.mul_(0.5).add_(kiln.tanh(xs[t] @ w))
        return state.sum()

    rng = np.random.default_rng(3)
    w = kiln.tensor(rng.standard_normal((4, 4)))
    compiled = kiln.compile(f)
    for _ in range(4):
        xs = kiln.tensor(rng.standard_normal((24, 3, 4)))
        state = kiln.tensor(rng.standard_normal((3, 4)))
        eager_state = state.clone()
        np.testing.assert_allclose(compiled(state, xs, w).numpy(), f(eager_state, xs, w).numpy(), rtol=1e-12)
        np.testing.assert_allclose(state.numpy(), eager_state.numpy(), rtol=1e-12, atol=1e-14)
    assert sum(compiled_calls(compiled)) >= 2
    assert _loop_nodes(compiled)


def test_dropout_inside_the_steps_draws_what_eager_draws():
    """Random bits inside a rolled loop: each step's mask is eager's (the generator's counter per step)."""

    def make():
        kiln.manual_seed(0)
        cell, head, drop = nn.GRUCell(3, 6), nn.Linear(6, 1), nn.Dropout(0.3)
        opt = kiln.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)

        def step(x):
            h, outs = None, []
            for xt in x.unbind(1):
                h = cell(drop(xt), h)
                outs.append(head(h))
            loss = (kiln.stack(outs, 1) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        return step

    eager, compiled = make(), kiln.compile(make())
    rng = np.random.default_rng(0)
    for call in range(4):
        x = kiln.tensor(rng.standard_normal((2, 16, 3)).astype(np.float32))
        kiln.manual_seed(100 + call)
        want = eager(x)
        kiln.manual_seed(100 + call)
        np.testing.assert_allclose(compiled(x).numpy(), want.numpy(), rtol=2e-5)
    assert sum(compiled_calls(compiled)) >= 2
    assert _loop_nodes(compiled)
