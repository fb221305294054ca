"""What a traced call costs beyond the eager call it is (issue 33, item 7).

The traced call runs the function eagerly while it records the graph; the program compiled from
that graph replaces every eager op of the call, so the call compiles none of their kernels (eager
kernels already compiled still run). Each test compares the traced call with an eager one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kiln

from .helpers import array, compiled_calls

RTOL, ATOL = 1e-4, 1e-4


def _conv_step(x, w, g):
    """A convolution and its gradients: ops large enough for eager kernels (``eager_kernels.MIN_BYTES``)."""
    y = kiln.nn.functional.conv2d(x, w)
    y.backward(g)
    return y.tanh().sum()


def _inputs():
    rng = np.random.default_rng(3)
    x = kiln.tensor(rng.normal(size=(8, 3, 20, 20)).astype(np.float32), requires_grad=True)
    w = kiln.tensor(rng.normal(size=(6, 3, 5, 5)).astype(np.float32), requires_grad=True)
    g = kiln.tensor(rng.normal(size=(8, 6, 16, 16)).astype(np.float32))
    return x, w, g


@pytest.mark.parametrize("synchronous", [True, False], ids=["sync", "background"])
def test_a_traced_call_compiles_no_eager_kernel(on, monkeypatch, synchronous):
    monkeypatch.setattr(on.CACHE, "synchronous", synchronous)
    x, w, g = _inputs()
    step = kiln.compile(_conv_step, wait=True)
    traced = step(x, w, g)
    assert on.wait(120)
    assert list(on.CACHE.entries) == [], "the traced call compiled eager kernels the program replaces"
    grads = (array(x.grad).copy(), array(w.grad).copy())
    x.grad = w.grad = None
    eager = _conv_step(x, w, g)  # the same ops outside a trace compile theirs
    assert {key[0] for key in on.CACHE.entries} >= {"conv", "conv_weight"}
    np.testing.assert_allclose(array(traced), array(eager), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads[0], array(x.grad), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads[1], array(w.grad), rtol=RTOL, atol=ATOL)
    x.grad = w.grad = None
    np.testing.assert_allclose(array(step(x, w, g)), array(eager), rtol=RTOL, atol=ATOL)
    assert compiled_calls(step) == [1]


def test_a_traced_call_compiled_in_the_background_queues_no_kernels_either(on):
    # Its program's compile goes first (jit/background.py), and replaces the call's ops.
    x, w, g = _inputs()
    step = kiln.compile(_conv_step, wait=False)
    traced = step(x, w, g)
    assert on.wait(120)
    assert list(on.CACHE.entries) == [], "the traced call queued eager kernels before its program"
    assert step.wait_compiled(120)
    x.grad = w.grad = None
    np.testing.assert_allclose(array(step(x, w, g)), array(traced), rtol=RTOL, atol=ATOL)


def test_a_traced_call_still_runs_the_eager_kernels_compiled_before(on, monkeypatch):
    monkeypatch.setattr(on.CACHE, "synchronous", True)
    x, w, g = _inputs()
    eager = _conv_step(x, w, g)  # compiles the conv kernels
    expected = (array(eager), array(x.grad).copy(), array(w.grad).copy())
    before = dict(on.CACHE.entries)
    assert all(entry.program is not None for entry in before.values())
    x.grad = w.grad = None
    with kiln.profiler.profile() as prof:
        traced = kiln.compile(_conv_step, wait=True)(x, w, g)
    ran = {e.name: e.args["kernel"] for e in prof.events() if e.cat == "op" and e.name.startswith("conv")}
    assert ran == {"conv": "compiled", "conv_weight": "compiled"}
    assert on.CACHE.entries.keys() == before.keys()
    for actual, wanted in zip((array(traced), array(x.grad), array(w.grad)), expected, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=RTOL, atol=ATOL)


def test_a_traced_lstm_compiles_the_native_recurrence_its_program_runs(on, monkeypatch):
    """The compiled program's ``rnn_scan`` runs the eager native recurrence kernels (``eager_recurrence``):
    a trace compiles those, which its program would compile at its first call otherwise (and the
    trace itself runs them, where an LSTM's numpy steps at T=350 cost 0.2 s)."""
    monkeypatch.setattr(on.CACHE, "synchronous", True)
    kiln.manual_seed(0)
    lstm = kiln.nn.LSTM(8, 16)
    x = kiln.tensor(np.random.default_rng(5).normal(size=(6, 3, 8)).astype(np.float32))

    def step(x):
        out, _ = lstm(x)
        loss = (out * out).mean()
        return (loss, *kiln.autograd.grad(loss, list(lstm.parameters())))

    g = kiln.compile(step, wait=True)
    traced = [g(x)]
    # (the layer's initial weights were drawn on the random-bits kernel: eager_random)
    recurrences = [entry for key, entry in on.CACHE.entries.items() if key[0] != "random bits"]
    assert {key[0] for key in on.CACHE.entries} - {"random bits"} == {"lstm recurrence"}, "no native recurrence"
    (entry,) = recurrences
    assert entry.program is not None, entry.reason
    traced += [g(x), g(x)]
    assert compiled_calls(g) == [2]
    eager = step(x)
    for results in traced:
        for actual, expected in zip(results, eager, strict=True):
            np.testing.assert_allclose(array(actual), array(expected), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("value", [0.0, -0.0, 0, 2.5])
def test_pad_with_zero_fills_like_any_value(value):
    """``pad``'s eager kernel takes zeroed memory for a zero pad (a gradient padded back to its
    output's width), and fills any other value, -0.0 included, as ever."""
    x = kiln.tensor(np.arange(6, dtype=np.float32).reshape(2, 3) + 1)
    y = kiln.nn.functional.pad(x, (1, 2, 0, 1), value=value).numpy()
    expected = np.full((3, 6), value, dtype=np.float32)
    expected[:2, 1:4] = x.numpy()
    np.testing.assert_array_equal(y, expected)
    assert np.array_equal(np.signbit(y), np.signbit(expected))


def test_a_traced_matmul_compiles_the_product_kernel_its_program_runs(on, monkeypatch):
    """A compiled program's large products run the eager product kernel (``eager_products``): a trace
    compiles it, as it does the recurrences, so the program's first call does not."""
    monkeypatch.setattr(on.CACHE, "synchronous", True)
    rng = np.random.default_rng(6)
    x = kiln.tensor(rng.normal(size=(256, 128)).astype(np.float32))
    w = kiln.tensor(rng.normal(size=(128, 128)).astype(np.float32), requires_grad=True)

    def step(x, w):
        y = (x @ w).tanh()
        return (y, *kiln.autograd.grad(y.sum(), [w]))

    g = kiln.compile(step, wait=True)
    traced = [g(x, w)]
    assert {key[0] for key in on.CACHE.entries} == {"matrix product"}, "the trace compiled no product kernel"
    keys = set(on.CACHE.entries)
    assert all(entry.program is not None for entry in on.CACHE.entries.values())
    traced += [g(x, w), g(x, w)]
    assert compiled_calls(g) == [2]
    assert set(on.CACHE.entries) == keys, "the program's calls compiled product kernels the trace had not"
    eager = step(x, w)
    for results in traced:
        for actual, expected in zip(results, eager, strict=True):
            np.testing.assert_allclose(array(actual), array(expected), rtol=RTOL, atol=ATOL)


def test_a_traced_graph_holds_one_type_object_per_distinct_type():
    """A trace of 70k nodes kept 70k ``TensorType`` objects alive (and walked by every full
    collection after it) where a few dozen types differ; each traced node still has its own type."""

    def step(x, w):
        for _ in range(20):
            x = (x @ w).tanh() + x
        return x.sum()

    g = kiln.compile(step, wait=True)
    x, w = kiln.ones(3, 4), kiln.ones(4, 4) * 0.1
    for _ in range(2):
        np.testing.assert_allclose(array(g(x, w)), array(step(x, w)), rtol=RTOL, atol=ATOL)
    (spec,) = g.state.specializations
    values = [v for node in spec.traced_graph.nodes for v in node.outputs]
    assert len(values) >= 60
    assert {(v.type.shape, v.type.dtype) for v in values} == {((3, 4), kiln.float32), ((), kiln.float32)}
    assert len({id(v.type) for v in values}) == 2


def test_a_recorded_node_and_value_hold_exactly_their_dataclass_fields():
    """``Trace.record`` sets the frozen ``Node`` and ``Value`` fields itself rather than calling their
    ``__init__`` (~0.4 us of each traced op): a field added to either (or a ``__post_init__``) must be
    set there too, or the traced graph's nodes would lack it."""
    from kiln.ir.graph import Node, Value

    assert not hasattr(Node, "__post_init__") and not hasattr(Value, "__post_init__")

    def step(x, w):
        return ((x @ w).tanh() * 2.0).sum()

    g = kiln.compile(step, wait=True)
    x, w = kiln.ones(3, 4), kiln.ones(4, 4) * 0.1
    for _ in range(2):
        np.testing.assert_allclose(array(g(x, w)), array(step(x, w)), rtol=RTOL, atol=ATOL)
    (spec,) = g.state.specializations
    nodes = [node for node in spec.traced_graph.nodes if node.op != "constant"]
    assert len(nodes) >= 4
    for node in nodes:
        made = Node(*(getattr(node, f.name) for f in dataclasses.fields(Node)))
        assert vars(node) == vars(made)
        (out,) = node.outputs
        assert vars(out) == vars(Value(*(getattr(out, f.name) for f in dataclasses.fields(Value))))


def _traced_ops(g) -> list[str]:
    (spec,) = g.state.specializations
    return [node.op for node in spec.traced_graph.nodes]


@pytest.mark.parametrize(
    ("first", "second", "permutes"),
    [((1, 0), (1, 0), 1), ((1, 2, 0), (2, 0, 1), 1), ((1, 2, 0), (1, 2, 0), 2), ((0, 2, 1), (1, 0, 2), 2)],
    ids=["transpose twice", "a cycle and its inverse", "a cycle twice", "two different swaps"],
)
def test_a_permute_that_undoes_the_last_records_no_node(first, second, permutes):
    """The backward of ``x @ W^T`` transposes ``W^T`` back; such a pair is the value it started from
    in the trace (no node), where any other pair stays two permutes. Values equal eager's."""

    def step(x):
        y = x.permute(*first)
        return y * 2.0, (y.permute(*second) + 1.0).sum(0)

    g = kiln.compile(step, wait=True)
    rng = np.random.default_rng(4)
    for _ in range(3):
        x = kiln.tensor(rng.normal(size=(2, 3, 4)[: len(first)]).astype(np.float32))
        for actual, expected in zip(g(x), step(x), strict=True):
            np.testing.assert_allclose(array(actual), array(expected), rtol=RTOL, atol=ATOL)
    assert _traced_ops(g).count("permute") == permutes
    assert compiled_calls(g) == [2]


def test_a_linear_looped_over_time_records_its_weight_transposes_once():
    """A Linear head called at every step of a Python loop: its weight's transpose is recorded once
    per call, its backward's transpose of that transpose is no node and the weight's gradient is
    transposed once; one permute a step is left (the input's, for the weight's gradient). Three
    permutes a step before. Results and gradients equal eager's over several calls."""
    kiln.manual_seed(2)
    head = kiln.nn.Linear(5, 3)
    opt = kiln.optim.SGD(head.parameters(), lr=0.1)

    def step(xs):
        opt.zero_grad()
        loss = sum((head(xs[t]) ** 2).sum() for t in range(xs.shape[0]))
        loss.backward()
        opt.step()
        return loss.detach()

    rng = np.random.default_rng(6)
    counts = {}
    for steps in (3, 4):
        g = kiln.compile(step, wait=True)
        batches = [kiln.tensor(rng.normal(size=(steps, 2, 5)).astype(np.float32)) for _ in range(3)]
        state = {k: array(v).copy() for k, v in head.state_dict().items()}
        eager = [array(step(xs)).copy() for xs in batches] + [array(p).copy() for p in head.parameters()]
        head.load_state_dict({k: kiln.tensor(v) for k, v in state.items()})
        compiled = [array(g(xs)).copy() for xs in batches] + [array(p).copy() for p in head.parameters()]
        for actual, expected in zip(compiled, eager, strict=True):
            np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)
        assert compiled_calls(g) == [2]
        counts[steps] = _traced_ops(g).count("permute")
    assert counts[4] - counts[3] == 1, counts


def test_a_weight_transpose_recorded_before_requires_grad_is_made_again_after():
    """``F.linear``'s traced weight transpose is kept per call only while the weight's version and
    whether it requires grad are unchanged: one made before ``w.requires_grad_()`` has no history."""
    w = kiln.tensor(np.arange(12.0).reshape(3, 4).astype(np.float32))

    def f(x):
        a = kiln.nn.functional.linear(x, w)
        w.requires_grad_(True)
        b = kiln.nn.functional.linear(x, w)
        (a + b).sum().backward()
        grad = w.grad.clone()
        w.grad = None
        w.requires_grad_(False)
        return grad

    g = kiln.compile(f, wait=True)
    x = kiln.ones(2, 4)
    for _ in range(3):
        np.testing.assert_allclose(array(g(x)), np.full((3, 4), 2.0), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(array(f(x)), np.full((3, 4), 2.0), rtol=RTOL, atol=ATOL)
