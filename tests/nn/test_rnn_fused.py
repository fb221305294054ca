"""The fused RNN layers (kiln/nn/_rnn.py): eagerly one autograd node per layer, equal to the per-step ops
they replace (values and gradients, every option), to PyTorch, and to finite differences; the compiled
path (the rnn_scan primitive, more in test_rnn_traced.py) agrees with the fused eager one."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.optim as optim
from kiln.nn import _rnn
from kiln.nn._rnn_step import CellStepBackward
from tests.conftest import assert_close, to_torch
from tests.nn.modules.helpers import leaf_pair, module_pair

MODES = {
    "LSTM": (nn.LSTM, {}),
    "GRU": (nn.GRU, {}),
    "RNN": (nn.RNN, {}),
    "RNN_RELU": (nn.RNN, {"nonlinearity": "relu"}),
}
OPTIONS = [
    dict(num_layers=1),
    dict(num_layers=2, bidirectional=True),
    dict(num_layers=2, batch_first=True, bias=False),
    dict(num_layers=3, bidirectional=True, batch_first=True),
]


@pytest.fixture
def decomposed(monkeypatch):
    """Run the modules on the per-step ops (the path before the fused layers, and the traced one)."""

    def use(on: bool) -> None:
        if on:
            monkeypatch.setattr(_rnn, "fusable", lambda *args: False)
        else:
            monkeypatch.undo()

    return use


def _module(mode: str, options: dict, dtype=kiln.float64):
    cls, extra = MODES[mode]
    kiln.manual_seed(0)
    return cls(3, 4, **extra, **options, dtype=dtype)


def _inputs(mode: str, options: dict, rng, unbatched=False, with_state=True, dtype=np.float64):
    """(x, states) leaves requiring grad; states None, an h tensor or an LSTM's (h, c)."""
    lead = (5,) if unbatched else ((2, 5) if options.get("batch_first") else (5, 2))
    x = kiln.from_numpy(rng.standard_normal((*lead, 3)).astype(dtype)).requires_grad_()
    if not with_state:
        return x, None
    rows = options["num_layers"] * (2 if options.get("bidirectional") else 1)
    shape = (rows, 4) if unbatched else (rows, 2, 4)
    states = [kiln.from_numpy(rng.standard_normal(shape).astype(dtype)).requires_grad_()
              for _ in range(2 if mode == "LSTM" else 1)]  # fmt: skip
    return x, (tuple(states) if mode == "LSTM" else states[0])


def _flat(result) -> list:
    out, state = result
    return [out, *(state if isinstance(state, tuple) else (state,))]


def _state_leaves(states) -> list:
    return [] if states is None else list(states) if isinstance(states, tuple) else [states]


def _run(module, x, states, seed=None):
    """Outputs, and the gradients of one weighted sum of them for x, the states and every parameter."""
    leaves = [x, *module.parameters(), *_state_leaves(states)]
    for t in leaves:
        t.grad = None
    if seed is not None:
        kiln.manual_seed(seed)
    outs = _flat(module(x) if states is None else module(x, states))
    weights = np.random.default_rng(7)
    loss = sum((o * kiln.from_numpy(weights.standard_normal(tuple(o.shape)))).sum() for o in outs)
    loss.backward()
    return [o.detach().clone() for o in outs], [t.grad.clone() for t in leaves]


def _node_names(root) -> list[str]:
    seen, todo, names = set(), [root], []
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names.append(node.name())
        todo += [edge[0] for edge in node.next_edges if edge is not None]
    return names


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", ["state", "no_state", "unbatched"])
def test_fused_equals_the_per_step_ops(decomposed, mode, options, case):
    module = _module(mode, options)
    x, states = _inputs(mode, options, np.random.default_rng(1), unbatched=case == "unbatched",
                        with_state=case != "no_state")  # fmt: skip
    fused = _run(module, x, states)
    out = _flat(module(x, states) if states is not None else module(x))[0]
    assert _node_names(out.grad_fn).count("_FusedLayerBackward") == options["num_layers"]
    decomposed(True)
    reference = _run(module, x, states)
    for got, want in zip(fused[0] + fused[1], reference[0] + reference[1], strict=True):
        assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_graphs_of_other_lengths_backward_in_any_order(decomposed, mode):
    """The backward's temporaries are scratch memory shared across calls (``recurrence_numpy.scratch``):
    graphs of a long and a short sequence, built first and run backward in turn, each get their own
    exact gradients."""
    options = dict(num_layers=2, bidirectional=True)
    module = _module(mode, options)
    rng = np.random.default_rng(3)
    xs = [kiln.from_numpy(rng.standard_normal((steps, 2, 3))).requires_grad_() for steps in (7, 3)]
    weights = [kiln.from_numpy(rng.standard_normal((steps, 2, 8))) for steps in (7, 3)]

    def grads(order):
        losses = [(module(x)[0] * w).sum() for x, w in zip(xs, weights, strict=True)]
        found = {}
        for k in order:
            found[k] = kiln.autograd.grad(losses[k], [xs[k], *module.parameters()])
        return [found[k] for k in range(2)]

    fused = grads([1, 0])
    again = grads([0, 1])
    decomposed(True)
    reference = grads([0, 1])
    for got, other, want in zip(fused, again, reference, strict=True):
        for a, b, c in zip(got, other, want, strict=True):
            assert_close(a, c, rtol=1e-10, atol=1e-12)
            assert_close(b, c, rtol=1e-10, atol=1e-12)


