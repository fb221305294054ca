"""The backward's shortcuts keep every semantic: a bias gradient in one reduction, a number before a
tensor without promotion's slow path, a VJP reading its node as ``ctx``, the engine's inlined loop
(hooks, multi-output nodes, gradients that never arrive)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.ops.shape import sum_to


def _ops_of(fn) -> list[str]:
    with kiln.profiler.profile() as prof:
        fn()
    return [e.name for e in prof.events()]


@pytest.mark.parametrize(
    ("given", "target", "ops"),
    [((4, 3), (3,), ["reduce_sum"]), ((2, 4, 3), (3,), ["reduce_sum"]), ((4, 3), (1, 3), ["reduce_sum"]),
     ((4, 3), (4, 1), ["reduce_sum"]), ((2, 4, 3), (4, 1), ["reduce_sum", "reshape"]), ((4, 3), (4, 3), [])],
)  # fmt: skip
def test_sum_to_reduces_in_one_op_unless_a_kept_dim_and_a_leading_one_both_go(given, target, ops):
    x = np.random.default_rng(0).standard_normal(given).astype(np.float32)
    t = kiln.tensor(x)
    lead = len(given) - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(target) if d == 1 and given[lead + i] != 1)
    expected = x.sum(axis=axes, keepdims=True).reshape(target) if axes else x
    found = sum_to(t, target)
    assert tuple(found.shape) == target
    np.testing.assert_allclose(found.numpy(), expected, rtol=1e-6)
    assert _ops_of(lambda: sum_to(t, target)) == ops


def test_a_bias_gradient_matches_torch(torch):
    x = np.random.default_rng(1).standard_normal((5, 4, 3)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal(3).astype(np.float32)
    kb, tb = kiln.tensor(b, requires_grad=True), torch.tensor(b, requires_grad=True)
    ((kiln.tensor(x) + kb) ** 2).sum().backward()
    ((torch.tensor(x) + tb) ** 2).sum().backward()
    np.testing.assert_allclose(kb.grad.numpy(), tb.grad.numpy(), rtol=1e-5)


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.float32, kiln.float64])
@pytest.mark.parametrize("number", [1.5, 2])
def test_a_number_before_a_float_tensor_keeps_the_tensors_dtype(dtype, number):
    x = kiln.tensor([0.5, -1.25, 3.0], dtype=dtype)
    values = x.numpy().astype(np.float64)
    for op, expected in ((lambda a, b: a - b, number - values), (lambda a, b: a * b, number * values),
                         (lambda a, b: a + b, number + values)):  # fmt: skip
        found = op(number, x)
        assert found.dtype is dtype
        np.testing.assert_allclose(found.numpy().astype(np.float64), expected, rtol=1e-3)
    assert _ops_of(lambda: 1.0 - x) == ["sub"]  # no cast: the number is made in x's dtype at once


def test_a_number_before_an_integer_or_bool_tensor_still_promotes_or_refuses():
    ints = kiln.tensor([1, 2, 3])
    assert (1.5 - ints).dtype is kiln.get_default_dtype() and (1.5 - ints).tolist() == [0.5, -0.5, -1.5]
    assert (2 - ints).dtype is kiln.int64
    with pytest.raises(RuntimeError, match="bool operand"):
        1 - kiln.tensor([True, False])
    with pytest.raises(RuntimeError, match="bool operand"):
        True - kiln.tensor([1.0])


def test_tanh_backward_equals_one_minus_the_square():
    x = kiln.tensor([-2.0, 0.0, 0.5], dtype=kiln.float64, requires_grad=True)
    y = x.tanh()
    y.backward(kiln.tensor([1.0, 2.0, 3.0], dtype=kiln.float64))
    t = np.tanh(np.array([-2.0, 0.0, 0.5]))
    np.testing.assert_allclose(x.grad.numpy(), np.array([1.0, 2.0, 3.0]) * (1 - t * t), rtol=1e-12)


def test_a_vjp_reads_its_node_as_ctx():
    x = kiln.tensor([1.0, 2.0], requires_grad=True)
    w = kiln.tensor([3.0, 4.0])
    node = (x * w).grad_fn
    assert node.needs_input_grad == (True, False)
    assert [tuple(t.shape) for t in node.input_types] == [(2,), (2,)]
    assert node.inputs[1] is w and node.attrs == {}
    assert node.apply([kiln.ones(2)])[0].tolist() == [3.0, 4.0]


def test_hooks_and_a_gradient_that_never_arrives_on_the_inlined_loop():
    x = kiln.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    x.register_hook(lambda g: seen.append(g.tolist()) or g * 10)
    a, b = (x * 2.0).unbind(0)  # a multi-output view pair: b's gradient never arrives
    y = a * 3.0
    y.register_hook(lambda g: g * 2)
    y.backward()
    assert seen == [[12.0, 0.0]] and x.grad.tolist() == [120.0, 0.0]


# ----------------------------------------------------------------------------- sums of fanned-out gradients
def test_a_weight_used_at_every_step_sums_its_gradients_in_place():
    """The engine adds each later arrival into the sum it made (one op for the first sum, none after)."""
    w = kiln.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = kiln.zeros(3)
    for step in range(1, 41):
        h = h * 0.5 + w * float(step)
    loss = h.sum()
    backward_ops = _ops_of(loss.backward)
    expected = sum(step * 0.5 ** (40 - step) for step in range(1, 41))
    np.testing.assert_allclose(w.grad.numpy(), np.full(3, expected), rtol=1e-5)
    assert backward_ops.count("add") <= 1, backward_ops.count("add")


def test_a_gradient_passed_on_to_two_consumers_is_never_changed_in_place():
    """add's VJP hands one tensor to both inputs: summing into it would change the other's gradient."""
    w = kiln.tensor([1.0, 2.0], requires_grad=True)
    u, v, z = w + 0.0, w + 0.0, w * 1.0
    for t in (u, v, z):
        t.retain_grad()
    ((u + v) + z).sum().backward()
    assert u.grad.tolist() == v.grad.tolist() == z.grad.tolist() == [1.0, 1.0]
    assert w.grad.tolist() == [3.0, 3.0]


def test_sums_stay_differentiable_with_create_graph(torch):
    def run(lib):
        w = lib.tensor([0.5, -1.5], dtype=lib.float64, requires_grad=True)
        h = w
        for _ in range(4):
            h = h * w + w
        (g,) = lib.autograd.grad(h.sum(), w, create_graph=True)
        (g * g).sum().backward()
        return w.grad.detach().numpy()

    np.testing.assert_allclose(run(kiln), run(torch), rtol=1e-10)
