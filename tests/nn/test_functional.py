"""Activations, linear/bilinear, embedding, dropout, attention, one_hot, pad against torch.nn.functional."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from tests.conftest import assert_close
from tests.nn.helpers import check_parity, leaves

rng = np.random.default_rng(5)

ACTIVATIONS = [
    ("relu", {}), ("gelu", {}), ("gelu", {"approximate": "tanh"}), ("silu", {}), ("softplus", {"beta": 2.0}),
    ("sigmoid", {}), ("tanh", {}), ("leaky_relu", {"negative_slope": 0.2}), ("elu", {"alpha": 1.5}),
    ("hardtanh", {}), ("relu6", {}), ("logsigmoid", {}), ("softmax", {"dim": 1}), ("log_softmax", {"dim": 0}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "kwargs"), ACTIVATIONS, ids=lambda v: str(v))
def test_activations_match_torch(torch, name, kwargs):
    x = np.concatenate([rng.normal(size=(3, 4)) * 4, [[0.0, 50.0, -50.0, 6.5]]])  # includes 0 and large values
    check_parity(torch, lambda a: getattr(F, name)(a, **kwargs),
                 lambda a: getattr(torch.nn.functional, name)(a, **kwargs), [x], grad=(0,))  # fmt: skip


@pytest.mark.parametrize("name", ["leaky_relu", "elu", "softplus", "logsigmoid", "gelu"])
def test_activations_gradcheck(name):
    (x,) = leaves(rng.normal(size=(2, 3)))
    assert kiln.autograd.gradcheck(getattr(F, name), (x,))


def test_activations_keep_nan_and_stay_finite_at_extremes():
    x = kiln.tensor([math.nan, 1000.0, -1000.0], requires_grad=True)
    assert math.isnan(F.leaky_relu(x).tolist()[0]) and math.isnan(F.elu(x).tolist()[0])
    y = F.elu(x)
    y[1:].sum().backward()
    assert x.grad.tolist()[1:] == [1.0, 0.0]  # no nan from the unselected exp branch


@pytest.mark.parametrize("shape", [(5,), (2, 5), (2, 3, 5)])
def test_linear_matches_torch(torch, shape):
    x, w, b = rng.normal(size=shape), rng.normal(size=(4, 5)), rng.normal(size=4)
    check_parity(torch, F.linear, torch.nn.functional.linear, [x, w, b], grad=(0, 1, 2))
    check_parity(torch, F.linear, torch.nn.functional.linear, [x, w], grad=(0, 1))


def test_linear_hand_computed_and_errors():
    x = kiln.tensor([[1.0, 2.0]])
    w = kiln.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, -1.0]])
    assert F.linear(x, w, kiln.tensor([0.5, 0.0, 0.0])).tolist() == [[1.5, 3.0, -2.0]]
    with pytest.raises(RuntimeError, match=r"in_features=2 .* got input of size \[1, 3\]"):
        F.linear(kiln.zeros(1, 3), w)


def test_bilinear_matches_torch(torch):
    x1, x2, w, b = (
        rng.normal(size=(2, 3, 4)),
        rng.normal(size=(2, 3, 5)),
        rng.normal(size=(6, 4, 5)),
        rng.normal(size=6),
    )
    check_parity(torch, F.bilinear, torch.nn.functional.bilinear, [x1, x2, w, b], grad=(0, 1, 2, 3))


def test_embedding_matches_torch_and_padding_idx_gets_no_gradient(torch):
    idx = np.array([[0, 2, 4], [2, 2, 1]])
    w = rng.normal(size=(5, 3))
    check_parity(torch, F.embedding, torch.nn.functional.embedding, [idx, w], grad=(1,))
    out = check_parity(torch, lambda i, a: F.embedding(i, a, padding_idx=2),
                       lambda i, a: torch.nn.functional.embedding(i, a, padding_idx=2), [idx, w], grad=(1,))  # fmt: skip
    assert tuple(out.shape) == (2, 3, 3)
    (weight,) = leaves(w)
    F.embedding(kiln.from_numpy(idx), weight, padding_idx=-3).sum().backward()  # -3 is row 2
    assert weight.grad.tolist()[2] == [0.0, 0.0, 0.0] and weight.grad.tolist()[0] == [1.0, 1.0, 1.0]
    with pytest.raises(IndexError, match="index out of range"):
        F.embedding(kiln.tensor([5]), weight)


def test_dropout_statistics_scaling_and_identity_cases():
    x = kiln.ones(200, 500)
    out = F.dropout(x, p=0.3, generator=kiln.Generator().manual_seed(0))
    values = np.unique(out.numpy())
    assert np.allclose(values, [0.0, 1 / 0.7])
    kept = (out.numpy() != 0).mean()
    assert abs(kept - 0.7) < 0.01  # 100k draws: the standard error is ~0.0015
    assert F.dropout(x, p=0.3, training=False) is x
    assert F.dropout(x, p=0.0) is x
    assert F.dropout(x, p=1.0).sum().item() == 0.0
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1, but got 1.5"):
        F.dropout(x, p=1.5)


def test_dropout_same_seed_same_mask_and_gradient():
    x = kiln.randn(50, 40, requires_grad=True)
    a = F.dropout(x, 0.5, generator=kiln.Generator().manual_seed(7))
    b = F.dropout(x, 0.5, generator=kiln.Generator().manual_seed(7))
    c = F.dropout(x, 0.5, generator=kiln.Generator().manual_seed(8))
    assert np.array_equal(a.detach().numpy(), b.detach().numpy())
    assert not np.array_equal(a.detach().numpy(), c.detach().numpy())
    kiln.manual_seed(3)
    d = F.dropout(x, 0.5)
    kiln.manual_seed(3)
    assert np.array_equal(d.detach().numpy(), F.dropout(x, 0.5).detach().numpy())  # the default generator
    a.sum().backward()
    assert np.array_equal(x.grad.numpy(), (a.detach().numpy() != 0) * 2.0)


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "scale"])
def test_scaled_dot_product_attention_matches_torch(torch, case):
    q, k, v = rng.normal(size=(2, 3, 4, 8)), rng.normal(size=(2, 3, 6, 8)), rng.normal(size=(2, 3, 6, 5))
    if case == "causal":
        q = rng.normal(size=(2, 3, 6, 8))
    kw = {"is_causal": True} if case == "causal" else {"scale": 0.3} if case == "scale" else {}
    arrays = [q, k, v]
    if case == "bool_mask":
        mask = rng.uniform(size=(4, 6)) < 0.7
        mask[:, 0] = True  # no fully masked row
        arrays.append(mask)
    elif case == "float_mask":
        arrays.append(rng.normal(size=(3, 4, 6)))
    check_parity(torch, lambda *a: F.scaled_dot_product_attention(*a, **kw),
                 lambda *a: torch.nn.functional.scaled_dot_product_attention(*a, **kw),
                 arrays, grad=(0, 1, 2), rtol=1e-9, atol=1e-10)  # fmt: skip


def test_sdpa_causal_hand_computed_and_gradcheck():
    q = kiln.zeros(1, 3, 2)
    v = kiln.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    out = F.scaled_dot_product_attention(q, q, v, is_causal=True)  # equal scores: a running mean of v
    assert_close(out, np.array([[[1.0, 0.0], [0.5, 0.5], [2 / 3, 2 / 3]]], dtype=np.float32), rtol=1e-6, atol=1e-6)
    qs = leaves(rng.normal(size=(1, 3, 2)), rng.normal(size=(1, 3, 2)), rng.normal(size=(1, 3, 2)))
    assert kiln.autograd.gradcheck(lambda *a: F.scaled_dot_product_attention(*a, is_causal=True), qs)
    with pytest.raises(RuntimeError, match="should not be set when is_causal=True"):
        F.scaled_dot_product_attention(q, q, v, attn_mask=kiln.ones(3, 3), is_causal=True)


def test_one_hot_and_pad(torch):
    idx = kiln.tensor([[0, 3], [1, 1]])
    assert_close(F.one_hot(idx), torch.nn.functional.one_hot(torch.tensor([[0, 3], [1, 1]])), rtol=0, atol=0)
    assert F.one_hot(kiln.tensor([1]), 3).tolist() == [[0, 1, 0]]
    with pytest.raises(RuntimeError, match="smaller than num_classes"):
        F.one_hot(kiln.tensor([3]), 3)
    check_parity(torch, lambda a: F.pad(a, (1, 2, 0, 1), value=0.5),
                 lambda a: torch.nn.functional.pad(a, (1, 2, 0, 1), value=0.5), [rng.normal(size=(2, 3))], grad=(0,))  # fmt: skip


# kiln.nn.functional's losses and poolings, by the module of their kind (kiln issue 37: modules by idea).
_BY_KIND = {
    "_loss": "nll_loss cross_entropy binary_cross_entropy kl_div",
    "_loss_logits": "binary_cross_entropy_with_logits",
    "_loss_regression": "mse_loss l1_loss smooth_l1_loss huber_loss poisson_nll_loss gaussian_nll_loss",
    "_loss_margin": "soft_margin_loss margin_ranking_loss hinge_embedding_loss cosine_embedding_loss "
    "triplet_margin_loss triplet_margin_with_distance_loss multilabel_soft_margin_loss multi_margin_loss "
    "multilabel_margin_loss",
    "_pooling": "max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices "
    "max_pool3d_with_indices max_unpool1d max_unpool2d max_unpool3d",
    "_pooling_avg": "avg_pool1d avg_pool2d avg_pool3d lp_pool1d lp_pool2d lp_pool3d",
    "_pooling_adaptive": "adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d "
    "adaptive_max_pool2d adaptive_max_pool3d adaptive_max_pool1d_with_indices adaptive_max_pool2d_with_indices "
    "adaptive_max_pool3d_with_indices",
}


@pytest.mark.parametrize("kind", sorted(_BY_KIND))
def test_losses_and_poolings_live_in_the_module_of_their_kind(kind):
    import importlib

    module = importlib.import_module(f"kiln.nn.{kind}")
    names = _BY_KIND[kind].split()
    assert sorted(module.__all__) == sorted(names)
    for name in names:  # defined there, and kiln.nn.functional's name is that function
        assert getattr(F, name) is getattr(module, name) and getattr(module, name).__module__ == module.__name__, name


def test_every_loss_and_pooling_of_functional_has_a_kind():
    # ctc_loss, a dynamic programme over alignments, has a module of its own (_ctc)
    kinds = {name for names in _BY_KIND.values() for name in names.split()}
    ours = {n for n in dir(F) if n.endswith(("_loss", "pool1d", "pool2d", "pool3d", "_with_indices"))} - {"ctc_loss"}
    assert ours | {"cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div"} == kinds