def test_a_layer_is_one_autograd_node():
    m = nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    out, (h, c) = m(kiln.randn(6, 2, 3))
    assert out.grad_fn.name() == "_FusedLayerBackward"
    assert out.grad_fn.next_edges[2][0].name() == "_FusedLayerBackward"  # layer 1's input is layer 0's output
    names = _node_names(out.grad_fn)
    assert names.count("_FusedLayerBackward") == 2
    assert names.count("AccumulateGrad") == 16  # the parameters, nothing per step
    assert len(names) == 18, names


@pytest.mark.parametrize("training", [True, False])
def test_dropout_between_layers_draws_what_the_per_step_path_draws(decomposed, training):
    module = _module("LSTM", dict(num_layers=3, dropout=0.5))
    module.train(training)
    x, states = _inputs("LSTM", dict(num_layers=3), np.random.default_rng(2))
    fused = _run(module, x, states, seed=5)
    decomposed(True)
    reference = _run(module, x, states, seed=5)
    for got, want in zip(fused[0] + fused[1], reference[0] + reference[1], strict=True):
        assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN", "RNN_RELU"])
def test_fused_matches_torch(torch, mode, dtype):
    name, extra = ("RNN", MODES[mode][1]) if mode.startswith("RNN") else (mode, {})
    tmod, kmod = module_pair(torch, name, 3, 5, num_layers=2, bidirectional=True, **extra)
    if dtype == np.float64:
        tmod, kmod = tmod.double(), kmod.double()
    rng = np.random.default_rng(3)
    kx, tx = leaf_pair(torch, rng.standard_normal((7, 4, 3)).astype(dtype))
    states = [leaf_pair(torch, rng.standard_normal((4, 4, 5)).astype(dtype)) for _ in range(2 if mode == "LSTM" else 1)]
    kh = tuple(s[0] for s in states) if mode == "LSTM" else states[0][0]
    th = tuple(s[1] for s in states) if mode == "LSTM" else states[0][1]
    kouts, touts = _flat(kmod(kx, kh)), _flat(tmod(tx, th))
    assert kouts[0].grad_fn.name() == "_FusedLayerBackward"
    gs = [rng.standard_normal(tuple(t.shape)).astype(dtype) for t in touts]
    sum((k * kiln.from_numpy(g.copy())).sum() for k, g in zip(kouts, gs, strict=True)).backward()
    sum((t * to_torch(torch, g)).sum() for t, g in zip(touts, gs, strict=True)).backward()
    rtol, atol = (1e-4, 1e-5) if dtype == np.float32 else (1e-10, 1e-12)
    for k, t in zip(kouts, touts, strict=True):
        assert_close(k, t, rtol=rtol, atol=atol)
    assert_close(kx.grad, tx.grad, rtol=rtol, atol=atol)
    for ks, ts in states:
        assert_close(ks.grad, ts.grad, rtol=rtol, atol=atol)
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("directions", [1, 2])
@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"])
def test_fused_layer_gradcheck(mode, directions, bias):
    rng = np.random.default_rng(4)
    gates = {"LSTM": 4, "GRU": 3}.get(mode, 1)

    def leaf(*shape):
        return kiln.from_numpy(rng.standard_normal(shape) * 0.6).requires_grad_()

    x = leaf(4, 2, 3)
    per_direction = []
    for _ in range(directions):
        state = (leaf(2, 3), leaf(2, 3)) if mode == "LSTM" else (leaf(2, 3),)
        weights = [leaf(gates * 3, 3), leaf(gates * 3, 3)] + ([leaf(gates * 3), leaf(gates * 3)] if bias else [])
        per_direction.append((state, weights))
    flat = [t for state, weights in per_direction for t in (*state, *weights)]
    size = len(flat) // directions
    states_at = 2 if mode == "LSTM" else 1

    def fn(x, *flat):
        groups = [flat[d * size : (d + 1) * size] for d in range(directions)]
        states = [tuple(g[:states_at]) for g in groups]
        weights = [tuple(g[states_at:]) if bias else (*g[states_at:], None, None) for g in groups]
        y, finals = _rnn.fused_layer(mode, x, states, weights)
        assert y.grad_fn.name() == "_FusedLayerBackward"
        return (y, *(s for state in finals for s in state))

    assert kiln.autograd.gradcheck(fn, (x, *flat))


