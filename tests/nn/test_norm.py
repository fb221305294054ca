"""layer_norm, batch_norm (running statistics in train and eval), group_norm, instance_norm."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from tests.conftest import assert_close
from tests.nn.helpers import check_parity, leaves, pair

rng = np.random.default_rng(4)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
def test_layer_norm_matches_torch(torch, shape):
    x, w, b = rng.normal(size=(2, *shape)), rng.normal(size=shape), rng.normal(size=shape)
    check_parity(torch, lambda *a: F.layer_norm(a[0], shape, *a[1:], eps=1e-3),
                 lambda *a: torch.nn.functional.layer_norm(a[0], shape, *a[1:], eps=1e-3),
                 [x, w, b], grad=(0, 1, 2), rtol=1e-9, atol=1e-10)  # fmt: skip
    check_parity(torch, lambda a: F.layer_norm(a, shape[-1:]), lambda a: torch.nn.functional.layer_norm(a, shape[-1:]),
                 [x], grad=(0,), rtol=1e-9, atol=1e-10)  # fmt: skip


def test_layer_norm_hand_computed_and_errors():
    out = F.layer_norm(kiln.tensor([[1.0, 3.0], [5.0, 5.0]]), 2, eps=0.0)
    assert out.tolist()[0] == [-1.0, 1.0]
    assert np.isnan(out.tolist()[1]).all()  # zero variance with eps=0: 0/0, as in PyTorch
    with pytest.raises(RuntimeError, match=r"expected input with shape \[\*, 4\], but got input of size \[2, 3\]"):
        F.layer_norm(kiln.zeros(2, 3), (4,))


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 3)])
def test_batch_norm_training_matches_torch_and_updates_running_stats(torch, shape):
    x, w, b = rng.normal(size=shape), rng.normal(size=3), rng.normal(size=3)
    mean0, var0 = rng.normal(size=3), rng.uniform(0.5, 2.0, size=3)
    (k_mean, t_mean), (k_var, t_var) = pair(torch, mean0), pair(torch, var0)
    check_parity(torch, lambda *a: F.batch_norm(a[0], k_mean, k_var, *a[1:], training=True, momentum=0.3),
                 lambda *a: torch.nn.functional.batch_norm(a[0], t_mean, t_var, *a[1:], training=True, momentum=0.3),
                 [x, w, b], grad=(0, 1, 2), rtol=1e-9, atol=1e-10)  # fmt: skip
    assert_close(k_mean, t_mean, rtol=1e-12, atol=1e-12)
    assert_close(k_var, t_var, rtol=1e-12, atol=1e-12)  # unbiased variance, as PyTorch
    n = x.size // 3
    axes = tuple(i for i in range(x.ndim) if i != 1)
    assert_close(k_var, 0.7 * var0 + 0.3 * x.var(axis=axes) * n / (n - 1), rtol=1e-12, atol=1e-12)
    assert k_mean.grad_fn is None and not k_mean.requires_grad


def _full_size_ops(x, fn) -> list[str]:
    """The eager ops ``fn()`` runs with an input of ``x``'s shape (one pass over memory each)."""
    with kiln.profiler.profile(record_shapes=True) as prof:
        fn()
    return [e.name for e in prof.events() if any(tuple(s) == tuple(x.shape) for s in e.shapes)]


def test_batch_norm_training_backward_is_the_closed_form():
    """The gradient in closed form, dx = w r (g - mean(g) - xhat mean(g xhat)) with dw and db from
    the same two sums: 9 passes over the input's size eagerly (2 compute the deviations again from
    x, which a compiled backward fuses into its kernels) and the copy into ``x.grad``. Autograd
    through the forward's means took 18 (each mean's gradient a sum and a broadcast, twice for the
    drift's correction)."""
    x, w, b = leaves(rng.normal(size=(4, 3, 5, 5)), rng.normal(size=3), rng.normal(size=3))
    y = F.batch_norm(x, None, None, w, b, training=True)
    g = kiln.tensor(rng.normal(size=(4, 3, 5, 5)))
    assert len(_full_size_ops(x, lambda: y.backward(g))) <= 10
    # and the gradients are the composite's own, which autograd gave before
    found = [t.grad.numpy() for t in (x, w, b)]
    x2, w2, b2 = leaves(*(t.detach().numpy() for t in (x, w, b)))
    mean = x2.mean(dim=(0, 2, 3), keepdim=True)
    centered = x2 - mean
    var = (centered * centered).mean(dim=(0, 2, 3), keepdim=True)
    reference = centered * kiln.rsqrt(var + 1e-5) * w2.reshape(1, 3, 1, 1) + b2.reshape(1, 3, 1, 1)
    reference.backward(g)
    for got, expected in zip(found, (x2.grad, w2.grad, b2.grad), strict=True):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-12)


