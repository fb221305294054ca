"""conv2d's Winograd paths (F(2x2, 3x3) and F(4x4, 3x3), ``kiln/nn/_conv.py``) against PyTorch's
convolution: values and all three gradients in float64 and float32 (each variant at its own
precision), odd planes and every padding, gradients by finite differences and gradients of
gradients, the switches in ``kiln.backends.cpu``, and compiled against eager."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.nn import _conv
from tests.conftest import assert_close
from tests.nn.helpers import leaves

#: (N, C, K, H, W, padding): planes even and odd, tiles overhanging, one tile, more than one unit
SHAPES = [
    (2, 16, 16, 8, 8, 1),
    (3, 17, 20, 7, 9, 1),
    (2, 16, 24, 11, 10, 0),
    (1, 32, 16, 4, 4, 1),
    (2, 16, 16, 3, 3, 0),
    (2, 16, 16, 13, 17, 2),
    (4, 24, 16, 16, 16, 1),
]
#: float32 (rtol, atol as a fraction of the tensor's largest value) against float64 PyTorch
F32 = {"f2": (1e-5, 2e-6), "f4": (1e-4, 5e-5)}


@contextlib.contextmanager
def variant(name: str):
    """The conv2d algorithm: f4, f2, direct (the conv primitive) or im2col."""
    cpu = kiln.backends.cpu
    saved = (cpu.winograd, cpu.winograd_f4, cpu.direct_conv)
    cpu.winograd, cpu.winograd_f4, cpu.direct_conv = name in ("f2", "f4"), name == "f4", name == "direct"
    try:
        yield
    finally:
        cpu.winograd, cpu.winograd_f4, cpu.direct_conv = saved


def _chosen(x, w, padding):
    return _conv._winograd_variant(x, w, ((padding, padding),) * 2, (1, 1), (1, 1), 1)


def _conv_and_gradients(lib, arrays, padding, dtype, upstream):
    """conv2d(x, weight, bias) and the three gradients of <conv, upstream>, as float64 numpy arrays."""
    tensors = [lib.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    out = lib.nn.functional.conv2d(*tensors, padding=padding)
    out.backward(lib.tensor(upstream.astype(dtype)))
    return [t.detach().numpy().astype(np.float64) for t in (out, *(t.grad for t in tensors))]


@pytest.mark.parametrize("name", ["f2", "f4"])
@pytest.mark.parametrize("n, c, k, h, w, padding", SHAPES, ids=str)
def test_winograd_conv2d_matches_torch(torch, name, n, c, k, h, w, padding):
    rng = np.random.default_rng(h * w + c)
    arrays = [rng.normal(size=(n, c, h, w)), rng.normal(size=(k, c, 3, 3)) / np.sqrt(9 * c), rng.normal(size=k)]
    upstream = rng.normal(size=(n, k, h + 2 * padding - 2, w + 2 * padding - 2))
    expected = _conv.F4 if name == "f4" and min(upstream.shape[2:]) >= _conv.F4_MIN_SIDE else _conv.F2
    reference = _conv_and_gradients(torch, arrays, padding, np.float64, upstream)
    with variant(name):
        assert _chosen(kiln.from_numpy(arrays[0]), kiln.from_numpy(arrays[1]), padding) is expected
        for dtype, (rtol, scale) in ((np.float64, (1e-10, 1e-12)), (np.float32, F32[name])):
            got = _conv_and_gradients(kiln, arrays, padding, dtype, upstream)
            for what, a, b in zip(("output", "input grad", "weight grad", "bias grad"), got, reference, strict=True):
                # errors scale with the tensor's largest values (Winograd's sums), not each element
                np.testing.assert_allclose(a, b, rtol=rtol, atol=scale * np.abs(b).max(), err_msg=f"{what} {dtype}")


@pytest.mark.parametrize("name", ["f2", "f4"])
def test_winograd_gradients_by_finite_differences(name, monkeypatch):
    monkeypatch.setattr(_conv, "WINOGRAD_MIN_CHANNELS", 2)  # small enough for finite differences
    monkeypatch.setattr(_conv, "F4_MIN_SIDE", 4)
    rng = np.random.default_rng(0)
    x, weight = leaves(rng.normal(size=(2, 3, 9, 8)), rng.normal(size=(2, 3, 3, 3)) / 5)
    with variant(name):
        assert _chosen(x, weight, 1) is (_conv.F4 if name == "f4" else _conv.F2)
        conv = lambda a, b: F.conv2d(a, b, padding=1)  # noqa: E731
        assert kiln.autograd.gradcheck(conv, [x, weight])
        assert kiln.autograd.gradgradcheck(conv, [x, weight])


def test_switches_choose_the_algorithm():
    x, w = kiln.randn(1, 16, 20, 20), kiln.randn(16, 16, 3, 3)
    with variant("f4"):
        assert _chosen(x, w, 1) is _conv.F4
        assert _chosen(x, w[:, :, :, :2], 1) is None  # not 3x3
        assert _chosen(x[:, :8], w[:8, :8], 1) is None  # too few channels
        assert _chosen(x.double(), w.double(), 1) is _conv.F4
        assert _chosen(x.half(), w.half(), 1) is None
        assert _chosen(x[:, :, :12, :12], w, 1) is _conv.F2  # a plane under F4_MIN_SIDE
    with variant("f2"):
        assert _chosen(x, w, 1) is _conv.F2
    with variant("im2col"):
        assert _chosen(x, w, 1) is None
    for name in ("f2", "f4", "direct", "im2col"):  # traced: the graph shows which
        with variant(name):
            compiled = kiln.compile(lambda a: F.conv2d(a, w, padding=1))
            compiled(x)
            graph = str(compiled.graph)
        assert ("tile_transform" in graph) == (name in ("f2", "f4"))
        assert ("unfold" in graph) == (name == "im2col") and (" conv(" in graph) == (name == "direct")


@pytest.mark.parametrize("name", ["f2", "f4"])
def test_compiled_winograd_step_equals_eager_over_calls(name):
    rng = np.random.default_rng(1)
    with variant(name):
        conv = kiln.nn.Conv2d(16, 24, 3, padding=1)
        x = kiln.from_numpy(rng.standard_normal((3, 16, 18, 17)).astype(np.float32))  # F4 from 16

        def step(x):
            x = x.requires_grad_()
            y = kiln.nn.functional.relu(conv(x))
            (y * y).sum().backward()
            return y.detach(), x.grad

        compiled = kiln.compile(step)
        for _ in range(3):
            conv.zero_grad()
            got = (*compiled(x.detach().clone()), conv.weight.grad, conv.bias.grad)
            conv.zero_grad()
            want = (*step(x.detach().clone()), conv.weight.grad, conv.bias.grad)
            rtol, scale = F32[name]
            for a, b in zip(got, want, strict=True):
                assert_close(a, b, rtol=rtol, atol=scale * float(b.abs().max()))
        graph = str(compiled.graph)
        assert "tile_transform" in graph and "untile_transform" in graph and "unfold" not in graph


def test_untile_of_tiles_that_do_not_match_the_size_is_refused():
    v = kiln.randn(16, 2, 2, 3)  # 2x3 tiles of 2: a 4x6 plane, not 8x6
    with pytest.raises(RuntimeError, match=r"expected \(16, \*batch, 4, 3\) for size \(8, 6\)"):
        kiln.untile_transform(v, (8, 6), _conv.F2.output, 2)
    compiled = kiln.compile(lambda t: kiln.untile_transform(t, (8, 6), _conv.F2.output, 2))
    with pytest.raises(RuntimeError, match=r"expected \(16, \*batch, 4, 3\)"):
        compiled(v)
