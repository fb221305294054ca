"""A compiled MLP training step computes each weight gradient as ``matmul(g^T, x)`` straight into
place: no transposed copy of a product in its optimized graph, and the same gradients as eager
over several calls."""

from __future__ import annotations

import numpy as np

import kiln
import kiln.nn as nn
import kiln.nn.functional as F

from .helpers import compiled_calls

SIZES = (24, 32, 16, 5)
CALLS = 4


def _mlp():
    kiln.manual_seed(0)
    return nn.Sequential(
        nn.Linear(SIZES[0], SIZES[1]), nn.ReLU(), nn.Linear(SIZES[1], SIZES[2]), nn.ReLU(), nn.Linear(SIZES[2], SIZES[3])
    )  # fmt: skip


def _step(model):
    params = list(model.parameters())

    def step(x, y):
        for p in params:
            p.grad = None
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    return step


def _batches():
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((12, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], 12)) for _ in range(CALLS)
    ]


def _gradients(model) -> list[np.ndarray]:
    return [p.grad.numpy().copy() for p in model.parameters()]


def test_compiled_gradients_equal_eager_over_several_calls():
    eager_model, compiled_model = _mlp(), _mlp()
    eager, compiled = _step(eager_model), kiln.compile(_step(compiled_model))
    for x, y in _batches():
        expected = eager(kiln.tensor(x), kiln.tensor(y))
        got = compiled(kiln.tensor(x), kiln.tensor(y))
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
        for g, e in zip(_gradients(compiled_model), _gradients(eager_model), strict=True):
            assert g.flags.c_contiguous
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    # Call 1 traces; whether the parameters hold a gradient is no guard (the step sets .grad before
    # it reads it), so every later call runs the compiled program.
    assert compiled_calls(compiled) == [CALLS - 1]


def _producers(graph) -> dict:
    return {v: node for node in graph.nodes for v in node.outputs}


def test_no_copy_of_a_transposed_product_remains():
    model = _mlp()
    compiled = kiln.compile(_step(model))
    x, y = _batches()[0]
    compiled(kiln.tensor(x), kiln.tensor(y))
    graph = compiled.graph
    producers = _producers(graph)
    ops = [node.op for node in graph.nodes]
    # 3 forward products, 2 for the hidden activations' gradients, 3 weight gradients.
    assert ops.count("matmul") == 8, ops
    for node in graph.nodes:
        if node.op != "copy":
            continue
        source = producers.get(node.inputs[0])
        while source is not None and source.op == "permute":
            source = producers.get(source.inputs[0])
        assert source is None or source.op != "matmul", f"a copy of a (permuted) product remains:\n{graph}"
    # Each weight gradient is a product's own result, in C order, with nothing copied after it.
    products = {v for v, node in producers.items() if node.op == "matmul"}
    shapes = {(o, i) for i, o in zip(SIZES[:-1], SIZES[1:], strict=True)}
    made_by_products = {v.type.shape for v in graph.outputs if v in products}
    assert shapes <= made_by_products, (shapes, made_by_products)


def test_a_linear_layer_on_a_batch_of_sequences_folds_the_batch_into_one_product(torch):
    # (batch, time, features) @ W^T: W's gradient is one product over batch * time rows, made in
    # place, in eager and compiled alike; checked against torch and over several calls. (The ``torch``
    # fixture marks it a parity test: CI's ``pytest -m torch`` runs it; an importorskip ran it nowhere.)
    kiln.manual_seed(0)
    layer = nn.Linear(6, 4)
    reference = torch.nn.Linear(6, 4)
    with torch.no_grad():
        reference.weight.copy_(torch.from_numpy(layer.weight.detach().numpy().copy()))
        reference.bias.copy_(torch.from_numpy(layer.bias.detach().numpy().copy()))

    def step(x):
        layer.weight.grad = layer.bias.grad = None
        (layer(x) ** 2).sum().backward()
        return layer.weight.grad, layer.bias.grad

    compiled = kiln.compile(step)
    rng = np.random.default_rng(1)
    for _ in range(CALLS):
        x = rng.standard_normal((3, 5, 6)).astype(np.float32)
        eager = [g.numpy().copy() for g in step(kiln.tensor(x))]
        got = [g.numpy().copy() for g in compiled(kiln.tensor(x))]
        reference.zero_grad()
        (reference(torch.from_numpy(x)) ** 2).sum().backward()
        for g, e, r in zip(got, eager, (reference.weight.grad, reference.bias.grad), strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(e, r.numpy(), rtol=1e-5, atol=1e-5)
    assert compiled_calls(compiled)[-1] >= 1
    graph = compiled.graph
    producers = _producers(graph)
    weight_grad = producers[graph.outputs[0]] if graph.outputs[0] in producers else None
    assert weight_grad is not None and weight_grad.op == "matmul", graph
    assert [node.op for node in graph.nodes].count("matmul") == 2, graph  # the forward's, and W's gradient
