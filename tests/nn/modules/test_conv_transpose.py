"""ConvTranspose2d / conv_transpose2d parity with PyTorch (outputs, input and parameter gradients)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.nn.modules.conv_transpose import conv_transpose2d
from tests.conftest import assert_close, to_torch
from tests.nn.modules.helpers import module_pair

RTOL, ATOL = 1e-4, 1e-5

CASES = [
    ((2, 3, 3), {}, (2, 2, 4, 5)),
    ((2, 4, (3, 2)), {"stride": 2, "padding": 1, "output_padding": 1}, (2, 2, 5, 4)),
    ((4, 6, 3), {"stride": (2, 3), "groups": 2, "bias": False}, (1, 4, 3, 3)),
    ((2, 2, 3), {"stride": 2, "padding": 3, "dilation": 2, "output_padding": 1}, (2, 2, 6, 6)),
    ((3, 3, 2), {"groups": 3, "padding": (0, 1)}, (3, 4, 4)),  # unbatched
    ((6, 4, 4), {"stride": 2, "padding": 1, "bias": False}, (3, 6, 4, 4)),  # DCGAN's generator
    ((5, 6, 4), {}, (3, 5, 1, 1)),  # noise to a 4x4 plane
    ((4, 6, 3), {"stride": 2, "padding": 1, "groups": 2, "dilation": 2}, (2, 4, 3, 4)),
    (
        (2, 3, 2),
        {"stride": 1, "padding": 1, "output_padding": 1, "dilation": 2},
        (2, 2, 3, 3),
    ),  # output_padding >= stride
]


@pytest.mark.parametrize(("args", "kwargs", "shape"), CASES)
def test_conv_transpose2d_matches_torch(torch, args, kwargs, shape):
    tmod, kmod = module_pair(torch, "ConvTranspose2d", *args, **kwargs)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    kx, tx = kiln.from_numpy(x.copy()).requires_grad_(), to_torch(torch, x).requires_grad_()
    kout, tout = kmod(kx), tmod(tx)
    assert tuple(kout.shape) == tuple(tout.shape)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    g = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    kout.backward(kiln.from_numpy(g.copy()))
    tout.backward(to_torch(torch, g))
    assert_close(kx.grad, tx.grad, rtol=RTOL, atol=ATOL)
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        assert_close(p.grad, tparams[key].grad, rtol=RTOL, atol=ATOL)


def test_hand_computed_stride_two():
    # A 2x2 input with a 2x2 ones kernel at stride 2 tiles each input value into its own 2x2 block.
    x = kiln.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    out = conv_transpose2d(x, kiln.ones(1, 1, 2, 2), stride=2)
    expected = np.array([[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]], dtype=np.float32)
    assert_close(out, expected[None, None], rtol=0, atol=0)


def test_gradcheck_float64():
    rng = np.random.default_rng(1)
    x = kiln.from_numpy(rng.standard_normal((1, 2, 3, 3))).requires_grad_()
    w = kiln.from_numpy(rng.standard_normal((2, 1, 2, 2))).requires_grad_()
    b = kiln.from_numpy(rng.standard_normal(2)).requires_grad_()
    assert kiln.autograd.gradcheck(lambda *a: conv_transpose2d(*a, stride=2, padding=1, groups=2), (x, w, b))


def test_errors_and_repr():
    with pytest.raises(RuntimeError, match="output padding must be smaller"):
        conv_transpose2d(kiln.randn(1, 1, 3, 3), kiln.randn(1, 1, 3, 3), stride=1, output_padding=1)
    with pytest.raises(RuntimeError, match="expected input with 2 channels"):
        conv_transpose2d(kiln.randn(1, 3, 3, 3), kiln.randn(2, 1, 3, 3))
    with pytest.raises(ValueError, match=r"in_channels \(3\) must be divisible by groups \(2\)"):
        nn.ConvTranspose2d(3, 4, 3, groups=2)
    assert repr(nn.ConvTranspose2d(2, 4, 3, stride=2, output_padding=1)) == (
        "ConvTranspose2d(2, 4, kernel_size=(3, 3), stride=(2, 2), output_padding=(1, 1))"
    )


def test_a_strided_transposed_convolution_multiplies_its_input_not_the_spread_input():
    """Stride 2: one product of the input's pixels, (C_out * k * k, C_in) @ (C_in, N * H * W), summed
    into place by fold_windows; the spread input (3/4 zeros, padded) multiplied 4x the work."""
    x, w = kiln.randn(2, 6, 4, 4), kiln.randn(6, 3, 4, 4)
    with kiln.profiler.profile(record_shapes=True) as prof:
        conv_transpose2d(x, w, stride=2, padding=1)
    products = [tuple(map(tuple, e.shapes)) for e in prof.events() if e.name == "matmul"]
    assert products == [((1, 48, 6), (1, 6, 32))]
    assert "pad" not in {e.name for e in prof.events()}


@pytest.mark.parametrize("d", [1, 3])
def test_strided_transposed_convolutions_of_other_dims_match_torch(torch, d):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, *(3,) * d)).astype(np.float32)
    w = rng.standard_normal((4, 2, *(3,) * d)).astype(np.float32)
    fn = getattr(kiln.nn.functional, f"conv_transpose{d}d")
    tfn = getattr(torch.nn.functional, f"conv_transpose{d}d")
    kx, kw = kiln.from_numpy(x.copy()).requires_grad_(), kiln.from_numpy(w.copy()).requires_grad_()
    tx, tw = to_torch(torch, x).requires_grad_(), to_torch(torch, w).requires_grad_()
    kout, tout = fn(kx, kw, stride=2, padding=1, output_padding=1), tfn(tx, tw, stride=2, padding=1, output_padding=1)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    g = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    kout.backward(kiln.from_numpy(g.copy()))
    tout.backward(to_torch(torch, g))
    assert_close(kx.grad, tx.grad, rtol=RTOL, atol=ATOL)
    assert_close(kw.grad, tw.grad, rtol=RTOL, atol=ATOL)


def test_a_compiled_strided_transposed_convolution_equals_eager():
    rng = np.random.default_rng(3)
    x = kiln.from_numpy(rng.standard_normal((2, 6, 4, 4)).astype(np.float32))
    w = kiln.from_numpy(rng.standard_normal((6, 3, 4, 4)).astype(np.float32)).requires_grad_()

    def step(x):
        y = conv_transpose2d(x, w, stride=2, padding=1)
        (y * y).sum().backward()
        return y.detach()

    compiled = kiln.compile(step)
    for _ in range(3):
        w.grad = None
        expected, expected_grad = step(x), w.grad.numpy().copy()
        w.grad = None
        got = compiled(x)
        assert_close(got, expected.numpy(), rtol=1e-5, atol=1e-5)
        assert_close(w.grad, expected_grad, rtol=1e-5, atol=1e-4)
