"""The forward/backward partition: what a compiled forward saves for its backward, what the backward
recomputes. By hand on small graphs (which values are dropped, promoted, kept), then through
``kiln.compile`` against eager autograd: gradients over several calls with new inputs, the saved
bytes going down, and an in-place change of a weight the backward reads raising as eager does."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.dtypes import float32
from kiln.ir.graph import GraphBuilder
from kiln.ir.types import TensorType
from kiln.passes.partition import partition

M = TensorType((4, 8), float32)  # 128 bytes
W = TensorType((8, 8), float32)


def _forward_backward(saved_of):
    """A forward ``h = x @ w`` plus what ``saved_of(builder, h)`` makes (the values the backward
    reads), and a backward reading each of them: ``sum_j seed * saved_j``."""
    f = GraphBuilder()
    x, w = f.input(M), f.input(W)
    h = f.node("matmul", [x, w])
    saved = saved_of(f, h)
    forward = f.build([h, *saved])
    b = GraphBuilder()
    seed = b.input(M)
    reads = [b.input(v.type) for v in saved]
    total = seed
    for r in reads:
        total = b.node("add", [total, b.node("mul", [seed, r])])
    backward = b.build([total])
    return forward, backward, list(range(1, 1 + len(saved))), list(range(1, 1 + len(saved)))


def test_a_cheap_function_of_a_saved_value_is_recomputed():
    # saved: h and relu-like max(h, 0): the second is recomputed from the first
    def saved_of(f, h):
        zero = f.constant(np.zeros((), np.float32), TensorType((), float32))
        return [h, f.node("maximum", [h, zero])]

    forward, backward, saved, inputs = _forward_backward(saved_of)
    part = partition(forward, backward, saved, inputs, {})
    assert part.recomputed == (1,) and part.kept == (0,) and part.promoted == 0
    assert (part.saved_bytes, part.saved_bytes_before) == (128, 256)
    assert len(part.forward.outputs) == 2 and len(part.backward.inputs) == 2  # seed and h
    assert "maximum" in part.backward.op_counts()


def test_two_saved_functions_of_one_value_are_replaced_by_it():
    # saved: h * 0.5 and h * 0.7 (GELU's intermediates): h is saved instead, both are recomputed
    def saved_of(f, h):
        scalars = [f.constant(np.float32(c), TensorType((), float32)) for c in (0.5, 0.7)]
        return [f.node("mul", [h, c]) for c in scalars]

    forward, backward, saved, inputs = _forward_backward(saved_of)
    part = partition(forward, backward, saved, inputs, {})
    assert part.recomputed == (0, 1) and part.kept == () and part.promoted == 1
    assert (part.saved_bytes, part.saved_bytes_before) == (128, 256)
    assert part.forward.outputs[part.saved[0]] is forward.nodes[0].output  # h: the matmul's result


def test_real_work_is_never_recomputed():
    # saved: exp(h) and h @ w: neither is a cheap function of a value the backward has
    forward, backward, saved, inputs = _forward_backward(lambda f, h: [f.node("matmul", [h, f.inputs[1]])])
    part = partition(forward, backward, saved, inputs, {})
    assert part.recomputed == () and part.saved == tuple(saved)
    assert part.forward is forward and part.backward is backward


def _mlp(dtype):
    nn = kiln.nn
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(approximate="tanh"), nn.LayerNorm(16), nn.Linear(16, 16),
                          nn.GELU(), nn.Linear(16, 3)).to(dtype)  # fmt: skip
    return model


def _grads(model, loss):
    for p in model.parameters():
        p.grad = None
    loss.backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


def test_compiled_forward_saves_less_and_its_backward_gives_eager_gradients():
    model = _mlp(kiln.float64)
    forward = kiln.compile(lambda x: kiln.softmax(model(x), dim=-1))
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = kiln.tensor(rng.standard_normal((5, 6)), requires_grad=True)
        target = kiln.tensor(rng.standard_normal((5, 3)))
        compiled = _grads(model, ((forward(x) - target) ** 2).sum())
        compiled_x = x.grad.numpy().copy()
        x.grad = None
        eager = _grads(model, ((kiln.softmax(model(x), dim=-1) - target) ** 2).sum())
        for a, b in zip(compiled, eager, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(compiled_x, x.grad.numpy(), rtol=1e-10, atol=1e-12)
    plan = forward.state.specializations[0].backward
    assert plan.recomputed > 0 and plan.saved_bytes < plan.saved_bytes_before
    assert "before the partition pass" in str(kiln.explain(forward))


def test_a_weight_changed_in_place_before_the_compiled_backward_raises_as_eager():
    w = kiln.randn(4, 4, requires_grad=True)
    x = kiln.randn(3, 4, requires_grad=True)
    compiled = kiln.compile(lambda x: kiln.tanh(x @ w))
    for fn in (compiled, compiled, lambda x: kiln.tanh(x @ w)):  # the second call runs the compiled program
        y = fn(x)
        with kiln.no_grad():
            w.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_training_step_peak_memory_is_not_above_eager():
    """The memory plan of a whole compiled training step holds no more than eager would."""
    model = _mlp(kiln.float32)
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-3)
    x, y = kiln.randn(32, 6), kiln.randint(0, 3, (32,))

    @kiln.compile
    def step():
        loss = kiln.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    for _ in range(3):
        step()
    lines = step.state.specializations[0].report.describe()
    line = next(line for line in lines if "eager would hold" in line)  # "... of intermediates (0.39x)"
    assert float(line.rsplit("(", 1)[1].rstrip("x)")) <= 1.0, line


def test_memory_the_call_writes_into_is_never_saved_for_the_backward():
    """A view of a captured tensor that the call zeroes afterwards: saving the view (smaller than the
    `where` the gradient reads) would hand the backward the zeros; the `where` is saved instead."""

    def run(compiled: bool) -> list[float]:
        rng = np.random.default_rng(0)
        table = kiln.tensor(rng.uniform(-2, 2, (5, 2, 3)), dtype=kiln.float32)
        scale = kiln.tensor(0.7, requires_grad=True)

        def f():
            flat = table.flatten()
            picked = kiln.where(flat > 0.5, flat, scale)
            out = picked / (scale.square() + 1)
            flat.zero_()
            return out

        fn = kiln.compile(f) if compiled else f
        grads = []
        for _ in range(3):
            table.data = kiln.tensor(rng.uniform(-2, 2, (5, 2, 3)), dtype=kiln.float32)
            scale.grad = None
            fn().sum().backward()
            grads.append(scale.grad.item())
        return grads

    np.testing.assert_allclose(run(True), run(False), rtol=1e-6, atol=1e-6)


def test_a_saved_view_of_a_tensor_the_call_mutates_raises_as_eager():
    """Autograd saves a view of a captured tensor that the call then zeroes: eager's backward
    raises; so does the compiled call's, on every call (never a gradient computed from the zeros)."""
    table = kiln.arange(6.0)
    scale = kiln.tensor(0.7, requires_grad=True)

    def f():
        flat = table.flatten()
        out = flat * scale
        flat.zero_()
        return out

    for fn in (f, kiln.compile(f)):
        for k in range(3):
            table.data = kiln.arange(6.0) + k
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                fn().sum().backward()
