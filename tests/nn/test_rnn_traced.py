"""nn.LSTM/GRU/RNN and the cells traced by kiln.compile: each direction of each layer is one ``rnn_scan``
node (and its backward one ``rnn_scan_backward``), so the traced program has the same nodes at any
sequence length; compiled training steps equal eager ones over several calls."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.optim as optim
from kiln.ir.primitives.recurrence_layout import ScanLayout
from tests.conftest import assert_close
from tests.nn.helpers import cell_loop_calls

MODES = {
    "LSTM": (nn.LSTM, {}),
    "GRU": (nn.GRU, {}),
    "RNN": (nn.RNN, {}),
    "RNN_RELU": (nn.RNN, {"nonlinearity": "relu"}),
}
OPTIONS = {
    "1 layer": dict(num_layers=1),
    "2 layers, bidirectional, states": dict(num_layers=2, bidirectional=True, states=True),
    "batch_first, no bias": dict(num_layers=1, batch_first=True, bias=False, states=True),
    "2 layers, batch_first": dict(num_layers=2, batch_first=True),
    "unbatched, bidirectional, states": dict(num_layers=1, bidirectional=True, states=True, unbatched=True),
}


def _module(mode: str, options: dict, dtype):
    cls, extra = MODES[mode]
    kiln.manual_seed(0)
    options = {k: v for k, v in options.items() if k not in ("states", "unbatched")}
    return cls(3, 4, **extra, **options, dtype=dtype)


def _batches(mode: str, options: dict, dtype, calls: int, steps: int = 5) -> list:
    """Per call: (x, states or None), fresh leaves requiring grad."""
    rng = np.random.default_rng(1)
    batch = () if options.get("unbatched") else (2,)
    lead = (*batch, steps) if options.get("batch_first") else (steps, *batch)
    rows = options["num_layers"] * (2 if options.get("bidirectional") else 1)
    out = []
    for _ in range(calls):
        x = kiln.from_numpy(rng.standard_normal((*lead, 3)).astype(dtype)).requires_grad_()
        states = None
        if options.get("states"):
            states = [kiln.from_numpy(rng.standard_normal((rows, *batch, 4)).astype(dtype)).requires_grad_()
                      for _ in range(2 if mode == "LSTM" else 1)]  # fmt: skip
        out.append((x, states))
    return out


def _training_step(module, mode: str):
    """A whole training step: forward, a loss over the output and the final states, backward, SGD."""
    opt = optim.SGD(module.parameters(), lr=0.1, momentum=0.9)

    def step(x, states):
        opt.zero_grad()
        hx = None if states is None else (tuple(states) if mode == "LSTM" else states[0])
        out, state = module(x, hx)
        finals = state if isinstance(state, tuple) else (state,)
        loss = (out * out).sum() + sum((f * (k + 2.0)).sum() for k, f in enumerate(finals)) + out.mean()
        loss.backward()
        opt.step()
        return loss.detach(), out.detach(), *(f.detach() for f in finals)

    return step


def _run(mode: str, options: dict, dtype, compiled: bool, calls: int = 3):
    module = _module(mode, options, dtype)
    step = _training_step(module, mode)
    fn = kiln.compile(step) if compiled else step
    seen = []
    for x, states in _batches(mode, options, dtype, calls):
        results = fn(x, states)
        grads = [x.grad, *(s.grad for s in states or ())]
        seen.append([*results, *grads, *(p.detach().clone() for p in module.parameters())])
    return fn, seen


def _traced_ops(fn) -> list[str]:
    return [node.op for spec in fn.state.specializations for node in spec.traced_graph.nodes]


CASES = [(mode, name, np.float64) for mode in MODES for name in OPTIONS] + [
    ("LSTM", "2 layers, bidirectional, states", np.float32),
    ("GRU", "batch_first, no bias", np.float32),
    ("RNN", "1 layer", np.float32),
]


@pytest.mark.parametrize(("mode", "options", "dtype"), CASES)
def test_compiled_training_step_equals_eager(mode, options, dtype):
    fn, compiled = _run(mode, OPTIONS[options], dtype, compiled=True)
    _, eager = _run(mode, OPTIONS[options], dtype, compiled=False)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    for got, want in zip(compiled, eager, strict=True):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, **tol)
    ops = _traced_ops(fn)
    scans = OPTIONS[options]["num_layers"] * (2 if OPTIONS[options].get("bidirectional") else 1)
    assert fn.state.specializations and ops.count("rnn_scan") == scans * len(fn.state.specializations)
    assert ops.count("rnn_scan_backward") == ops.count("rnn_scan")
    assert "tanh" not in ops and "sigmoid" not in ops  # no per-step gate math outside the primitive


@pytest.mark.parametrize("mode", list(MODES))
def test_traced_program_has_the_same_nodes_at_any_length(mode):
    options = OPTIONS["2 layers, bidirectional, states"]
    counts = []
    for steps in (5, 50):
        module = _module(mode, options, np.float32)
        fn = kiln.compile(_training_step(module, mode))
        for x, states in _batches(mode, options, np.float32, 2, steps=steps):
            fn(x, states)
        assert fn.state.specializations
        counts.append(sorted(_traced_ops(fn)))
        assert counts[-1].count("rnn_scan") == 4 * len(fn.state.specializations)
    assert counts[0] == counts[1]  # the per-step ops would make ten times more nodes at T=50


@pytest.mark.parametrize("mode", list(MODES))
def test_dynamic_length_compiles_one_program(mode):
    module = _module(mode, OPTIONS["2 layers, bidirectional, states"], np.float32)
    fn = kiln.compile(lambda x: module(x)[0], dynamic=True)
    rng = np.random.default_rng(2)
    with kiln.no_grad():
        for steps in (5, 7, 11):
            x = kiln.from_numpy(rng.standard_normal((steps, 2, 3)).astype(np.float32))
            assert_close(fn(x), module(x)[0], rtol=1e-5, atol=1e-6)
    assert len(fn.state.specializations) == 1
    assert fn.state.specializations[0].dynamic == [(0, 0)]
    assert "rnn_scan" in _traced_ops(fn)


def test_dynamic_batch_of_a_batch_first_lstm_compiles_one_program():
    module = _module("LSTM", dict(num_layers=2, bidirectional=True, batch_first=True), np.float32)
    fn = kiln.compile(lambda x: module(x), dynamic=True)
    rng = np.random.default_rng(3)
    with kiln.no_grad():
        for batch in (3, 5, 8):
            x = kiln.from_numpy(rng.standard_normal((batch, 6, 3)).astype(np.float32))
            (out, (h, c)), (want, (want_h, want_c)) = fn(x), module(x)
            for got, expected in ((out, want), (h, want_h), (c, want_c)):
                assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert len(fn.state.specializations) == 1 and fn.state.specializations[0].dynamic == [(0, 0)]


CELLS = {"LSTMCell": {}, "GRUCell": {"bias": False}, "RNNCell": {"nonlinearity": "relu"}}


def _cell_run(name: str, compiled: bool, calls: int = 3):
    kiln.manual_seed(3)
    cell = getattr(nn, name)(3, 4, **CELLS[name], dtype=kiln.float64)
    opt = optim.SGD(cell.parameters(), lr=0.1)

    def step(xs, h):
        opt.zero_grad()
        state, loss = ((h, h * 0.5) if name == "LSTMCell" else h), 0
        for t in range(xs.shape[0]):
            state = cell(xs[t], state)
            loss = loss + ((state[0] if name == "LSTMCell" else state) ** 2).sum() * (t + 1)
        loss.backward()
        opt.step()
        return loss.detach()

    return cell_loop_calls(step, list(cell.parameters()), compiled, calls)


@pytest.mark.parametrize("name", list(CELLS))
def test_compiled_cell_loop_equals_eager(name):
    fn, compiled = _cell_run(name, compiled=True)
    _, eager = _cell_run(name, compiled=False)
    for got, want in zip(compiled, eager, strict=True):
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert _traced_ops(fn).count("rnn_scan") == 4  # one per step of the Python loop


def test_onnx_export_of_an_elman_rnn_records_per_step_ops(tmp_path):
    """ONNX has no rnn_scan: kiln.onnx.export traces RNN layers as per-step ops, even those (an Elman
    RNN) that no ONNX recurrence operator replaces; kiln.export keeps the primitive."""
    ort = pytest.importorskip("onnxruntime")
    kiln.manual_seed(5)
    model = nn.RNN(3, 4, num_layers=2, nonlinearity="relu").eval()
    x = kiln.randn(6, 2, 3)
    kiln.onnx.export(model, (x,), tmp_path / "rnn.onnx", input_names=["x"])
    session = ort.InferenceSession(str(tmp_path / "rnn.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x.numpy()})
    with kiln.no_grad():
        want = model(x)
    assert_close(kiln.from_numpy(got[0]), want[0], rtol=1e-5, atol=1e-6)
    assert "rnn_scan" in [node.op for node in kiln.export(model, x).graph.nodes]


def test_a_subclass_with_its_own_step_runs_that_step():
    """``RNNBase._step`` overridden: the layer runs the subclass's step (the per-step ops), not rnn_scan,
    eagerly and compiled (the fused path before ignored an override)."""

    class HalvedRNN(nn.RNN):
        def _step(self, gx, state, w_hh, b_hh):
            (h,) = super()._step(gx, state, w_hh, b_hh)
            return (h * 0.5,)

    kiln.manual_seed(6)
    model = HalvedRNN(3, 4, dtype=kiln.float64)
    x = kiln.from_numpy(np.random.default_rng(7).standard_normal((5, 2, 3)))
    w_ih, w_hh, b_ih, b_hh = (p.detach().numpy() for p in model.parameters())
    h, want = np.zeros((2, 4)), []
    for t in range(5):
        h = 0.5 * np.tanh(x.numpy()[t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh)
        want.append(h)
    compiled = kiln.compile(lambda x: model(x)[0])
    for run in (lambda x: model(x)[0], compiled, compiled):
        assert_close(run(x), np.stack(want), rtol=1e-12, atol=1e-12)
    assert "rnn_scan" not in _traced_ops(compiled)


def test_recurrences_write_into_the_programs_arena():
    """rnn_scan's packed output and rnn_scan_backward's (3 and 1.7 MiB at the LSTM LM's sizes) are
    memory of the program's arena, reused by each call, not fresh arrays whose pages fault in every
    call; and nothing else is written to make or read them: no pad of the cotangent to the packed
    width, no copy of the backward's dz (the products read it where it lies). (A loss whose gradient
    of the final states is a constant still adds a constant of the packed width: fold_constants
    folds the pad of that constant.)"""
    options = OPTIONS["2 layers, batch_first"]
    module = _module("LSTM", options, np.float32)

    def step(x):
        module.zero_grad()
        out, (h, c) = module(x)
        loss = (out * out).sum() + (h * h).sum() + (c * c).sum()
        loss.backward()
        return loss.detach()

    fn = kiln.compile(step)
    for x, _ in _batches("LSTM", options, np.float32, 2):
        assert_close(fn(x), step(x), rtol=1e-5, atol=1e-6)
    (spec,) = fn.state.specializations
    ops = ("rnn_scan", "rnn_scan_backward")
    found = [n for n in spec.graph.nodes if n.op in ops]
    assert sorted(n.op for n in found) == sorted(ops * 2)
    assert all(n.output in spec.program.plan.offsets for n in found)
    assert "pad" not in [n.op for n in spec.graph.nodes]
    producer = {v: n for n in spec.graph.nodes for v in n.outputs}
    copied = [n for n in spec.graph.nodes if n.op == "copy" and producer[n.inputs[0]].op == "slice"
              and producer[producer[n.inputs[0]].inputs[0]].op == "rnn_scan_backward"]  # fmt: skip
    assert copied == []


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_cotangent_of_the_packed_output_is_not_padded(mode):
    """The output h's and the final states' gradients, which the loss gives, reach rnn_scan_backward
    as they are, one array per part of the packed row, and the parts nobody reads as broadcast zeros:
    nothing of the packed width is written but the forward's output (the gradients were once pads of
    the full width added together, then one joined pad: an LSTM's 3 MiB at the LM's sizes)."""
    module = _module(mode, OPTIONS["1 layer"], np.float32)

    def step(x):
        module.zero_grad()
        out, state = module(x)
        finals = state if isinstance(state, tuple) else (state,)
        loss = (out * out).sum() + sum((f * f * (k + 2.0)).sum() for k, f in enumerate(finals))
        loss.backward()
        return loss.detach()

    fn = kiln.compile(step)
    for x, _ in _batches(mode, OPTIONS["1 layer"], np.float32, 3):
        got, want = fn(x), step(x)
        grads = [p.grad.clone() for p in module.parameters()]
        step(x)
        assert_close(got, want, rtol=1e-5, atol=1e-6)
        for p, g in zip(module.parameters(), grads, strict=True):
            assert_close(g, p.grad, rtol=1e-5, atol=1e-6)
    (spec,) = fn.state.specializations
    (scan,) = [n for n in spec.graph.nodes if n.op == "rnn_scan"]
    packed_shaped = [n.op for n in spec.graph.nodes if n.op != "rnn_scan_backward"
                     and any(v.type.shape == scan.output.type.shape for v in n.outputs)]  # fmt: skip
    assert packed_shaped == ["rnn_scan"]
    (back,) = [n for n in spec.graph.nodes if n.op == "rnn_scan_backward"]
    producer = {v: n for n in spec.graph.nodes for v in n.outputs}
    # (a broadcast zero of a few elements is folded into a constant: fold_constants' FOLD_LIMIT)
    unfolded = {v: producer[v].inputs[0] if producer[v].op == "expand" else v for v in back.inputs[2:]}
    zeros = [v for v in back.inputs[2:] if producer[unfolded[v]].op == "constant"]
    assert len(back.inputs) - 2 == len(ScanLayout(scan.attrs["mode"], 4).parts)
    assert len(zeros) == len(back.inputs) - 2 - (3 if mode == "LSTM" else 2)  # h and the finals are given
