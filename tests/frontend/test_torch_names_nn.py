"""``torch.conv2d``, ``torch.batch_norm``, ``torch.embedding``... (ATen's signatures over
nn.functional) and the top-level in-place functions (``torch.exp_(t)``), against torch."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.autograd import gradcheck

RNG = np.random.default_rng(0)


def _both(torch, *arrays):
    return [kiln.from_numpy(a.copy()) for a in arrays], [torch.from_numpy(a.copy()) for a in arrays]


def _close(ours, theirs, rtol=1e-10, atol=1e-12):
    if isinstance(theirs, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(theirs)
        for o, t in zip(ours, theirs, strict=True):
            _close(o, t, rtol, atol)
        return
    assert tuple(ours.shape) == tuple(theirs.shape) and ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=rtol, atol=atol)


def _randn(*shape):
    return RNG.standard_normal(shape)


class _At:
    """A placeholder in a case's arguments: the array at this position, given as a tensor."""

    def __init__(self, index: int):
        self.index = index


def _call(fn, tensors, args, kwargs):
    if any(isinstance(a, _At) for a in args):  # the arrays go where the placeholders say
        args = tuple(tensors[a.index] if isinstance(a, _At) else a for a in args)
        return fn(*args, **kwargs)
    return fn(*tensors, *args, **kwargs)