def test_batch_norm_training_gradgrad():
    """A gradient of the gradient (create_graph) goes through the composite's formula again."""
    x, w, b = leaves(rng.normal(size=(4, 2, 3)), rng.normal(size=2), rng.normal(size=2))
    assert kiln.autograd.gradgradcheck(lambda *a: F.batch_norm(a[0], None, None, *a[1:], training=True), (x, w, b))
    assert kiln.autograd.gradgradcheck(lambda a: F.batch_norm(a, None, None, training=True), (x,))


def test_batch_norm_eval_uses_running_stats(torch):
    x = rng.normal(size=(4, 3, 2))
    mean, var, w, b = rng.normal(size=3), rng.uniform(0.5, 2, size=3), rng.normal(size=3), rng.normal(size=3)
    k_mean = kiln.from_numpy(mean.copy())
    check_parity(torch, lambda *a: F.batch_norm(*a, training=False), lambda *a: torch.nn.functional.batch_norm(*a),
                 [x, mean, var, w, b], grad=(0, 3, 4), rtol=1e-10, atol=1e-12)  # fmt: skip
    F.batch_norm(kiln.from_numpy(x), k_mean, kiln.from_numpy(var), training=False)
    assert k_mean.tolist() == mean.tolist()  # eval leaves the statistics alone


def test_batch_norm_errors():
    with pytest.raises(
        ValueError, match=r"Expected more than 1 value per channel when training, got input size \[1, 3\]"
    ):
        F.batch_norm(kiln.zeros(1, 3), None, None, training=True)
    with pytest.raises(RuntimeError, match="running_mean should contain 3 elements not 4"):
        F.batch_norm(kiln.zeros(2, 3), kiln.zeros(4), kiln.ones(3))


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm_matches_torch(torch, groups):
    x, w, b = rng.normal(size=(2, 6, 3, 2)), rng.normal(size=6), rng.normal(size=6)
    check_parity(torch, lambda *a: F.group_norm(a[0], groups, *a[1:]),
                 lambda *a: torch.nn.functional.group_norm(a[0], groups, *a[1:]),
                 [x, w, b], grad=(0, 1, 2), rtol=1e-9, atol=1e-10)  # fmt: skip


def test_group_norm_error_and_instance_norm(torch):
    with pytest.raises(
        RuntimeError, match=r"divisible by num_groups, but got input of shape \[2, 6, 4\] and num_groups=4"
    ):
        F.group_norm(kiln.zeros(2, 6, 4), 4)
    check_parity(torch, lambda *a: F.instance_norm(a[0], weight=a[1], bias=a[2]),
                 lambda *a: torch.nn.functional.instance_norm(a[0], weight=a[1], bias=a[2]),
                 [rng.normal(size=(2, 3, 5)), rng.normal(size=3), rng.normal(size=3)], grad=(0, 1, 2),
                 rtol=1e-9, atol=1e-10)  # fmt: skip


def test_norms_gradcheck():
    x, w, b = leaves(rng.normal(size=(3, 4, 2)), rng.normal(size=4), rng.normal(size=4))
    assert kiln.autograd.gradcheck(lambda *a: F.batch_norm(a[0], None, None, *a[1:], training=True), (x, w, b))
    assert kiln.autograd.gradcheck(lambda *a: F.group_norm(a[0], 2, *a[1:]), (x, w, b))
    (w2,) = leaves(rng.normal(size=(4, 2)))
    assert kiln.autograd.gradcheck(lambda a, c: F.layer_norm(a, (4, 2), c), (x, w2))
    assert kiln.autograd.gradgradcheck(lambda a: F.layer_norm(a, (2,)), (x,))


