# ruff: noqa: B023 - the lambdas in loops are called within their own iteration (by check_parity)
"""The newer ``kiln.nn.functional`` names against torch in float64: values and gradients, then
finite-difference gradient checks, including the breakpoints of piecewise functions."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from tests.conftest import assert_close
from tests.nn.helpers import check_parity, leaves

rng = np.random.default_rng(0)
X = rng.normal(size=(2, 6, 3)) * 3
# Exactly on the breakpoints, where PyTorch's gradient rules pick a side.
KINKS = np.array([-3.0, 3.0, 0.0, 0.5, -0.5, 1.0, -1.0, 6.0, 2.0, -2.0, 0.25, 10.0])

UNARY = [
    ("celu", {}), ("celu", {"alpha": 0.5}), ("selu", {}), ("hardswish", {}), ("hardsigmoid", {}), ("mish", {}),
    ("softsign", {}), ("softshrink", {}), ("softshrink", {"lambd": 1.0}), ("hardshrink", {}), ("tanhshrink", {}),
    ("relu6", {}), ("hardtanh", {}), ("hardtanh", {"min_val": -2.0, "max_val": 0.5}), ("elu", {"alpha": 0.3}),
    ("leaky_relu", {"negative_slope": 0.2}), ("logsigmoid", {}), ("glu", {}), ("glu", {"dim": 1}),
    ("softmin", {"dim": 1}), ("threshold", {"threshold": 0.5, "value": -2.0}),
    ("rrelu", {}), ("normalize", {}), ("normalize", {"p": 1.0, "dim": -1}), ("normalize", {"p": 3.0, "dim": 0}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "kwargs"), UNARY)
def test_unary_matches_torch(torch, name, kwargs):
    for x in (X, KINKS.reshape(2, 6)):
        if name == "glu" and x.shape[kwargs.get("dim", -1)] % 2:
            continue
        # PyTorch's hardsigmoid backward multiplies by 1/6 rounded to float32, even in float64.
        tol = {"rtol": 1e-7, "atol": 1e-12} if name == "hardsigmoid" else {}
        check_parity(torch, lambda a: getattr(F, name)(a, **kwargs),
                     lambda a: getattr(torch.nn.functional, name)(a, **kwargs), [x], grad=(0,), **tol)  # fmt: skip


def test_inplace_forms_match_torch(torch):
    for name, args in [("relu_", ()), ("elu_", (0.5,)), ("leaky_relu_", (0.1,)), ("hardtanh_", (-0.5, 0.5)),
                       ("threshold_", (0.1, 7.0)), ("celu_", (2.0,)), ("selu_", ())]:  # fmt: skip
        k, t = kiln.tensor(X.copy()), torch.tensor(X.copy())
        out = getattr(F, name)(k, *args)
        getattr(torch.nn.functional, name)(t, *args)
        assert out is k
        assert_close(k, t, rtol=1e-12, atol=1e-12)


def test_gradcheck_activations():
    (x,) = leaves(X + 0.01)  # off the kinks: finite differences need a smooth neighbourhood
    for fn in (
        F.celu,
        F.selu,
        F.hardswish,
        F.mish,
        F.softsign,
        lambda a: F.glu(a, 1),
        F.normalize,
        lambda a: F.softmin(a, 1),
    ):
        assert kiln.autograd.gradcheck(fn, (x,))


def test_prelu_and_errors(torch):
    x = rng.normal(size=(2, 3, 4))
    check_parity(torch, F.prelu, torch.nn.functional.prelu, [x, np.array([0.1, -0.2, 0.3])], grad=(0, 1))
    check_parity(torch, F.prelu, torch.nn.functional.prelu, [x, np.array([0.25])], grad=(0, 1))
    with pytest.raises(RuntimeError, match="Halving dimension must be even"):
        F.glu(kiln.ones(3))
    with pytest.raises(RuntimeError, match="channel size"):
        F.prelu(kiln.ones(2, 3), kiln.ones(2))


def test_distances_match_torch(torch):
    a, b = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    tf = torch.nn.functional
    check_parity(torch, F.cosine_similarity, tf.cosine_similarity, [a, b], grad=(0, 1))
    check_parity(torch, lambda x, y: F.cosine_similarity(x, y, dim=0), lambda x, y: tf.cosine_similarity(x, y, dim=0),
                 [a, b[:1]], grad=(0, 1))  # fmt: skip
    for p in (1.0, 2.0, 3.0):
        check_parity(torch, lambda x, y, p=p: F.pairwise_distance(x, y, p), lambda x, y, p=p: tf.pairwise_distance(x, y, p),
                     [a, b], grad=(0, 1))  # fmt: skip
    check_parity(torch, lambda x, y: F.pairwise_distance(x, y, keepdim=True),
                 lambda x, y: tf.pairwise_distance(x, y, keepdim=True), [a, a], grad=(0, 1))  # fmt: skip


def test_pixel_and_channel_shuffle_match_torch(torch):
    tf = torch.nn.functional
    x = rng.normal(size=(2, 8, 3, 5))
    check_parity(torch, lambda a: F.pixel_shuffle(a, 2), lambda a: tf.pixel_shuffle(a, 2), [x], grad=(0,))
    check_parity(torch, lambda a: F.pixel_unshuffle(a, 3), lambda a: tf.pixel_unshuffle(a, 3),
                 [rng.normal(size=(3, 2, 6, 9))], grad=(0,))  # fmt: skip
    check_parity(torch, lambda a: F.pixel_shuffle(a, 2), lambda a: tf.pixel_shuffle(a, 2),
                 [rng.normal(size=(2, 4, 8, 3, 5))], grad=(0,))  # fmt: skip
    check_parity(torch, lambda a: F.channel_shuffle(a, 4), lambda a: tf.channel_shuffle(a, 4), [x], grad=(0,))
    with pytest.raises(RuntimeError, match="divisible"):
        F.pixel_shuffle(kiln.ones(1, 3, 2, 2), 2)


LOSSES = [
    ("smooth_l1_loss", {}), ("smooth_l1_loss", {"beta": 0.5}), ("smooth_l1_loss", {"beta": 0.0}),
    ("huber_loss", {}), ("huber_loss", {"delta": 0.3}), ("soft_margin_loss", {}),
    ("kl_div", {"reduction": "batchmean"}), ("kl_div", {"log_target": True}), ("kl_div", {"reduction": "sum"}),
    ("poisson_nll_loss", {}), ("poisson_nll_loss", {"log_input": False, "full": True}),
    ("multilabel_soft_margin_loss", {}),
]  # fmt: skip


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("name", "kwargs"), LOSSES)
def test_pointwise_losses_match_torch(torch, name, kwargs, reduction):
    kwargs = {"reduction": reduction, **kwargs}
    x = rng.normal(size=(4, 5))
    if name == "kl_div":
        x = np.log(rng.dirichlet(np.ones(5), size=4))
        t = x.copy() * 1.1 if kwargs.get("log_target") else rng.dirichlet(np.ones(5), size=4)
        t[0, 0] = 0.0 if not kwargs.get("log_target") else t[0, 0]  # 0 log 0 = 0
    elif name in ("soft_margin_loss",):
        t = np.sign(rng.normal(size=(4, 5)))
    elif name == "multilabel_soft_margin_loss":
        t = (rng.uniform(size=(4, 5)) > 0.5).astype(np.float64)
    elif name == "poisson_nll_loss":
        t = rng.integers(0, 5, size=(4, 5)).astype(np.float64)
        x = np.abs(x) + 0.1 if not kwargs.get("log_input", True) else x
    else:
        t = x + rng.normal(size=(4, 5)) * np.array([0.1, 0.5, 1.0, 2.0, 0.0])  # both sides of beta, and exact 0
    # PyTorch gives no target gradient for soft_margin_loss, and a nan one for kl_div at a zero target
    # and for the full Poisson loss at targets 0 and 1.
    grad = (0,) if name in ("soft_margin_loss", "kl_div") or kwargs.get("full") else (0, 1)
    check_parity(torch, lambda a, b: getattr(F, name)(a, b, **kwargs),
                 lambda a, b: getattr(torch.nn.functional, name)(a, b, **kwargs), [x, t], grad=grad)  # fmt: skip


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_margin_and_embedding_losses_match_torch(torch, reduction):
    tf = torch.nn.functional
    a, b, c = rng.normal(size=(6, 4)), rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
    y = np.array([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    r = {"reduction": reduction}
    check_parity(
        torch,
        lambda p, q, t: F.margin_ranking_loss(p, q, t, 0.2, **r),
        lambda p, q, t: tf.margin_ranking_loss(p, q, t, 0.2, **r),
        [a[:, 0], b[:, 0], y],
        grad=(0, 1),
    )
    check_parity(
        torch,
        lambda p, t: F.hinge_embedding_loss(p, t, 0.7, **r),
        lambda p, t: tf.hinge_embedding_loss(p, t, 0.7, **r),
        [a[:, 0], y],
        grad=(0,),
    )
    check_parity(
        torch,
        lambda p, q, t: F.cosine_embedding_loss(p, q, t, 0.1, **r),
        lambda p, q, t: tf.cosine_embedding_loss(p, q, t, 0.1, **r),
        [a, b, y],
        grad=(0, 1),
    )
    for swap in (False, True):
        check_parity(
            torch,
            lambda p, q, s: F.triplet_margin_loss(p, q, s, 0.5, swap=swap, **r),
            lambda p, q, s: tf.triplet_margin_loss(p, q, s, 0.5, swap=swap, **r),
            [a, b, c],
            grad=(0, 1, 2),
        )
    var = rng.uniform(0.1, 2, size=(6, 4))
    var[0, 0] = 1e-9  # clamped to eps, gradient passes through
    for full in (False, True):
        check_parity(
            torch,
            lambda p, q, v: F.gaussian_nll_loss(p, q, v, full=full, **r),
            lambda p, q, v: tf.gaussian_nll_loss(p, q, v, full=full, **r),
            [a, b, var],
            grad=(0, 1, 2),
        )
    check_parity(
        torch,
        lambda p, q, v: F.gaussian_nll_loss(p, q, v, **r),
        lambda p, q, v: tf.gaussian_nll_loss(p, q, v, **r),
        [a, b, var[:, 0]],
        grad=(0, 1, 2),
    )
    target = np.array([0, 3, 1, 2, 3, 0])
    w = rng.uniform(0.5, 2, size=4)
    for p in (1, 2):
        check_parity(
            torch,
            lambda x, wt: F.multi_margin_loss(x, kiln.tensor(target), p, 0.8, wt, **r),
            lambda x, wt: tf.multi_margin_loss(x, torch.tensor(target), p, 0.8, wt, **r),
            [a, w],
            grad=(0,),
        )
    # fmt: skip


def test_loss_gradchecks():
    x, t = leaves(rng.normal(size=(3, 4)), rng.normal(size=(3, 4)))
    assert kiln.autograd.gradcheck(lambda a, b: F.smooth_l1_loss(a, b, beta=0.7), (x, t))
    assert kiln.autograd.gradcheck(lambda a, b: F.huber_loss(a, b, delta=0.4), (x, t))
    p = kiln.tensor(rng.dirichlet(np.ones(4), size=3))
    assert kiln.autograd.gradcheck(lambda a: F.kl_div(a, p, reduction="batchmean"), (x,))
    assert kiln.autograd.gradcheck(lambda a, b: F.cosine_embedding_loss(a, b, kiln.tensor([1.0, -1.0, 1.0])), (x, t))


def test_channel_dropout_statistics_and_eval():
    kiln.manual_seed(0)
    x = kiln.ones(64, 32, 5, 5)
    out = F.dropout2d(x, 0.25)
    per_channel = out.numpy().reshape(64, 32, 25)
    # A channel is all zero or all 1 / (1 - p): one draw per (sample, channel).
    assert np.all(per_channel.min(-1) == per_channel.max(-1))
    assert np.all(np.isclose(per_channel, 0.0) | np.isclose(per_channel, 1 / 0.75))
    assert abs((per_channel[..., 0] == 0).mean() - 0.25) < 0.03
    assert F.dropout1d(x[0, :, :, 0], 0.5, training=False) is not None
    assert_close(F.dropout3d(x[:2], 0.5, training=False), x[:2], rtol=0, atol=0)
    unbatched = F.dropout1d(kiln.ones(40, 7), 0.5).numpy()
    assert np.all(unbatched.min(-1) == unbatched.max(-1))


def test_channel_dropout_of_other_ranks_follows_pytorch():
    """PyTorch's dropout2d warns on a 2-D input and drops elements; reads a 3-D input as (N, C, L);
    dropout3d reads a 4-D input as unbatched (one draw per dim-0 slice)."""
    kiln.manual_seed(0)
    with pytest.warns(UserWarning, match="2-D input to dropout2d"):
        flat = F.dropout2d(kiln.ones(64, 64), 0.5).numpy()
    assert 0.4 < (flat == 0).mean() < 0.6 and not np.all(flat.min(-1) == flat.max(-1))  # elements, not rows
    with pytest.warns(UserWarning, match=r"\(N, C, L\)"):
        lines = F.dropout2d(kiln.ones(8, 16, 5), 0.5).numpy()
    assert np.all(lines.min(-1) == lines.max(-1)) and not np.all(lines.min((1, 2)) == lines.max((1, 2)))
    volume = F.dropout3d(kiln.ones(16, 3, 4, 5), 0.5).numpy()
    assert np.all(volume.reshape(16, -1).min(-1) == volume.reshape(16, -1).max(-1))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"), pytest.warns(UserWarning, match="1-D input"):
        F.dropout2d(kiln.ones(5), 0.5)


def test_alpha_dropout_keeps_selu_moments():
    kiln.manual_seed(1)
    x = kiln.randn(200_000, dtype=kiln.float64)
    out = F.alpha_dropout(x, 0.2, training=True).numpy()
    assert abs(out.mean()) < 0.01 and abs(out.std() - 1.0) < 0.01
    assert_close(F.alpha_dropout(x, 0.2), x, rtol=0, atol=0)  # training=False by default
    kept = F.feature_alpha_dropout(kiln.ones(8, 16, 3), 0.5, training=True).numpy()
    assert np.all(kept.min(-1) == kept.max(-1))


INTERP = [
    ((1, 2, 5), {"size": 8, "mode": "nearest"}), ((1, 2, 5), {"scale_factor": 2.5, "mode": "nearest"}),
    ((1, 2, 7), {"size": 3, "mode": "nearest"}), ((1, 2, 7), {"size": 3, "mode": "nearest-exact"}),
    ((2, 3, 4, 5), {"scale_factor": 2, "mode": "nearest"}), ((2, 3, 4, 5), {"size": (7, 3), "mode": "nearest"}),
    ((1, 2, 5), {"size": 9, "mode": "linear"}), ((1, 2, 5), {"size": 9, "mode": "linear", "align_corners": True}),
    ((2, 3, 4, 5), {"scale_factor": 2, "mode": "bilinear"}),
    ((2, 3, 4, 5), {"size": (3, 8), "mode": "bilinear", "align_corners": True}),
    ((2, 3, 4, 5), {"scale_factor": 1.7, "mode": "bilinear"}),
    ((2, 3, 4, 5), {"scale_factor": 1.7, "mode": "bilinear", "recompute_scale_factor": True}),
    ((1, 2, 4, 5), {"scale_factor": 2, "mode": "bicubic"}),
    ((1, 2, 6, 5), {"size": (4, 9), "mode": "bicubic", "align_corners": True}),
    ((1, 2, 3, 4, 5), {"scale_factor": 2, "mode": "trilinear"}),
    ((1, 2, 3, 4, 5), {"size": (2, 6, 3), "mode": "trilinear", "align_corners": True}),
    ((1, 2, 3, 4, 5), {"scale_factor": (2, 1, 3), "mode": "nearest"}),
    ((2, 3, 8, 6), {"size": (4, 3), "mode": "area"}),
]  # fmt: skip


@pytest.mark.parametrize(("shape", "kwargs"), INTERP)
def test_interpolate_matches_torch(torch, shape, kwargs):
    check_parity(torch, lambda a: F.interpolate(a, **kwargs), lambda a: torch.nn.functional.interpolate(a, **kwargs),
                 [rng.normal(size=shape)], grad=(0,))  # fmt: skip


def test_interpolate_float32_nearest_picks_torch_rows_and_errors(torch):
    x = rng.normal(size=(1, 1, 13, 11)).astype(np.float32)
    for size in [(7, 5), (29, 31), (20, 3)]:
        check_parity(
            torch,
            lambda a, s=size: F.interpolate(a, size=s),
            lambda a, s=size: torch.nn.functional.interpolate(a, size=s),
            [x],
            dtype=np.float32,
            rtol=0,
            atol=0,
        )
    (xg,) = leaves(rng.normal(size=(1, 2, 3, 4)))
    assert kiln.autograd.gradcheck(lambda a: F.interpolate(a, scale_factor=1.5, mode="bicubic"), (xg,))
    with pytest.raises(ValueError, match="only one of size or scale_factor"):
        F.interpolate(kiln.ones(1, 1, 2), size=3, scale_factor=2)
    with pytest.raises(ValueError, match="align_corners option"):
        F.interpolate(kiln.ones(1, 1, 2), size=3, align_corners=True)
    with pytest.raises(NotImplementedError, match="bilinear mode needs 4D input"):
        F.interpolate(kiln.ones(1, 1, 2), size=3, mode="bilinear")


@pytest.mark.parametrize(
    ("name", "shape", "size"),
    [("adaptive_max_pool1d", (2, 3, 10), 4), ("adaptive_max_pool2d", (2, 3, 7, 9), (3, 4)),
     ("adaptive_max_pool2d", (3, 8, 6), (4, None)), ("adaptive_max_pool3d", (1, 2, 5, 6, 7), (2, 3, 4))],
)  # fmt: skip
def test_adaptive_max_pool_matches_torch(torch, name, shape, size):
    x = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float64)  # distinct values: one argmax per bin
    check_parity(torch, lambda a: getattr(F, name)(a, size), lambda a: getattr(torch.nn.functional, name)(a, size),
                 [x], grad=(0,))  # fmt: skip


def test_pooling_with_indices_and_lp_pool_match_torch(torch):
    tf = torch.nn.functional
    x = rng.permutation(2 * 3 * 8 * 6).reshape(2, 3, 8, 6).astype(np.float64)
    kout, kidx = F.adaptive_max_pool2d(kiln.tensor(x), (4, 3), return_indices=True)
    tout, tidx = tf.adaptive_max_pool2d(torch.tensor(x), (4, 3), return_indices=True)
    assert_close(kout, tout, rtol=0, atol=0)
    assert kidx.tolist() == tidx.tolist()
    kout, kidx = F.max_pool2d_with_indices(kiln.tensor(x), 2)
    assert kidx.tolist() == tf.max_pool2d_with_indices(torch.tensor(x), 2)[1].tolist()
    xs = rng.normal(size=(2, 3, 8, 6))
    for p in (2.0, 3.0):
        check_parity(torch, lambda a, p=p: F.lp_pool2d(a, p, (2, 3)), lambda a, p=p: tf.lp_pool2d(a, p, (2, 3)),
                     [np.abs(xs) + 0.1], grad=(0,))  # fmt: skip
        check_parity(torch, lambda a, p=p: F.lp_pool1d(a, p, 3, stride=2), lambda a, p=p: tf.lp_pool1d(a, p, 3, stride=2),
                     [np.abs(xs[:, :, 0]) + 0.1], grad=(0,))  # fmt: skip


def test_triplet_with_distance_and_gumbel_softmax(torch):
    tf = torch.nn.functional
    a, b, c = (rng.normal(size=(5, 4)) for _ in range(3))
    check_parity(
        torch,
        lambda p, q, s: F.triplet_margin_with_distance_loss(p, q, s, swap=True),
        lambda p, q, s: tf.triplet_margin_with_distance_loss(p, q, s, swap=True),
        [a, b, c],
        grad=(0, 1, 2),
    )
    check_parity(torch,
                 lambda p, q, s: F.triplet_margin_with_distance_loss(
                     p, q, s, distance_function=lambda u, v: 1 - F.cosine_similarity(u, v), margin=0.3),
                 lambda p, q, s: tf.triplet_margin_with_distance_loss(
                     p, q, s, distance_function=lambda u, v: 1 - tf.cosine_similarity(u, v), margin=0.3),
                 [a, b, c], grad=(0, 1, 2))  # fmt: skip
    kiln.manual_seed(0)
    logits = kiln.tensor(np.log([[0.1, 0.6, 0.3]] * 20000), requires_grad=True)
    soft = F.gumbel_softmax(logits, tau=0.5)
    assert_close(soft.sum(dim=-1), np.ones(20000), rtol=1e-12, atol=1e-12)
    hard = F.gumbel_softmax(logits, hard=True)
    counts = hard.detach().numpy().mean(axis=0)
    assert set(np.unique(hard.detach().numpy())) == {0.0, 1.0}
    np.testing.assert_allclose(counts, [0.1, 0.6, 0.3], atol=0.015)  # samples follow softmax(logits)
    hard.sum().backward()  # straight-through: the soft sample's gradient (sums to zero over the classes)
    assert_close(logits.grad.sum(dim=-1), np.zeros(20000), rtol=0, atol=1e-9)


def test_conv_transpose2d_functional_matches_torch(torch):
    x, w, b = rng.normal(size=(2, 4, 5, 5)), rng.normal(size=(4, 3, 3, 3)), rng.normal(size=3)
    check_parity(torch, lambda *t: F.conv_transpose2d(*t, stride=2, padding=1, output_padding=1),
                 lambda *t: torch.nn.functional.conv_transpose2d(*t, stride=2, padding=1, output_padding=1),
                 [x, w, b], grad=(0, 1, 2))  # fmt: skip


def test_unpool_pdist_and_conv_transpose1d_match_torch(torch):
    tf = torch.nn.functional
    x = rng.permutation(2 * 3 * 6 * 8).reshape(2, 3, 6, 8).astype(np.float64)
    kout, kidx = F.max_pool2d(kiln.tensor(x), 2, return_indices=True)
    tout, tidx = tf.max_pool2d(torch.tensor(x), 2, return_indices=True)
    check_parity(torch, lambda a: F.max_unpool2d(a, kidx, 2), lambda a: tf.max_unpool2d(a, tidx, 2),
                 [tout.numpy()], grad=(0,))  # fmt: skip
    check_parity(torch, lambda a: F.max_unpool2d(a, kidx, 2, output_size=(7, 9)),
                 lambda a: tf.max_unpool2d(a, tidx, 2, output_size=(7, 9)), [tout.numpy()], grad=(0,))  # fmt: skip
    x1 = rng.normal(size=(2, 3, 9))
    kout, kidx = F.max_pool1d(kiln.tensor(x1), 3, stride=2, return_indices=True)
    tout, tidx = tf.max_pool1d(torch.tensor(x1), 3, stride=2, return_indices=True)
    check_parity(torch, lambda a: F.max_unpool1d(a, kidx, 3, 2), lambda a: tf.max_unpool1d(a, tidx, 3, 2),
                 [tout.numpy()], grad=(0,))  # fmt: skip
    pts = rng.normal(size=(5, 3))
    pts[3] = pts[1]  # a zero distance: gradient 0, not nan
    for p in (2.0, 1.0, 3.0):
        check_parity(torch, lambda a, p=p: F.pdist(a, p), lambda a, p=p: tf.pdist(a, p), [pts], grad=(0,))
    xs, w, b = rng.normal(size=(2, 4, 7)), rng.normal(size=(4, 3, 3)), rng.normal(size=6)
    check_parity(torch, lambda *t: F.conv_transpose1d(*t, stride=2, padding=1, output_padding=1, groups=2),
                 lambda *t: tf.conv_transpose1d(*t, stride=2, padding=1, output_padding=1, groups=2),
                 [xs, w, b], grad=(0, 1, 2))  # fmt: skip


@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_and_grid_sample_match_torch(torch, align_corners):
    tf = torch.nn.functional
    theta = np.array([[[0.9, -0.3, 0.1], [0.2, 1.1, -0.2]], [[1.4, 0.5, 0.3], [-0.4, 0.8, 0.6]]])
    size = (2, 3, 5, 6)
    check_parity(torch, lambda t: F.affine_grid(t, size, align_corners=align_corners),
                 lambda t: tf.affine_grid(t, size, align_corners=align_corners), [theta], grad=(0,))  # fmt: skip
    theta3 = rng.normal(size=(2, 3, 4))
    check_parity(
        torch,
        lambda t: F.affine_grid(t, (2, 1, 3, 4, 5), align_corners=align_corners),
        lambda t: tf.affine_grid(t, (2, 1, 3, 4, 5), align_corners=align_corners),
        [theta3],
        grad=(0,),
    )
    x = rng.normal(size=size)
    grid = rng.uniform(-1.3, 1.3, size=(2, 4, 7, 2))  # partly outside the image
    for mode in ("bilinear", "nearest"):
        for padding_mode in ("zeros", "border", "reflection"):
            check_parity(torch,
                         lambda a, g: F.grid_sample(a, g, mode, padding_mode, align_corners),
                         lambda a, g: tf.grid_sample(a, g, mode, padding_mode, align_corners),
                         [x, grid], grad=(0, 1) if mode == "bilinear" else (0,))  # fmt: skip


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss_matches_torch(torch, reduction):
    x = rng.normal(size=(3, 5))
    target = np.array([[3, 0, -1, 1, 1], [0, 1, 2, 3, 4], [-1, 2, 0, 0, 0]])
    check_parity(torch, lambda a: F.multilabel_margin_loss(a, kiln.tensor(target), reduction=reduction),
                 lambda a: torch.nn.functional.multilabel_margin_loss(a, torch.tensor(target), reduction=reduction),
                 [x], grad=(0,))  # fmt: skip
    check_parity(torch, lambda a: nn_loss(a), lambda a: torch.nn.MultiLabelMarginLoss()(a, torch.tensor(target[0])),
                 [x[0]], grad=(0,))  # fmt: skip


def nn_loss(a):
    return kiln.nn.MultiLabelMarginLoss()(a, kiln.tensor(np.array([3, 0, -1, 1, 1])))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
def test_ctc_loss_matches_torch(torch, reduction, layout):
    steps, n, classes = 12, 4, 5
    logits = rng.normal(size=(steps, n, classes))
    lengths = [4, 2, 0, 3]
    padded = np.array([[1, 2, 2, 3], [4, 1, 0, 0], [0, 0, 0, 0], [3, 3, 1, 0]])  # repeats need a blank between
    targets = padded if layout == "padded" else np.concatenate([padded[i, :k] for i, k in enumerate(lengths)])
    in_lens = [12, 9, 5, 7]
    for blank in (0, 4) if layout == "padded" else (0,):
        tgt = np.where(padded == blank, (blank + 1) % classes, padded) if blank else targets
        # Gradients are compared for the logits under log_softmax: PyTorch's backward reports, for
        # log_probs, softmax - posterior (the logits' gradient, assuming log_softmax), kiln the true one.
        check_parity(torch,
                     lambda a: F.ctc_loss(kiln.log_softmax(a, -1), kiln.tensor(tgt), kiln.tensor(in_lens), lengths,
                                          blank, reduction),
                     lambda a: torch.nn.functional.ctc_loss(a.log_softmax(-1), torch.tensor(tgt),
                                                            torch.tensor(in_lens), torch.tensor(lengths), blank,
                                                            reduction),
                     [logits], grad=(0,), rtol=1e-7, atol=1e-9)  # fmt: skip


def test_ctc_loss_infeasible_and_gradcheck(torch):
    # 3 labels with a repeat need 4 steps; 2 steps make the loss infinite (zero_infinity makes it 0).
    logits = rng.normal(size=(2, 1, 3))
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    args = (kiln.tensor(np.array([[1, 1, 2]])), [2], [3])
    assert np.isinf(F.ctc_loss(kiln.tensor(log_probs), *args, reduction="sum").item())
    for zero_infinity in (True,):
        check_parity(
            torch,
            lambda a: F.ctc_loss(a, *args, zero_infinity=zero_infinity),
            lambda a: torch.nn.functional.ctc_loss(a, torch.tensor([[1, 1, 2]]), [2], [3], zero_infinity=zero_infinity),
            [log_probs],
            grad=(0,),
        )
    (x,) = leaves(rng.normal(size=(6, 2, 4)))
    tgt = kiln.tensor(np.array([[1, 2], [3, 3]]))
    assert kiln.autograd.gradcheck(lambda a: F.ctc_loss(kiln.log_softmax(a, -1), tgt, [6, 5], [2, 2]), (x,))
    assert kiln.nn.CTCLoss(blank=0)(kiln.log_softmax(x, -1), tgt, [6, 5], [2, 2]).shape == ()


def test_kl_div_of_a_negative_or_nan_target_is_nan_as_pytorch(torch):
    """The pointwise loss is xlogy(target, target) - target * input: 0 at a zero target, nan below
    zero (kiln's where(target > 0, ...) gave a finite loss for a negative target)."""
    logp = np.log(np.array([[0.2, 0.5, 0.3, 0.4]]))
    target = np.array([[-0.1, 0.0, 1.1, np.nan]])
    for reduction in ("none", "sum", "batchmean"):
        got = F.kl_div(kiln.from_numpy(logp), kiln.from_numpy(target), reduction=reduction)
        expected = torch.nn.functional.kl_div(torch.from_numpy(logp), torch.from_numpy(target), reduction=reduction)
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