# (name, arrays, positional arguments after the arrays, keyword arguments): the same call on both sides
CASES = [
    ("conv1d", [_randn(2, 3, 9), _randn(4, 3, 3), _randn(4)], (2, 1), {}),
    ("conv2d", [_randn(1, 2, 6, 6), _randn(4, 1, 3, 3)], (None, 1, 1, 1, 2), {}),
    ("conv3d", [_randn(1, 2, 4, 4, 4), _randn(3, 2, 2, 2, 2)], (), {"stride": 2}),
    ("conv_transpose1d", [_randn(2, 3, 5), _randn(3, 2, 3)], (None, 2, 1, 1), {}),
    ("conv_transpose2d", [_randn(1, 2, 4, 4), _randn(2, 3, 3, 3)], (), {"padding": 1}),
    ("conv_transpose3d", [_randn(1, 2, 3, 3, 3), _randn(2, 1, 2, 2, 2)], (), {}),
    ("batch_norm", [_randn(4, 3, 5), _randn(3), _randn(3), _randn(3), np.abs(_randn(3)) + 0.5],
     (False, 0.1, 1e-5, False), {}),
    ("batch_norm", [_randn(4, 3, 5), _randn(3), _randn(3), _randn(3), np.abs(_randn(3)) + 0.5],
     (True, 0.3, 1e-3, True), {}),
    ("layer_norm", [_randn(2, 3, 4)], ((3, 4),), {"eps": 1e-3}),
    ("group_norm", [_randn(2, 4, 5), _randn(4), _randn(4)], (_At(0), 2, _At(1), _At(2)), {}),
    ("instance_norm", [_randn(2, 3, 6), _randn(3), _randn(3)], (_At(0), _At(1), _At(2), None, None, True, 0.1, 1e-5,
                                                                False), {}),
    ("rms_norm", [_randn(2, 5), _randn(5)], (_At(0), [5], _At(1)), {}),
    ("max_pool1d", [_randn(2, 3, 9)], (3,), {}),
    ("max_pool2d", [_randn(1, 2, 7, 7)], (3, 2, 1, 1, True), {}),
    ("max_pool3d", [_randn(1, 1, 4, 5, 4)], ((2, 2, 2),), {"stride": 1}),
    ("avg_pool1d", [_randn(2, 3, 9)], (3, 2, 1, True, False), {}),
    ("adaptive_avg_pool1d", [_randn(2, 3, 9)], (4,), {}),
    ("adaptive_max_pool1d", [_randn(2, 3, 9)], (3,), {}),
    ("pixel_shuffle", [_randn(1, 8, 2, 3)], (2,), {}),
    ("pixel_unshuffle", [_randn(1, 2, 4, 6)], (2,), {}),
    ("channel_shuffle", [_randn(1, 6, 2, 2)], (3,), {}),
    ("prelu", [_randn(2, 3, 4), np.array([0.1, 0.2, 0.3])], (), {}),
    ("selu", [_randn(3, 4)], (), {}),
    ("celu", [_randn(3, 4)], (0.5,), {}),
    ("rrelu", [_randn(3, 4)], (0.1, 0.3), {}),  # training=False: the mean slope, deterministic
    ("threshold", [_randn(3, 4)], (0.2, -1.0), {}),
    ("hardshrink", [_randn(3, 4)], (0.3,), {}),
    ("bilinear", [_randn(2, 3), _randn(2, 4), _randn(5, 3, 4), _randn(5)], (), {}),
    ("pairwise_distance", [_randn(4, 3), _randn(4, 3)], (1.0, 1e-6, True), {}),
    ("kl_div", [_randn(3, 4), np.abs(_randn(3, 4))], (2,), {}),
    ("kl_div", [_randn(3, 4), _randn(3, 4)], (0,), {"log_target": True}),
    ("cosine_embedding_loss", [_randn(4, 3), _randn(4, 3), np.array([1.0, -1.0, 1.0, -1.0])], (0.1, 2), {}),
    ("margin_ranking_loss", [_randn(5), _randn(5), np.array([1.0, -1.0, 1.0, -1.0, 1.0])], (0.2,), {}),
    ("hinge_embedding_loss", [_randn(5), np.array([1.0, -1.0, 1.0, -1.0, 1.0])], (1.0, 0), {}),
    ("triplet_margin_loss", [_randn(4, 3), _randn(4, 3), _randn(4, 3)], (1.0, 2.0, 1e-6, True, 1), {}),
    ("poisson_nll_loss", [_randn(5), np.abs(_randn(5))], (True, True, 1e-8, 1), {}),
    ("poisson_nll_loss", [np.abs(_randn(5)), np.abs(_randn(5))], (False, False, 1e-8, 2), {}),
    ("binary_cross_entropy_with_logits", [_randn(3, 4), RNG.random((3, 4)), _randn(4), np.abs(_randn(4))], (0,), {}),
    ("binary_cross_entropy_with_logits", [_randn(3, 4), RNG.random((3, 4))], (), {}),
    ("constant_pad_nd", [_randn(2, 3)], ([1, 2, 0, 1], 2.5), {}),
    ("constant_pad_nd", [_randn(2, 3)], ([1, -1],), {}),
    ("dropout", [_randn(3, 4)], (0.5, False), {}),
    ("alpha_dropout", [_randn(3, 4)], (0.5, False), {}),
    ("feature_alpha_dropout", [_randn(3, 4)], (0.5, False), {}),
    ("feature_dropout", [_randn(3, 4, 2)], (0.5, False), {}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "arrays", "args", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_top_level_nn_names_match_torch(torch, name, arrays, args, kwargs):
    ours, theirs = _both(torch, *arrays)
    result = _call(getattr(kiln, name), ours, args, kwargs)
    expected = _call(getattr(torch, name), theirs, args, kwargs)
    _close(result, expected)
    if name == "batch_norm" and args[0]:  # the running statistics, updated in place
        _close(ours[3], theirs[3])
        _close(ours[4], theirs[4])


def test_embedding_takes_the_weight_first_and_embedding_bag_returns_four(torch):
    (w, idx, offsets), (tw, tidx, toffsets) = _both(torch, _randn(10, 3), np.array([1, 2, 4, 5, 4, 3, 2, 9]),
                                                    np.array([0, 4, 4]))  # fmt: skip
    _close(kiln.embedding(w, idx), torch.embedding(tw, tidx))
    _close(kiln.embedding(w, idx, 3), torch.embedding(tw, tidx, 3))
    for mode in (0, 1, 2):  # the empty middle bag too
        _close(kiln.embedding_bag(w, idx, offsets, False, mode), torch.embedding_bag(tw, tidx, toffsets, False, mode))


def test_losses_are_unreduced_by_default_as_torch_binds_them(torch):
    """ATen's schemas say Mean, but torch's Python binding passes 0 (none): ``torch.kl_div(a, b)``."""
    (a, b), (ta, tb) = _both(torch, _randn(4, 3), RNG.random((4, 3)))
    for name in ("kl_div", "hinge_embedding_loss", "binary_cross_entropy_with_logits"):
        _close(getattr(kiln, name)(a, b), getattr(torch, name)(ta, tb))
    _close(kiln.triplet_margin_loss(a, b, a), torch.triplet_margin_loss(ta, tb, ta))


def test_reduction_must_be_a_known_int():
    with pytest.raises(ValueError, match="reduction"):
        kiln.kl_div(kiln.zeros(2), kiln.zeros(2), 3)


def test_dropout_arguments_are_required_and_in_place_forms_write(torch):
    with pytest.raises(TypeError):
        kiln.dropout(kiln.ones(3))  # torch.dropout(input, p, train): p and train have no defaults
    kiln.manual_seed(0)
    x = kiln.ones(200, 4)
    out = kiln.dropout_(x, 0.5, True)
    assert out is x and set(np.unique(x.numpy())) <= {0.0, 2.0} and 0 < (x.numpy() == 0).sum() < 800
    y = kiln.ones(50, 6, 3)
    kiln.feature_dropout_(y, 0.5, True)
    channels = y.numpy()  # whole (sample, channel) rows dropped or kept
    assert (channels.min(-1) == channels.max(-1)).all() and set(np.unique(channels)) == {0.0, 2.0}
    z = kiln.ones(3)
    assert kiln.dropout_(z, 0.5, False) is z and z.numpy().tolist() == [1.0, 1.0, 1.0]


IN_PLACE = [("exp_", ()), ("abs_", ()), ("sigmoid_", ()), ("relu_", ()), ("clamp_", (-0.5, 0.5)), ("zero_", ()),
            ("fill_", (2.5,)), ("nan_to_num_", ()), ("selu_", ()), ("celu_", (0.5,)), ("threshold_", (0.1, 7.0)),
            ("square_", ()), ("trunc_", ()), ("logit_", (0.1,)), ("ldexp_", ())]  # fmt: skip


@pytest.mark.parametrize(("name", "args"), IN_PLACE, ids=[c[0] for c in IN_PLACE])
def test_top_level_in_place_functions_match_torch(torch, name, args):
    array = RNG.random((3, 4)) if name == "logit_" else _randn(3, 4)
    (x,), (tx,) = _both(torch, array)
    if name == "ldexp_":
        args = (kiln.tensor([1, 2, 3, 0]),)
        targs: tuple = (torch.tensor([1, 2, 3, 0]),)
    else:
        targs = args
    assert getattr(kiln, name)(x, *args) is x
    getattr(torch, name)(tx, *targs)
    _close(x, tx)


def test_gcd_and_lcm_in_place(torch):
    (a, b), (ta, tb) = _both(torch, np.array([12, -18, 0, 7]), np.array([8, 12, 5, 0]))
    for name in ("gcd_", "lcm_"):
        x, tx = a.clone(), ta.clone()
        assert getattr(kiln, name)(x, b) is x
        getattr(tx, name)(tb)
        _close(x, tx)


def test_top_level_forms_are_differentiable():
    x = kiln.tensor(_randn(2, 3, 5), requires_grad=True)
    w = kiln.tensor(_randn(4, 3, 2), requires_grad=True)
    gamma = kiln.tensor(_randn(3), requires_grad=True)
    assert gradcheck(lambda a, b: kiln.conv1d(a, b, None, 1, 1), (x, w), eps=1e-6, atol=1e-5, rtol=1e-4)
    assert gradcheck(lambda a, g: kiln.batch_norm(a, g, None, None, None, True, 0.1, 1e-5, False), (x, gamma),
                     eps=1e-6, atol=1e-5, rtol=1e-4)  # fmt: skip
    target = kiln.tensor(RNG.random((2, 3, 5)))
    assert gradcheck(lambda a: kiln.binary_cross_entropy_with_logits(a, target, None, None, 2), (x,),
                     eps=1e-6, atol=1e-5, rtol=1e-4)  # fmt: skip


def test_compiled_calls_equal_eager():
    def f(x, w, g):
        y = kiln.conv2d(x, w, None, 1, 1)
        y = kiln.batch_norm(y, g, None, None, None, True, 0.1, 1e-5, False)
        return kiln.max_pool2d(kiln.selu(y), 2), kiln.kl_div(kiln.log_softmax(y, 1), kiln.softmax(y, 1), 2)

    x, w, g = kiln.randn(2, 3, 6, 6), kiln.randn(4, 3, 3, 3), kiln.randn(4)
    compiled = kiln.compile(f)
    for _ in range(3):
        for a, b in zip(compiled(x, w, g), f(x, w, g), strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
