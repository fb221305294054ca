"""A cell's step traced by kiln.compile (``nn/_rnn_scan_step.py``): ``rnn_scan`` over one step with a
backward written for one step -- few nodes per step of a Python loop over time, and the compiled
training step equal to eager's (whose step is ``_rnn_step``'s lean node) over several calls."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.optim as optim
from tests.conftest import assert_close
from tests.nn.helpers import cell_loop_calls

CASES = {
    "LSTMCell, loss on h": ("LSTMCell", {}, "h"),
    "LSTMCell, no bias, loss on c": ("LSTMCell", {"bias": False}, "c"),
    "GRUCell": ("GRUCell", {}, "h"),
    "GRUCell, no bias": ("GRUCell", {"bias": False}, "h"),
    "RNNCell": ("RNNCell", {}, "h"),
    "RNNCell, relu": ("RNNCell", {"nonlinearity": "relu"}, "h"),
}


def _loop(name: str, kwargs: dict, reads: str):
    """(cell, step): ``step(xs, h)`` runs the cell over the steps of ``xs`` (T, B, 3), a loss over the
    state ``reads`` of every step, backward and SGD."""
    kiln.manual_seed(3)
    cell = getattr(nn, name)(3, 4, **kwargs, dtype=kiln.float64)
    opt = optim.SGD(cell.parameters(), lr=0.1)
    lstm = name == "LSTMCell"

    def step(xs, h):
        opt.zero_grad()
        state, loss = ((h, h * 0.5) if lstm else h), 0
        for t in range(xs.shape[0]):
            state = cell(xs[t], state)
            read = (state[1] if reads == "c" else state[0]) if lstm else state
            loss = loss + (read**2).sum() * (t + 1)
        loss.backward()
        opt.step()
        return loss.detach()

    return cell, step


def _run(case: str, compiled: bool, calls: int = 3):
    cell, step = _loop(*CASES[case])
    return cell_loop_calls(step, list(cell.parameters()), compiled, calls)


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_cell_loop_equals_eager(case):
    fn, compiled = _run(case, compiled=True)
    _, eager = _run(case, compiled=False)
    for got, want in zip(compiled, eager, strict=True):
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert len(fn.state.specializations) == 1


def _traced_ops(case: str, steps: int) -> Counter:
    _, step = _loop(*CASES[case])
    fn = kiln.compile(step)
    rng = np.random.default_rng(5)
    for _ in range(2):
        xs = kiln.from_numpy(rng.standard_normal((steps, 2, 3))).requires_grad_()
        fn(xs, kiln.zeros(2, 4, dtype=kiln.float64).requires_grad_())
    (spec,) = fn.state.specializations
    return Counter(node.op for node in spec.traced_graph.nodes)


# The nodes one more step of the loop adds to the trace, forward and backward: the cell's own and
# the loss's (about 15: the square, sum, scale and add and their gradients). Through the layer's path
# (rnn_scan and its VJP as written for T steps) they were 58, 62 and 51; 42, 43 and 37 with the
# biases' sum and W_ih's transpose recorded once per call, not per step; 39, 41 and 36 with the
# backward's pieces views of its one row and the cotangent one concatenation with zeros; 36, 41 and
# 33 now (the weights' gradients one product a step, dz^T [x | h | 1], and one sum over the steps).
PER_STEP = {"LSTMCell, loss on h": 36, "GRUCell": 41, "RNNCell": 33}


@pytest.mark.parametrize("case", list(PER_STEP))
def test_a_traced_step_is_few_nodes(case):
    short, long = _traced_ops(case, 3), _traced_ops(case, 4)
    added = long - short
    assert sum(added.values()) <= PER_STEP[case], added
    assert added["rnn_scan"] == added["rnn_scan_backward"] == 1
    assert added["copy"] == 0  # nothing made contiguous: the products read the slices as they are
    assert added["pad"] == 1  # xs[t]'s gradient's: the cotangent is no pad
    # x W_ih^T, dz W_ih (xs requires grad) and the weights' gradients: one product (a GRU's dW_hh another)
    assert added["matmul"] == (4 if case == "GRUCell" else 3)


def test_double_backward_through_a_traced_cell():
    """A gradient penalty: the step's backward under create_graph differentiates the layer's path."""

    def run(compiled: bool):
        kiln.manual_seed(0)
        cell = nn.LSTMCell(3, 4, dtype=kiln.float64)

        def step(xs, h):
            state = (h, h)
            for t in range(xs.shape[0]):
                state = cell(xs[t], state)
            (dh,) = kiln.autograd.grad((state[0] ** 3).sum(), [h], create_graph=True)
            penalty = (dh**2).sum()
            penalty.backward()
            return penalty.detach()

        fn = kiln.compile(step) if compiled else step
        rng = np.random.default_rng(6)
        out = []
        for _ in range(2):
            h = kiln.from_numpy(rng.standard_normal((2, 4))).requires_grad_()
            out.append([fn(kiln.from_numpy(rng.standard_normal((3, 2, 3))), h), cell.weight_hh.grad.clone()])
            cell.zero_grad()
        return out

    for got, want in zip(run(True), run(False), strict=True):
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_bias_changed_in_place_between_steps_is_read_anew():
    """The biases' sum is recorded once per call for the same tensors at the same versions: a
    change in place between two steps makes a new one, as eager reads the new bias. (Without grad:
    a step whose backward saved the bias would refuse the change, eagerly as compiled.)"""

    def run(compiled: bool):
        kiln.manual_seed(1)
        cell = nn.LSTMCell(3, 4, dtype=kiln.float64)

        @kiln.no_grad()
        def step(xs, h):
            state, outs = (h, h), []
            for t in range(xs.shape[0]):
                if t == 2:
                    cell.bias_hh.mul_(0.5)
                    cell.weight_ih.add_(0.25)
                state = cell(xs[t], state)
                outs.append(state[0])
            return kiln.stack(outs)

        fn = kiln.compile(step) if compiled else step
        rng = np.random.default_rng(7)
        out = [fn(kiln.from_numpy(rng.standard_normal((4, 2, 3))), kiln.from_numpy(rng.standard_normal((2, 4))))
               for _ in range(3)]  # fmt: skip
        return out + [cell.bias_hh.detach().clone(), cell.weight_ih.detach().clone()]

    for got, want in zip(run(True), run(False), strict=True):
        assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell"])
def test_two_cells_without_biases_of_other_sizes_in_one_trace(name):
    """The zero biases a bias-free cell scans with are made once per call for each size, never
    shared with a cell of another hidden size."""

    def run(compiled: bool):
        kiln.manual_seed(2)
        first = getattr(nn, name)(3, 5, bias=False, dtype=kiln.float64)
        second = getattr(nn, name)(5, 2, bias=False, dtype=kiln.float64)
        lstm = name == "LSTMCell"

        def step(xs):
            a = kiln.zeros(2, 5, dtype=kiln.float64)
            b = kiln.zeros(2, 2, dtype=kiln.float64)
            a, b = ((a, a), (b, b)) if lstm else (a, b)
            for t in range(xs.shape[0]):
                a = first(xs[t], a)
                b = second(a[0] if lstm else a, b)
            loss = ((b[0] if lstm else b) ** 2).sum()
            loss.backward()
            return loss.detach()

        fn = kiln.compile(step) if compiled else step
        rng = np.random.default_rng(8)
        out = []
        for _ in range(2):
            out.append([fn(kiln.from_numpy(rng.standard_normal((3, 2, 3)))), first.weight_hh.grad.clone()])
            first.zero_grad()
            second.zero_grad()
        return out

    for got, want in zip(run(True), run(False), strict=True):
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("frozen", ["weight_ih", "weight_hh", "bias_ih and bias_hh", "every weight"])
@pytest.mark.parametrize("name", ["LSTMCell", "RNNCell"])
def test_some_weights_frozen(name, frozen):
    """The weights' gradients come through one joined input (``_joined``): a frozen weight gets none,
    the others theirs, and with every weight frozen the inputs still get theirs."""

    def run(compiled: bool):
        kiln.manual_seed(4)
        cell = getattr(nn, name)(3, 4, dtype=kiln.float64)
        for part in frozen.split(" and "):
            for p in cell.parameters() if part == "every weight" else [getattr(cell, part)]:
                p.requires_grad_(False)
        lstm = name == "LSTMCell"

        def step(xs, h):
            state = (h, h * 0.5) if lstm else h
            for t in range(xs.shape[0]):
                state = cell(xs[t], state)
            loss = ((state[0] if lstm else state) ** 2).sum()
            loss.backward()
            return loss.detach()

        _, seen = cell_loop_calls(step, [], compiled)
        grads = [p.grad for p in cell.parameters()]
        return [*(x for call in seen for x in call), *(g if g is None else g.clone() for g in grads)]

    for got, want in zip(run(True), run(False), strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            assert_close(got, want, rtol=1e-10, atol=1e-12)