def test_double_backward_differentiates_the_scan_primitive(decomposed):
    """create_graph: the fused node's backward differentiates rnn_scan, whose VJP is differentiable, so
    second derivatives (a gradient penalty) equal the per-step path's."""
    module = _module("LSTM", dict(num_layers=2, bidirectional=True))
    x, states = _inputs("LSTM", dict(num_layers=2, bidirectional=True), np.random.default_rng(5))

    def penalty():
        out, (h, c) = module(x, states)
        loss = (out * out).sum() + (h * c).sum()
        grads = kiln.autograd.grad(loss, [x, *module.parameters()], create_graph=True)
        total = sum((g * g).sum() for g in grads)
        for t in [x, *module.parameters()]:
            t.grad = None
        total.backward()
        return [g.detach().clone() for g in grads], [t.grad.clone() for t in [x, *module.parameters()]]

    fused = penalty()
    decomposed(True)
    reference = penalty()
    for got, want in zip(fused[0] + fused[1], reference[0] + reference[1], strict=True):
        assert_close(got, want, rtol=1e-9, atol=1e-11)


def test_in_place_change_of_a_saved_weight_is_an_error():
    m = nn.GRU(3, 4)
    out, _ = m(kiln.randn(5, 2, 3))
    with kiln.no_grad():
        m.weight_hh_l0.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_in_place_change_of_the_output_leaves_the_gradient_alone():
    """The output is new memory, not the states the backward reads."""
    for mode in ("LSTM", "GRU", "RNN"):
        m = _module(mode, dict(num_layers=1))
        x = kiln.randn(5, 2, 3, dtype=kiln.float64)
        grad = kiln.randn(5, 2, 4, dtype=kiln.float64)
        m(x)[0].backward(grad)
        want = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        out = m(x)[0]
        with kiln.no_grad():
            out.zero_()
        out.backward(grad)
        for p, w in zip(m.parameters(), want, strict=True):
            assert_close(p.grad, w, rtol=1e-12, atol=1e-12)


def test_retain_graph_and_a_second_backward():
    m = _module("GRU", dict(num_layers=2, bidirectional=True))
    out, h = m(kiln.randn(5, 2, 3, dtype=kiln.float64))
    loss = out.sum() + h.sum()
    loss.backward(retain_graph=True)
    once = [p.grad.clone() for p in m.parameters()]
    loss.backward()
    for p, g in zip(m.parameters(), once, strict=True):
        assert_close(p.grad, 2 * g.numpy(), rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_autocast_keeps_the_per_step_ops(decomposed):
    """Autocast lowers each product's inputs to bfloat16; the fused layer computes in the input's dtype,
    so it stays out of autocast regions and the result is the per-step path's."""
    m = nn.LSTM(3, 4, num_layers=2)
    x = kiln.randn(5, 2, 3)
    with kiln.autocast(device_type="cpu", dtype=kiln.bfloat16):
        out, _ = m(x)
    assert out.grad_fn.name() != "_FusedLayerBackward"
    decomposed(True)
    with kiln.autocast(device_type="cpu", dtype=kiln.bfloat16):
        want, _ = m(x)
    assert out.dtype == want.dtype
    assert_close(out, want, rtol=0, atol=0)


def test_no_grad_and_empty_sequences():
    m = nn.LSTM(3, 4, num_layers=2)
    with kiln.no_grad():
        out, (h, c) = m(kiln.randn(5, 2, 3))
    assert out.grad_fn is None and not out.requires_grad
    out, (h, c) = m(kiln.randn(0, 2, 3))  # no steps: the per-step path, the initial state back
    assert tuple(out.shape) == (0, 2, 4)
    assert_close(h, np.zeros((2, 2, 4), np.float32), rtol=0, atol=0)


class _LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 6)
        self.rnn = nn.LSTM(6, 8, num_layers=2, dropout=0.0)
        self.head = nn.Linear(8, 20)

    def forward(self, tokens, state):
        out, state = self.rnn(self.embed(tokens), state)
        return self.head(out), state


