"""A cell's eager step as one lean autograd node (kiln/nn/_rnn_step.py): what it keeps alive per step (the
cyclic collector walks all of it), its gradients against the per-step ops, PyTorch and finite differences,
and the autograd semantics it must keep: version counters, create_graph, hooks, retain_graph."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.nn import _rnn
from kiln.nn._rnn_step import CellStepBackward
from tests.conftest import assert_close, to_torch
from tests.nn.modules.helpers import copy_from_torch

CELLS = [("LSTMCell", {}), ("LSTMCell", {"bias": False}), ("GRUCell", {}), ("RNNCell", {"nonlinearity": "relu"})]


def _cell(name: str, kwargs: dict, dtype=kiln.float64):
    kiln.manual_seed(3)
    return getattr(nn, name)(3, 4, **kwargs, dtype=dtype)


def _states(name: str, rng, batch=2, dtype=np.float64) -> list:
    return [kiln.from_numpy(rng.standard_normal((batch, 4)).astype(dtype)).requires_grad_()
            for _ in range(2 if name == "LSTMCell" else 1)]  # fmt: skip


def _step(cell, name: str, x, states: tuple) -> tuple:
    out = cell(x, states if name == "LSTMCell" else states[0])
    return out if name == "LSTMCell" else (out,)


def _loop(cell, name: str, xs, states, create_graph=False):
    """The steps of ``cell`` over ``xs`` (T, B, in); a loss weighting every step's states (the last c
    left out: a step output with no gradient); with ``create_graph`` a gradient penalty's gradients."""
    leaves = [xs, *cell.parameters(), *states]
    for t in leaves:
        t.grad = None
    s, loss = tuple(states), 0
    for t in range(xs.shape[0]):
        s = _step(cell, name, xs[t], s)
        loss = loss + (s[0] * (t + 1)).sum() + (0 if t == xs.shape[0] - 1 else s[-1].sum())
    if create_graph:
        grads = kiln.autograd.grad(loss, leaves, create_graph=True)
        loss = sum((g * g).sum() for g in grads)
    loss.backward()
    return [t.grad.clone() for t in leaves]


@pytest.fixture
def per_step_ops(monkeypatch):
    """Run the cells on the per-step ops (the reference the fused kernels replace)."""
    return lambda: monkeypatch.setattr(_rnn, "fusable", lambda *args: False)


def test_a_step_keeps_few_objects_for_the_collector():
    """Each object a step's graph keeps alive is walked by every full collection of Python's cyclic
    collector, whose number grows with the graph: a 1,000-step loop spent 260 ms of a 1.1 s training
    step there while a step kept 34 (a Function's context, saved tensors, specs, edges). Now: the node,
    its inputs' tuple, the two output tensors and their version counters."""
    cell = nn.LSTMCell(3, 8)
    x = kiln.randn(200, 4, 3)
    steps = list(x.unbind(0))  # the inputs exist before the loop, as a split of the batch does
    h = c = kiln.zeros(4, 8)
    gc.collect()
    before = len(gc.get_objects())
    for xt in steps:
        h, c = cell(xt, (h, c))
    gc.collect()
    per_step = (len(gc.get_objects()) - before) / len(steps)
    assert per_step <= 7, per_step
    assert isinstance(h.grad_fn, CellStepBackward)
    h.sum().backward()  # and the graph backpropagates
    assert cell.weight_hh.grad is not None


@pytest.mark.parametrize(("name", "kwargs"), CELLS)
def test_loop_gradients_equal_the_per_step_ops(per_step_ops, name, kwargs):
    rng = np.random.default_rng(1)
    cell = _cell(name, kwargs)
    xs = kiln.from_numpy(rng.standard_normal((4, 2, 3))).requires_grad_()
    states = _states(name, rng)
    got = _loop(cell, name, xs, states)
    assert isinstance(_step(cell, name, xs[0], tuple(states))[0].grad_fn, CellStepBackward)
    per_step_ops()
    want = _loop(cell, name, xs, states)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("name", "kwargs"), CELLS)
def test_double_backward_equals_the_per_step_ops(per_step_ops, name, kwargs):
    """create_graph: the node's backward differentiates the rnn_scan primitive's path."""
    rng = np.random.default_rng(2)
    cell = _cell(name, kwargs)
    xs = kiln.from_numpy(rng.standard_normal((3, 2, 3))).requires_grad_()
    states = _states(name, rng)
    got = _loop(cell, name, xs, states, create_graph=True)
    per_step_ops()
    want = _loop(cell, name, xs, states, create_graph=True)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize(("name", "kwargs"), CELLS)