def _longest_chain_of_sums(graph, depth: dict | None = None) -> int:
    """The most ``reduce_sum`` nodes on one path through ``graph`` (kernel bodies included): each
    sum waits for the one before it, so a kernel runs one pass over its rows per link."""
    depth = {} if depth is None else depth
    for node in graph.nodes:
        for body in node.bodies:
            _longest_chain_of_sums(body, depth)
        if not node.bodies:
            links = max((depth.get(v.id, 0) for v in node.inputs), default=0) + (node.op == "reduce_sum")
            for out in node.outputs:
                depth[out.id] = links
    return max((depth.get(v.id, 0) for v in graph.outputs), default=0)


@pytest.mark.parametrize("norm", ["layer_norm", "group_norm"])
def test_the_compiled_norm_backward_sums_its_rows_in_one_pass(norm):
    """The backward's two row sums (of the gradient, and of the gradient times the deviations) read
    only saved values, as a hand-written backward's do; autograd through the twice-centered
    deviations chained three, each waiting for the last (layer_norm on (512, 128): 165 -> 145 us)."""
    x, w, b = leaves(rng.normal(size=(4, 6, 8)), rng.normal(size=6), rng.normal(size=6), dtype=np.float32)

    def fn(x, w, b):
        if norm == "layer_norm":
            return F.layer_norm(x.transpose(1, 2), (6,), w, b)
        return F.group_norm(x, 2, w, b)

    (spec,) = kiln.explain(fn, x, w, b).specializations
    assert _longest_chain_of_sums(spec.backward.graph) == 1
    compiled = kiln.compile(fn)
    g = kiln.tensor(rng.normal(size=tuple(fn(x, w, b).shape)).astype(np.float32))
    found = [kiln.autograd.grad(f(x, w, b), (x, w, b), g) for f in (compiled, fn)]
    for got, expected in zip(*found, strict=True):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-5)


def test_the_traced_form_has_the_eager_values_and_exact_second_derivatives():
    """The form a trace takes (``_normalize_traced``), run eagerly: the eager form's values and
    gradients, and gradients of gradients (its zero terms restore the mean's part there). Eagerly
    ``_normalize`` keeps ``moments``' form: 13 ops against the traced form's 22, each a pass."""
    from kiln.nn._norm import _normalize, _normalize_traced

    x, w = leaves(rng.normal(size=(3, 4, 5)), rng.normal(size=5))
    for got, want in zip(_normalize_traced(x, (2,), 1e-3), _normalize(x, (2,), 1e-3), strict=True):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    assert kiln.autograd.gradcheck(lambda a, b: _normalize_traced(a, (2,), 1e-3)[0] * b, (x, w))
    assert kiln.autograd.gradgradcheck(lambda a, b: _normalize_traced(a, (1, 2), 1e-3)[0] * b, (x, w))
    with kiln.profiler.profile() as prof:
        _normalize(x, (2,), 1e-3)
    assert len([e for e in prof.events() if e.cat == "op"]) <= 13


def test_layer_norm_gradient_of_nearly_constant_rows_in_float32(torch):
    """Rows whose spread is 1e-6 of their mean: the float32 gradient still matches float64's, the
    deviations centered twice (``_batch_norm.moments``) while the drift is held constant."""
    x = (1000.0 + 1e-3 * rng.normal(size=(6, 16))).astype(np.float32).astype(np.float64)  # float32's values
    w, g = rng.normal(size=16), rng.normal(size=(6, 16))
    (k,) = leaves(x, dtype=np.float32)
    F.layer_norm(k, (16,), kiln.tensor(w.astype(np.float32)), eps=0.0).backward(kiln.tensor(g.astype(np.float32)))
    t = torch.tensor(x, requires_grad=True)
    torch.nn.functional.layer_norm(t, (16,), torch.tensor(w), eps=0.0).backward(torch.tensor(g))
    scale = np.abs(t.grad.numpy()).max()
    np.testing.assert_allclose(k.grad.numpy(), t.grad.numpy(), rtol=0, atol=2e-3 * scale)
