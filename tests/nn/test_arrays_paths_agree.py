"""Where an op runs on the arrays in eager mode and as its composite in a compiled call (which traces
the composite), both must behave alike -- as PyTorch does: max pooling and batch norm of a transposed
input give C-order results (a compiled call's ``.view(-1)`` raised where eager's did not), and
softmax's output changed in place before the backward raises (eager raised, a compiled call gave the
old output's gradient). Each compiled case fails on the code before this test."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

F = kiln.nn.functional
_X = np.random.default_rng(0).standard_normal((4, 6, 6)).astype(np.float32)

LAYOUT_OPS = {
    "max_pool2d": lambda F, x: F.max_pool2d(x.unsqueeze(0), 2),
    "batch_norm": lambda F, x: F.batch_norm(x.unsqueeze(0), None, None, training=True),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", sorted(LAYOUT_OPS))
def test_a_transposed_input_gives_a_c_order_result(torch, name, compiled):
    op = LAYOUT_OPS[name]

    def f(a):
        return op(F, a.transpose(1, 2)).view(-1)

    fn = kiln.compile(f) if compiled else f
    expected = op(torch.nn.functional, torch.tensor(_X).transpose(1, 2)).reshape(-1).numpy()
    for _ in range(2):
        np.testing.assert_allclose(fn(kiln.tensor(_X)).numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_softmax_output_changed_in_place_before_backward_raises(compiled):
    def f(a):
        y = F.softmax(a * 1.0, dim=-1)
        y.mul_(2)
        return y.sum()

    fn = kiln.compile(f) if compiled else f
    for _ in range(2):
        a = kiln.tensor(_X, requires_grad=True)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            fn(a).backward()


def test_softmax_output_left_alone_still_differentiates(torch):
    a, t = kiln.tensor(_X, requires_grad=True), torch.tensor(_X, requires_grad=True)
    g = np.random.default_rng(1).standard_normal(_X.shape).astype(np.float32)
    fn = kiln.compile(lambda a: F.softmax(a * 2.0, dim=-1))
    for _ in range(2):
        a.grad = None
        fn(a).backward(kiln.tensor(g))
    torch.nn.functional.softmax(t * 2.0, dim=-1).backward(torch.tensor(g))
    np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)