def test_finite_differences(name, kwargs):
    rng = np.random.default_rng(3)
    cell = _cell(name, kwargs)
    xs = kiln.from_numpy(rng.standard_normal((2, 2, 3))).requires_grad_()
    states = _states(name, rng)

    def run(x, *s):
        for t in range(x.shape[0]):
            s = _step(cell, name, x[t], s)
        return s

    assert kiln.autograd.gradcheck(run, (xs, *states))
    assert kiln.autograd.gradgradcheck(run, (xs, *states))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lstm_cell_loop_matches_torch(torch, dtype):
    tcell, kcell = torch.nn.LSTMCell(3, 5, dtype=getattr(torch, dtype)), nn.LSTMCell(3, 5, dtype=getattr(kiln, dtype))
    copy_from_torch(torch, tcell, kcell)
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((6, 2, 3)).astype(dtype)
    h0, c0 = (rng.standard_normal((2, 5)).astype(dtype) for _ in range(2))
    results = []
    for cell, wrap in ((kcell, kiln.from_numpy), (tcell, lambda a: to_torch(torch, a))):
        leaves = [wrap(a.copy()).requires_grad_() for a in (xs, h0, c0)]
        h, c = leaves[1], leaves[2]
        total = 0
        for t in range(xs.shape[0]):
            h, c = cell(leaves[0][t], (h, c))
            total = total + (h * h).sum()
        total.backward()
        results.append([h.detach(), c.detach(), *(t.grad for t in leaves), *(p.grad for p in cell.parameters())])
    tol = {"float32": (1e-4, 1e-5), "float64": (1e-10, 1e-12)}[dtype]
    for a, b in zip(*results, strict=True):
        assert_close(a, b.numpy(), rtol=tol[0], atol=tol[1])


def test_in_place_change_of_an_input_is_an_error():
    cell = _cell("LSTMCell", {})
    rng = np.random.default_rng(5)
    x = kiln.from_numpy(rng.standard_normal((2, 3)))
    h, c = _states("LSTMCell", rng)
    h2, _ = cell(x, (h * 1, c * 1))
    with kiln.no_grad():
        x.mul_(2)  # x needs no gradient, but dW_ih reads it
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*LSTMCellBackward"):
        h2.sum().backward()


@pytest.mark.parametrize(("name", "kwargs"), CELLS)
def test_in_place_change_of_an_output_leaves_the_gradient_alone(name, kwargs):
    """The new states are the forward's arrays, which one step's backward never reads."""
    cell = _cell(name, kwargs)
    rng = np.random.default_rng(5)
    x = kiln.from_numpy(rng.standard_normal((2, 3)))
    states = tuple(_states(name, rng))
    sum(s.sum() for s in _step(cell, name, x, states)).backward()
    want = [p.grad.clone() for p in cell.parameters()]
    cell.zero_grad()
    outputs = _step(cell, name, x, states)
    loss = sum(s.sum() for s in outputs)
    with kiln.no_grad():
        for s in outputs:
            s.mul_(3)
    loss.backward()
    for p, w in zip(cell.parameters(), want, strict=True):
        assert_close(p.grad, w, rtol=1e-12, atol=1e-12)


def test_hooks_retain_graph_and_a_freed_graph():
    cell = _cell("LSTMCell", {})
    rng = np.random.default_rng(6)
    x = kiln.from_numpy(rng.standard_normal((2, 3)))
    h, c = _states("LSTMCell", rng)
    h2, c2 = cell(x, (h, c))
    seen = []
    h2.register_hook(lambda g: g * 2)  # doubles what reaches the node through h'
    h2.grad_fn.register_hook(lambda grads_in, grads_out: seen.append(len(grads_in)))
    loss = h2.sum()
    loss.backward(retain_graph=True)
    once = h.grad.clone()
    assert seen == [7]
    loss.backward()
    assert_close(h.grad, 2 * once.numpy(), rtol=1e-12, atol=1e-12)
    h.grad = None
    h3, _ = cell(x, (h, c))
    h3.sum().backward()
    assert_close(once, 2 * h.grad.numpy(), rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_no_grad_and_unbatched_steps():
    cell = _cell("LSTMCell", {})
    with kiln.no_grad():
        h, c = cell(kiln.randn(2, 3, dtype=kiln.float64))
    assert h.grad_fn is None and not c.requires_grad
    x = kiln.randn(3, dtype=kiln.float64, requires_grad=True)
    h, c = cell(x)
    assert tuple(h.shape) == (4,) and tuple(c.shape) == (4,)
    h.sum().backward()
    assert tuple(x.grad.shape) == (3,)


def test_anomaly_mode_names_the_step_that_made_a_nan():
    cell = _cell("LSTMCell", {})
    x = kiln.randn(2, 3, dtype=kiln.float64)
    h = kiln.zeros(2, 4, dtype=kiln.float64).requires_grad_()
    with kiln.autograd.detect_anomaly():
        h2, _ = cell(x, (h, h))  # the line anomaly mode names
        with pytest.raises(RuntimeError, match=r"(?s)'LSTMCellBackward' returned nan values.*test_rnn_step.py"):
            h2.backward(kiln.full((2, 4), float("nan"), dtype=kiln.float64))


def test_a_trace_in_another_thread_leaves_this_ones_steps_lean(monkeypatch):
    """Eager kernels trace composites in a background thread while a fresh process's first steps run:
    the count of traces running anywhere is then above 0, but none records this thread's ops, so a
    cell's step keeps its fused path (it fell back to ops). This thread's own trace still records ops."""
    from kiln.frontend.jit import state
    from kiln.nn import _rnn_step

    cell = kiln.nn.LSTMCell(3, 4)
    x = kiln.randn(2, 3)
    tensors = (kiln.zeros(2, 4), kiln.zeros(2, 4), cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    assert _rnn_step.lean(x, tensors)
    monkeypatch.setattr(state, "tracing", state.tracing + 1)  # (another thread's trace, as the count sees it)
    assert _rnn_step.lean(x, tensors)
    token = state.current.set(object())  # this thread's own trace
    try:
        assert not _rnn_step.lean(x, tensors)
    finally:
        state.current.reset(token)