def _lm_steps(compiled: bool, calls: int = 3):
    kiln.manual_seed(0)
    model = _LanguageModel()
    opt = optim.SGD(model.parameters(), lr=0.5)
    rng = np.random.default_rng(6)

    def step(tokens, targets, h, c):
        opt.zero_grad()
        logits, (h, c) = model(tokens, (h, c))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 20), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach(), h.detach(), c.detach()

    fn = kiln.compile(step) if compiled else step
    h = c = kiln.zeros(2, 3, 8)
    seen = []
    for _ in range(calls):
        tokens, targets = (kiln.from_numpy(rng.integers(0, 20, (5, 3))) for _ in range(2))
        loss, h, c = fn(tokens, targets, h, c)
        seen.append([loss, h, c, *(p.detach().clone() for p in model.parameters())])
    return fn, seen


def test_compiled_lm_step_matches_fused_eager():
    fn, compiled = _lm_steps(compiled=True)
    _, eager = _lm_steps(compiled=False)
    for got, want in zip(compiled, eager, strict=True):
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, rtol=1e-4, atol=1e-5)
    summary = kiln.explain(fn).summary()
    assert "0 trace break(s)" in summary, summary
    assert sum(e.kind == "compiled" for e in fn.state.events) >= 1


CELLS = [("LSTMCell", {}), ("GRUCell", {}), ("GRUCell", {"bias": False}), ("RNNCell", {}),
         ("RNNCell", {"nonlinearity": "relu", "bias": False})]  # fmt: skip


def _cell_loop(cell, name: str, xs, state):
    """Three steps of ``cell`` from ``state``; the gradients of a weighted sum of every step's state."""
    for t in [xs, *cell.parameters(), *state]:
        t.grad = None
    states, loss = tuple(state), 0
    for t in range(xs.shape[0]):
        states = cell(xs[t], states if name == "LSTMCell" else states[0])
        states = states if name == "LSTMCell" else (states,)
        loss = loss + sum((s * (k + 1)).sum() for k, s in enumerate(states)) * (t + 1)
    loss.backward()
    return [s.detach().clone() for s in states], [t.grad.clone() for t in [xs, *cell.parameters(), *state]]


@pytest.mark.parametrize("unbatched", [False, True])
@pytest.mark.parametrize(("name", "kwargs"), CELLS)
def test_cells_step_fused_and_equal_the_per_step_ops(decomposed, name, kwargs, unbatched):
    kiln.manual_seed(1)
    cell = getattr(nn, name)(3, 4, **kwargs, dtype=kiln.float64)
    rng = np.random.default_rng(8)
    lead = (3,) if unbatched else (3, 2)
    xs = kiln.from_numpy(rng.standard_normal((*lead, 3))).requires_grad_()
    state = [kiln.from_numpy(rng.standard_normal(lead[1:] + (4,))).requires_grad_()
             for _ in range(2 if name == "LSTMCell" else 1)]  # fmt: skip
    step = xs[0]
    out = cell(step, tuple(state) if name == "LSTMCell" else state[0])
    node = (out[0] if name == "LSTMCell" else out).grad_fn
    node = node.next_edges[0][0] if unbatched else node  # through the squeeze
    assert isinstance(node, CellStepBackward), node.name()
    if not unbatched:  # a batched step enters the node as it is, with no unsqueeze (an op and a node more)
        assert node.next_edges[0][0] is step.grad_fn
    # its outputs are the new state alone: no (1, B, H) sequence output copied, nor a zero gradient for it
    assert node.num_outputs == len(state)
    fused = _cell_loop(cell, name, xs, state)
    decomposed(True)
    reference = _cell_loop(cell, name, xs, state)
    for got, want in zip(fused[0] + fused[1], reference[0] + reference[1], strict=True):
        assert_close(got, want, rtol=1e-10, atol=1e-12)
