"""One direction of a traced layer (kiln/nn/_rnn_scan.py): rnn_scan read as (output, final states) by one
autograd node, whose backward gives rnn_scan_backward each part of the cotangent as it is -- gradients
against finite differences and the per-step ops, first and second order, and no pad of the packed
width in a traced call."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.primitives.recurrence_layout import GATES, MODES
from kiln.nn import _rnn_scan
from tests.conftest import assert_close


def _inputs(mode: str, rng, steps: int = 4, batch: int = 2, size: int = 3, hidden: int = 3):
    """(x, state tuple, weights) in float64, small enough that no gate saturates, all requiring grad."""
    gates = GATES[mode] * hidden
    t = lambda *shape: kiln.from_numpy(rng.normal(size=shape) * 0.5).requires_grad_()  # noqa: E731
    state = (t(batch, hidden), t(batch, hidden)) if mode == "LSTM" else (t(batch, hidden),)
    return t(steps, batch, size), state, (t(gates, size), t(gates, hidden), t(gates), t(gates))


def _layer(mode: str, reverse: bool, n_states: int):
    def run(x, *flat):
        state, weights = flat[:n_states], flat[n_states:]
        out, finals = _rnn_scan.scan_direction(mode, x, tuple(state), tuple(weights), reverse)
        return (out, *finals)

    return run


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_first_and_second_order(mode, reverse):
    """Against finite differences in float64: every input, the output and each final state read."""
    x, state, weights = _inputs(mode, np.random.default_rng(1))
    run = _layer(mode, reverse, len(state))
    assert kiln.autograd.gradcheck(run, (x, *state, *weights))
    assert kiln.autograd.gradgradcheck(run, (x, *state, *weights))


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_only_some_outputs_read_and_some_inputs_frozen(mode):
    """A loss of the output alone (no final state's gradient), or of one final state alone, with the
    recurrent weight frozen: the gradients of the same layer written step by step with plain ops."""
    rng = np.random.default_rng(2)
    x, state, weights = _inputs(mode, rng)
    weights[1].requires_grad_(False)
    run = _layer(mode, False, len(state))
    for pick in (lambda r: (r[0] * r[0]).sum(), lambda r: (r[-1] * 3.0).sum()):
        leaves = [x, *state, weights[0], *weights[2:]]
        got = kiln.autograd.grad(pick(run(x, *state, *weights)), leaves)
        want = _per_step(mode, x, state, weights, pick, leaves)
        for g, w in zip(got, want, strict=True):
            assert_close(g, w, rtol=1e-10, atol=1e-12)


def _per_step(mode, x, state, weights, pick, leaves):
    """The same layer written with plain ops, step by step."""
    w_ih, w_hh, b_ih, b_hh = weights
    h, c = state[0], (state[1] if mode == "LSTM" else None)
    outs = []
    for t in range(x.shape[0]):
        gi, gh = x[t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh
        if mode == "LSTM":
            i, f, g, o = (gi + gh).chunk(4, dim=1)
            c = i.sigmoid() * g.tanh() + f.sigmoid() * c
            h = o.sigmoid() * c.tanh()
        else:
            (ri, zi, ni), (rh, zh, nh) = gi.chunk(3, dim=1), gh.chunk(3, dim=1)
            r, z = (ri + rh).sigmoid(), (zi + zh).sigmoid()
            n = (ni + r * nh).tanh()
            h = n + z * (h - n)
        outs.append(h)
    finals = (h, c) if mode == "LSTM" else (h,)
    return kiln.autograd.grad(pick((kiln.stack(outs), *finals)), leaves)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_a_traced_call_writes_no_pad_of_the_packed_width(mode):
    """The traced call runs the step for real: its layer's cotangent reaches rnn_scan_backward in parts,
    not as autograd's zero pad of the packed width (an LSTM LM's at T=350: 2 x 7.9 MB of fresh memory,
    40-110 ms of page faults in the first call)."""
    kiln.manual_seed(0)
    module = {"LSTM": kiln.nn.LSTM, "GRU": kiln.nn.GRU, "RNN": kiln.nn.RNN}[mode](3, 4, num_layers=2)

    def step(x):
        module.zero_grad()
        out, _ = module(x)
        (out * out).sum().backward()
        return [p.grad for p in module.parameters()]

    fn = kiln.compile(step)
    x = kiln.randn(6, 2, 3)
    for _ in range(2):
        for got, want in zip(fn(x), step(x), strict=True):
            assert_close(got, want, rtol=1e-5, atol=1e-6)
    (spec,) = fn.state.specializations
    packed = {n.output.type.shape for n in spec.traced_graph.nodes if n.op == "rnn_scan"}
    assert [n.op for n in spec.traced_graph.nodes if n.op == "pad" and n.output.type.shape in packed] == []
