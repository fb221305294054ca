"""Reductions through the public API: values, dtypes and gradients against PyTorch, finite-difference
gradient checks in float64, the edge cases (empty, 0-d, ties, nan/inf, zeros in prod) and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from tests.conftest import assert_close, to_torch, tol

NAN, INF = math.nan, math.inf


def rand(shape, dtype=kiln.float64, seed=0, low=-2.0, high=2.0):
    rng = np.random.default_rng(seed)
    return kiln.from_numpy(rng.uniform(low, high, size=shape).astype(dtype.np))


def inputs_2d(dtype):
    """(name, tensor, smooth): random, non-contiguous, with ties, with nan/inf, with zeros."""
    ties = kiln.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, 2.0], [0.5, -4.0, 0.5, 0.5]], dtype=dtype)
    special = kiln.tensor([[1.0, NAN, 3.0, 0.0], [INF, -INF, 0.0, 1.0], [-INF, -INF, -INF, -INF]], dtype=dtype)
    zeros = kiln.tensor([[1.5, 0.0, 2.0, -1.0], [0.0, 0.0, 3.0, 1.0], [1.0, 2.0, -3.0, 0.5]], dtype=dtype)
    return [
        ("random", rand((3, 4), dtype), True),
        ("transposed", rand((4, 3), dtype, seed=1).transpose(0, 1), True),
        ("ties", ties, False),
        ("special", special, False),
        ("zeros", zeros, False),
    ]


def _values(out):
    return out.values if hasattr(out, "values") else out


# Each op on a (3, 4) input: (name, fn(module, x)), the same call for kiln and torch.
OPS_2D = [
    ("sum", lambda m, x: m.sum(x)),
    ("sum_dim", lambda m, x: m.sum(x, 1)),
    ("sum_tuple_keepdim", lambda m, x: m.sum(x, (0, -1), keepdim=True)),
    ("nansum", lambda m, x: m.nansum(x)),
    ("nansum_dim_keepdim", lambda m, x: m.nansum(x, 1, keepdim=True)),
    ("method_nansum_tuple", lambda m, x: x.nansum((0, 1))),
    ("mean", lambda m, x: m.mean(x)),
    ("nanmean", lambda m, x: m.nanmean(x)),
    ("nanmean_dim", lambda m, x: m.nanmean(x, 0)),
    ("method_nanmean_keepdim", lambda m, x: x.nanmean(-1, keepdim=True)),
    ("mean_neg_dim", lambda m, x: m.mean(x, -1)),
    ("mean_tuple_keepdim", lambda m, x: m.mean(x, (0, 1), keepdim=True)),
    ("prod", lambda m, x: m.prod(x)),
    ("prod_dim", lambda m, x: m.prod(x, 1)),
    ("prod_dim_keepdim", lambda m, x: m.prod(x, 0, keepdim=True)),
    ("amax", lambda m, x: m.amax(x)),
    ("amax_dim", lambda m, x: m.amax(x, 1)),
    ("amin_tuple_keepdim", lambda m, x: m.amin(x, (0, 1), keepdim=True)),
    ("max", lambda m, x: m.max(x)),
    ("min", lambda m, x: m.min(x)),
    ("max_dim_values", lambda m, x: m.max(x, 1).values),
    ("max_dim_indices", lambda m, x: m.max(x, 1).indices),
    ("min_dim_keepdim_values", lambda m, x: m.min(x, 0, keepdim=True)[0]),
    ("min_dim_keepdim_indices", lambda m, x: m.min(x, 0, keepdim=True)[1]),
    ("method_max_dim", lambda m, x: x.max(dim=-1)[0]),
    ("argmax", lambda m, x: m.argmax(x)),
    ("argmax_dim", lambda m, x: m.argmax(x, 1)),
    ("argmax_keepdim", lambda m, x: m.argmax(x, 0, keepdim=True)),
    ("argmin_dim", lambda m, x: m.argmin(x, -1)),
    ("var", lambda m, x: m.var(x)),
    ("var_dim_biased", lambda m, x: m.var(x, 1, unbiased=False)),
    ("var_correction", lambda m, x: m.var(x, (0, 1), correction=2, keepdim=True)),
    ("std", lambda m, x: m.std(x)),
    ("std_dim", lambda m, x: m.std(x, 0, keepdim=True)),
    ("logsumexp", lambda m, x: m.logsumexp(x, 1)),
    ("logsumexp_tuple_keepdim", lambda m, x: m.logsumexp(x, (0, 1), keepdim=True)),
    ("softmax", lambda m, x: m.softmax(x, 1)),
    ("softmax_dim0", lambda m, x: m.softmax(x, 0)),
    ("log_softmax", lambda m, x: m.log_softmax(x, -1)),
    ("cumsum", lambda m, x: m.cumsum(x, 1)),
    ("cumsum_dim0", lambda m, x: m.cumsum(x, 0)),
    ("all", lambda m, x: m.all(x)),
    ("any_dim", lambda m, x: m.any(x, 1)),
    ("all_keepdim", lambda m, x: m.all(x, 0, keepdim=True)),
    ("count_nonzero", lambda m, x: m.count_nonzero(x, 0)),
]
NOT_DIFFERENTIABLE = {"max_dim_indices", "min_dim_keepdim_indices", "argmax", "argmax_dim", "argmax_keepdim",
                      "argmin_dim", "all", "any_dim", "all_keepdim", "count_nonzero"}  # fmt: skip
DIFFERENTIABLE_2D = [op for op in OPS_2D if op[0] not in NOT_DIFFERENTIABLE]


@pytest.mark.parametrize(("name", "fn"), OPS_2D, ids=[o[0] for o in OPS_2D])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_values_and_dtypes_match_pytorch(name, fn, dtype, torch):
    for label, x, _ in inputs_2d(dtype):
        expected = fn(torch, to_torch(torch, x))
        # Tolerances are per dtype; softmax/logsumexp round a few more times than a sum.
        assert_close(fn(kiln, x), expected, rtol=tol(dtype)["rtol"] * 10, atol=tol(dtype)["atol"] * 10), label


@pytest.mark.parametrize(("name", "fn"), DIFFERENTIABLE_2D, ids=[o[0] for o in DIFFERENTIABLE_2D])
def test_gradients_match_pytorch(name, fn, torch):
    # Ties and zeros are where the gradient conventions live (split among ties for amax, the one
    # returned index for max(dim), products of the others for prod), so compare there too.
    for label, x, _ in inputs_2d(kiln.float64):
        if label == "special" and name.startswith(("amax", "amin", "prod")):
            # torch.amax gives nan everywhere in a row whose max is nan (kiln follows torch.max());
            # prod: a zero next to inf/nan gives nan in PyTorch, 0 in kiln (see _prod_vjp).
            continue
        xk = x.detach().clone().requires_grad_()
        xt = to_torch(torch, x).requires_grad_()
        out_k, out_t = _values(fn(kiln, xk)), fn(torch, xt)
        seed = rand(tuple(out_k.shape), seed=3)
        out_k.backward(seed)
        out_t.backward(to_torch(torch, seed))
        assert_close(xk.grad, xt.grad, rtol=1e-9, atol=1e-12), label


@pytest.mark.parametrize(("name", "fn"), DIFFERENTIABLE_2D, ids=[o[0] for o in DIFFERENTIABLE_2D])
def test_gradcheck_float64(name, fn):
    x = rand((3, 4), seed=5).requires_grad_()
    assert kiln.autograd.gradcheck(lambda t: _values(fn(kiln, t)), (x,), atol=1e-6, rtol=1e-4)


def test_gradcheck_prod_with_zeros():
    for row in ([2.0, 0.0, 3.0, 1.5], [0.0, 0.0, 3.0, -1.0], [0.0, 2.0, -0.5, 4.0]):
        x = kiln.tensor([row, [1.0, 2.0, 0.5, -1.0]], dtype=kiln.float64, requires_grad=True)
        assert kiln.autograd.gradcheck(lambda t: kiln.prod(t, 1), (x,))
        assert kiln.autograd.gradcheck(lambda t: kiln.prod(t), (x,))


def test_prod_gradient_with_zeros_by_hand():
    x = kiln.tensor([2.0, 0.0, 3.0], requires_grad=True)
    x.prod().backward()
    assert x.grad.tolist() == [0.0, 6.0, 0.0]  # one zero: the product of the others, there only
    y = kiln.tensor([0.0, 5.0, 0.0], requires_grad=True)
    y.prod().backward()
    assert y.grad.tolist() == [0.0, 0.0, 0.0]  # two zeros: every partial product holds a zero


def test_prod_second_order_matches_pytorch(torch):
    data = [[2.0, 0.0, 3.0], [1.5, -2.0, 0.5]]
    xk = kiln.tensor(data, dtype=kiln.float64, requires_grad=True)
    xt = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    (gk,) = kiln.autograd.grad(kiln.prod(xk, 1).sum(), (xk,), create_graph=True)
    (gt,) = torch.autograd.grad(torch.prod(xt, 1).sum(), (xt,), create_graph=True)
    assert_close(gk, gt, rtol=1e-12, atol=1e-12)
    (gk * gk).sum().backward()
    (gt * gt).sum().backward()
    assert_close(xk.grad, xt.grad, rtol=1e-12, atol=1e-12)


def test_gradcheck_max_with_dim_and_softmax_family_on_3d():
    x = rand((2, 3, 4), seed=7).requires_grad_()
    for fn in (lambda t: kiln.max(t, 1).values, lambda t: kiln.min(t, -1, keepdim=True).values,
               lambda t: kiln.softmax(t, 1), lambda t: kiln.log_softmax(t, 0), lambda t: kiln.logsumexp(t, (0, 2)),
               lambda t: kiln.std(t, (1, 2), correction=0), lambda t: kiln.cumsum(t, 1)):  # fmt: skip
        assert kiln.autograd.gradcheck(fn, (x,), atol=1e-6, rtol=1e-4)


# ----------------------------------------------------------------------------- ties and indices
def test_amax_splits_ties_and_max_dim_gives_the_returned_index():
    x = kiln.tensor([[1.0, 3.0, 3.0]], requires_grad=True)
    x.amax(1).sum().backward()
    assert x.grad.tolist() == [[0.0, 0.5, 0.5]]
    y = kiln.tensor([[1.0, 3.0, 3.0]], requires_grad=True)
    values, indices = y.max(1)
    values.sum().backward()
    assert indices.tolist() == [1] and y.grad.tolist() == [[0.0, 1.0, 0.0]]


def test_nan_maximum_sends_the_gradient_to_the_nan():
    # torch.max() does this; torch.amax instead returns nan for the whole row (kiln: one rule for both).
    x = kiln.tensor([[1.0, NAN, 3.0], [2.0, 5.0, 5.0]], requires_grad=True)
    kiln.amax(x, 1).sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.5, 0.5]]


def test_max_with_dim_is_a_named_tuple_of_values_and_indices():
    x = kiln.tensor([[1.0, 5.0, 2.0], [7.0, 7.0, -1.0]])
    out = kiln.max(x, 1)
    values, indices = out
    assert out.values is values and out.indices is indices
    assert values.tolist() == [5.0, 7.0] and indices.tolist() == [1, 0]  # first occurrence
    assert indices.dtype is kiln.int64
    assert kiln.min(x, dim=0, keepdim=True).indices.tolist() == [[0, 0, 1]]


def test_max_and_min_of_two_tensors_are_maximum_and_minimum():
    a, b = kiln.tensor([1.0, 5.0, NAN]), kiln.tensor([3.0, 2.0, 0.0])
    assert_close(kiln.max(a, b), np.array([3.0, 5.0, NAN], dtype=np.float32), rtol=0, atol=0)
    assert_close(a.min(b), np.array([1.0, 2.0, NAN], dtype=np.float32), rtol=0, atol=0)


def test_nan_propagates_through_max_and_argmax_points_at_it():
    x = kiln.tensor([[1.0, NAN, 3.0], [2.0, 0.0, -1.0]])
    assert math.isnan(kiln.max(x).item()) and math.isnan(kiln.amin(x).item())
    assert kiln.argmax(x, 1).tolist() == [1, 0] and kiln.argmin(x, 1).tolist() == [1, 2]
    assert math.isnan(x.max(1).values[0].item())


def test_argmax_flattens_when_dim_is_none():
    x = kiln.tensor([[1, 9, 2], [9, 0, 3]])
    assert kiln.argmax(x).item() == 1 and kiln.argmin(x).item() == 4
    assert tuple(kiln.argmax(x, keepdim=True).shape) == (1, 1)


# ----------------------------------------------------------------------------- 0-d, empty, dtypes
def test_zero_dim_inputs(torch):
    x = kiln.tensor(2.5, dtype=kiln.float64)
    xt = to_torch(torch, x)
    for fn in (lambda m, t: m.sum(t), lambda m, t: m.mean(t, 0), lambda m, t: m.prod(t), lambda m, t: m.amax(t),
               lambda m, t: m.max(t), lambda m, t: m.max(t, 0)[0], lambda m, t: m.max(t, -1)[1],
               lambda m, t: m.argmax(t), lambda m, t: m.argmin(t, 0), lambda m, t: m.logsumexp(t, 0),
               lambda m, t: m.softmax(t, 0), lambda m, t: m.log_softmax(t, -1), lambda m, t: m.cumsum(t, 0),
               lambda m, t: m.var(t, correction=0), lambda m, t: m.all(t), lambda m, t: m.any(t, 0)):  # fmt: skip
        assert_close(fn(kiln, x), fn(torch, xt), rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:var\\(\\)")  # PyTorch warns for var of 0 elements
def test_empty_inputs_match_pytorch(torch):
    x = kiln.zeros(0, 3, dtype=kiln.float64)
    xt = to_torch(torch, x)
    for fn in (lambda m, t: m.sum(t), lambda m, t: m.sum(t, 0), lambda m, t: m.mean(t), lambda m, t: m.prod(t, 0),
               lambda m, t: m.amax(t, 1), lambda m, t: m.max(t, 1)[0], lambda m, t: m.argmax(t, 1),
               lambda m, t: m.logsumexp(t, 0), lambda m, t: m.softmax(t, 0), lambda m, t: m.cumsum(t, 0),
               lambda m, t: m.var(t, 1), lambda m, t: m.all(t), lambda m, t: m.any(t, 0),
               lambda m, t: m.all(t, 1, keepdim=True), lambda m, t: m.count_nonzero(t)):  # fmt: skip
        assert_close(fn(kiln, x), fn(torch, xt), rtol=0, atol=0)
    assert kiln.zeros(0).sum().item() == 0.0 and kiln.zeros(0).prod().item() == 1.0
    assert math.isnan(kiln.zeros(0).mean().item())


def test_reductions_without_identity_refuse_empty_inputs():
    with pytest.raises(RuntimeError, match=r"max\(\): Expected reduction dim to be specified for input.numel\(\) == 0"):
        kiln.max(kiln.zeros(0))
    with pytest.raises(IndexError, match=r"max\(\): Expected reduction dim 0 to have non-zero size"):
        kiln.max(kiln.zeros(0, 3), 0)
    with pytest.raises(IndexError, match=r"amax\(\): Expected reduction dim 0 to have non-zero size"):
        kiln.amax(kiln.zeros(0, 3), 0)
    with pytest.raises(IndexError, match=r"argmax\(\): Expected reduction dim to be specified"):
        kiln.argmax(kiln.zeros(0, 3))


def test_integer_and_bool_dtypes(torch):
    i32 = kiln.tensor([[1, -2, 3], [4, 5, -6]], dtype=kiln.int32)
    flags = kiln.tensor([True, False, True])
    u8 = kiln.tensor([1, 0, 2], dtype=kiln.uint8)
    cases = [
        (kiln.sum(i32), torch.sum(to_torch(torch, i32))), (kiln.prod(i32, 1), torch.prod(to_torch(torch, i32), 1)),
        (kiln.prod(flags), torch.prod(to_torch(torch, flags))), (kiln.cumsum(i32, 1), torch.cumsum(to_torch(torch, i32), 1)),
        (kiln.cumsum(flags, 0), torch.cumsum(to_torch(torch, flags), 0)), (kiln.amax(i32, 0), torch.amax(to_torch(torch, i32), 0)),
        (kiln.max(i32, 1).values, torch.max(to_torch(torch, i32), 1).values), (kiln.all(u8), torch.all(to_torch(torch, u8))),
        (kiln.any(i32 > 4, 1), torch.any(to_torch(torch, i32) > 4, 1)), (kiln.mean(i32, dtype=kiln.float64),
        torch.mean(to_torch(torch, i32), dtype=torch.float64)), (kiln.logsumexp(i32, 1), torch.logsumexp(to_torch(torch, i32), 1)),
        (kiln.softmax(i32, 1, dtype=kiln.float64), torch.softmax(to_torch(torch, i32), 1, dtype=torch.float64)),
        (kiln.cumsum(i32, 0, dtype=kiln.float32), torch.cumsum(to_torch(torch, i32), 0, dtype=torch.float32)),
    ]  # fmt: skip
    for got, expected in cases:
        assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_float_only_reductions_reject_integers():
    ints = kiln.tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match=r"mean\(\): could not infer output dtype.*Got: Long"):
        ints.mean()
    with pytest.raises(RuntimeError, match="std and var only support floating point"):
        ints.var()
    with pytest.raises(RuntimeError, match="\"softmax\" not implemented for 'Long'"):
        ints.softmax(0)


# ----------------------------------------------------------------------------- stability and conventions
def test_logsumexp_rows_of_infinities_match_pytorch(torch):
    data = [[INF, 1.0], [-INF, -INF], [NAN, 1.0], [1000.0, 1000.0]]
    xk = kiln.tensor(data, dtype=kiln.float64, requires_grad=True)
    xt = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    out_k, out_t = kiln.logsumexp(xk, 1), torch.logsumexp(xt, 1)
    assert_close(out_k, out_t, rtol=1e-12, atol=0)
    assert out_k[3].item() == pytest.approx(1000.0 + math.log(2.0))
    out_k.sum().backward()
    out_t.sum().backward()
    assert_close(xk.grad, xt.grad, rtol=1e-12, atol=0)


def test_softmax_and_log_softmax_are_stable_for_large_inputs():
    x = kiln.tensor([1000.0, 1000.0, -1000.0])
    assert_close(kiln.softmax(x, 0), np.array([0.5, 0.5, 0.0], dtype=np.float32), rtol=1e-6, atol=1e-7)
    assert_close(kiln.log_softmax(x, 0), np.array([-math.log(2), -math.log(2), -2000 - math.log(2)], dtype=np.float32),
                 rtol=1e-6, atol=1e-4)  # fmt: skip


def test_std_and_var_gradients_at_zero_spread():
    x = kiln.full((3,), 2.0, dtype=kiln.float64, requires_grad=True)
    x.std().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0]  # PyTorch masks sqrt's 1/0 slope: 0, not nan


def test_var_keywords_and_degrees_of_freedom():
    x = kiln.tensor([1.0, 2.0, 3.0, 4.0], dtype=kiln.float64)
    assert x.var().item() == pytest.approx(5 / 3)
    assert x.var(unbiased=False).item() == pytest.approx(1.25)
    assert kiln.var(x, False).item() == pytest.approx(1.25)  # the legacy positional form
    assert x.var(correction=0).item() == pytest.approx(1.25)
    assert kiln.std(x, 0, True, keepdim=True).shape == (1,)
    assert math.isnan(kiln.tensor([1.0]).var().item())  # 0/0 when N == correction
    assert kiln.tensor([1.0, 2.0]).var(correction=3).item() == INF
    with pytest.raises(RuntimeError, match="both 'unbiased' and 'correction'"):
        x.var(unbiased=True, correction=0)


def test_cumsum_in_place_and_reverse():
    x = kiln.tensor([1, 2, 3], dtype=kiln.int32)
    assert x.cumsum_(0) is x and x.tolist() == [1, 3, 6] and x.dtype is kiln.int32
    assert kiln.cumsum(kiln.tensor([1.0, 2.0, 3.0]), 0, reverse=True).tolist() == [6.0, 5.0, 3.0]


def test_mean_of_known_values():
    x = kiln.tensor([[1.0, 2.0], [3.0, 6.0]])
    assert x.mean().item() == 3.0 and x.mean(0).tolist() == [2.0, 4.0]


# ----------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    "call",
    [lambda x: x.sum(2), lambda x: x.mean(-3), lambda x: x.amax((0, 5)), lambda x: x.max(2), lambda x: x.argmax(3),
     lambda x: x.softmax(2), lambda x: x.cumsum(-3), lambda x: x.logsumexp(2), lambda x: x.var(4), lambda x: x.all(2)],
)  # fmt: skip
def test_out_of_range_dims_raise(call):
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\]"):
        call(rand((2, 3)))


def test_repeated_dims_raise():
    with pytest.raises(ValueError, match="appears multiple times"):
        rand((2, 3)).sum((0, -2))


def test_softmax_requires_a_dim():
    with pytest.raises(TypeError, match="dim is required"):
        kiln.softmax(rand((2, 3)), None)


def test_nansum_and_nanmean_on_integers_and_all_nan_rows(torch):
    ints = kiln.tensor([[1, 2], [3, 4]])
    assert kiln.nansum(ints).dtype == kiln.int64 and int(kiln.nansum(ints)) == 10
    with pytest.raises(RuntimeError, match="nanmean\\(\\): expected input to have floating point .* got Long"):
        kiln.nanmean(ints, dtype=kiln.float32)  # as torch: dtype converts a float input, it does not admit ints
    x = kiln.tensor([[NAN, NAN], [1.0, NAN]], dtype=kiln.float64)
    assert_close(kiln.nanmean(x, 1), torch.nanmean(to_torch(torch, x), 1), rtol=0, atol=0)  # an all-nan row: nan
    assert_close(kiln.nansum(x, 1), torch.tensor([0.0, 1.0], dtype=torch.float64), rtol=0, atol=0)


def test_nansum_and_nanmean_compiled_match_eager():
    x = kiln.tensor([[1.0, NAN, 3.0], [NAN, NAN, NAN], [0.5, -2.0, 4.0]], dtype=kiln.float32).requires_grad_()

    def f(t):
        return t.nansum(0) * 2 + kiln.nanmean(t, 1, keepdim=True).nansum()

    compiled = kiln.compile(f)
    for _ in range(3):
        x.grad = None
        out = compiled(x)
        out.sum().backward()
        grad = x.grad.clone()
        x.grad = None
        expected = f(x)
        expected.sum().backward()
        assert_close(out, expected, rtol=1e-6, atol=1e-6)
        assert_close(grad, x.grad, rtol=1e-6, atol=1e-6)
        assert float(grad[1, 0]) == 0.0  # no gradient through a nan
