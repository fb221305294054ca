"""Max pooling on the arrays (``nn/_pooling_arrays.py``): the same maxima, indices and gradients as
the ops (``_pooling._MaxOfWindows``) bit for bit -- NaN, -0.0, ties, an infinite gradient --
over strides, padding, dilation, ceil_mode, 1-3 spatial dims, float64 and strided inputs; and
PyTorch's; the ops under create_graph and profiles."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.nn import _pooling, _pooling_arrays

F = kiln.nn.functional
POOLS = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
CASES = [  # (input shape, kwargs)
    ((4, 3, 8, 10), {"kernel_size": 2}),
    ((2, 3, 9, 11), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((2, 2, 9, 9), {"kernel_size": 2, "stride": 1, "dilation": 2}),
    ((2, 2, 7, 8), {"kernel_size": (2, 3), "stride": (2, 1), "ceil_mode": True}),
    ((3, 2, 11), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((2, 2, 4, 6, 5), {"kernel_size": 2, "stride": (2, 2, 1)}),
    ((2, 3, 5, 5), {"kernel_size": 4, "stride": 1, "padding": 2}),  # 16 offsets: two bytes of bits
]


def _input(shape, dtype, special: bool, strided: bool):
    rng = np.random.default_rng(0)
    a = rng.integers(-3, 4, size=shape).astype(dtype)  # ties in most windows
    if special:
        flat = a.reshape(-1)
        flat[::7], flat[3::11], flat[5::13] = np.nan, -0.0, -np.inf
    if strided:
        a = np.ascontiguousarray(np.swapaxes(a, 0, 1)).swapaxes(0, 1)  # channel-major memory
    return a


def _run(array, seed, kwargs, ops: bool, monkeypatch):
    if ops:
        monkeypatch.setattr(_pooling, "max_pool_on_arrays", lambda *args: None)
    x = kiln.from_numpy(array.copy(order="K")).requires_grad_()
    out, index = POOLS[array.ndim - 2](x, return_indices=True, **kwargs)
    out.backward(kiln.from_numpy(seed(out.shape)))
    monkeypatch.undo()
    return out, index, x.grad


@pytest.mark.parametrize("shape, kwargs", CASES)
@pytest.mark.parametrize("dtype, special, strided", [(np.float32, False, False), (np.float32, True, True),
                                                     (np.float64, True, False)])  # fmt: skip
def test_on_the_arrays_equals_the_ops_bit_for_bit(monkeypatch, shape, kwargs, dtype, special, strided):
    array = _input(shape, dtype, special, strided)
    rng = np.random.default_rng(1)

    def seed(s):
        g = rng.standard_normal(s).astype(dtype)
        if special:
            g.reshape(-1)[::5] = np.inf  # (a product by a mask would make NaN of the zeros)
            g.reshape(-1)[1::9] = -0.0
        return g

    ours = _run(array, seed, kwargs, False, monkeypatch)
    rng = np.random.default_rng(1)
    theirs = _run(array, seed, kwargs, True, monkeypatch)
    assert type(ours[0].grad_fn).__name__ == "MaxPoolBackward"
    assert type(theirs[0].grad_fn).__name__ != "MaxPoolBackward"
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.detach().numpy().view(f"u{a.element_size()}"),
                                      b.detach().numpy().view(f"u{b.element_size()}"))  # fmt: skip


def test_matches_pytorch_with_nan(torch):
    rng = np.random.default_rng(3)
    # no ties and at most one NaN a window: PyTorch takes the last NaN of a window where kiln (in both
    # paths) takes the first, and breaks ties its own way where windows overlap
    array = rng.permutation(4 * 3 * 9 * 9).astype(np.float32).reshape(4, 3, 9, 9)
    array.reshape(-1)[::37] = np.nan
    kwargs = {"kernel_size": 3, "stride": 2, "padding": 1}
    g = np.random.default_rng(2).standard_normal((4, 3, 5, 5)).astype(np.float32)
    x, t = kiln.from_numpy(array.copy()).requires_grad_(), torch.tensor(array, requires_grad=True)
    out, index = F.max_pool2d(x, return_indices=True, **kwargs)
    ref, ref_index = torch.nn.functional.max_pool2d(t, return_indices=True, **kwargs)
    out.backward(kiln.from_numpy(g))
    ref.backward(torch.tensor(g))
    np.testing.assert_array_equal(out.detach().numpy(), ref.detach().numpy())
    np.testing.assert_array_equal(index.numpy(), ref_index.numpy())
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-6, atol=1e-6)  # (overlaps: sums' order)


def test_the_backward_of_the_backward_runs_the_ops_and_is_differentiable(monkeypatch):
    x = kiln.randn(2, 2, 6, 6, dtype=kiln.float64, requires_grad=True)
    g = kiln.randn(2, 2, 3, 3, dtype=kiln.float64, requires_grad=True)

    def second_order():
        out = F.max_pool2d(x, 3, stride=2, padding=1)
        (gx,) = kiln.autograd.grad(out, x, g, create_graph=True)
        (gg,) = kiln.autograd.grad((gx * gx).sum(), g)  # 2 gx at each window's maximum
        return type(out.grad_fn).__name__, gx.detach().numpy(), gg.numpy()

    name, gx, gg = second_order()
    monkeypatch.setattr(_pooling, "max_pool_on_arrays", lambda *args: None)
    ops_name, ops_gx, ops_gg = second_order()
    assert name == "MaxPoolBackward" and ops_name != name
    np.testing.assert_array_equal(gx, ops_gx)
    np.testing.assert_allclose(gg, ops_gg, rtol=1e-12)
    assert np.abs(gg).sum() > 0


def test_a_profile_sees_the_ops_and_integers_take_them():
    x = kiln.randn(2, 2, 4, 4, requires_grad=True)
    with kiln.profiler.profile() as prof:
        F.max_pool2d(x, 2).sum().backward()
    assert "maximum" in [e.name for e in prof.events()]
    assert _pooling_arrays.max_pool_on_arrays(kiln.ones(1, 1, 2, 2, dtype=kiln.int32), (2, 2), (2, 2), (1, 1),
                                              ((0, 0), (0, 0)), (1, 1)) is None  # fmt: skip
    np.testing.assert_array_equal(F.max_pool2d(kiln.arange(16).reshape(1, 1, 4, 4), 2).numpy(), [[[[5, 7], [13, 15]]]])


def test_larger_windows_take_the_ops():
    x = kiln.randn(1, 1, 6, 6, requires_grad=True)
    out = F.max_pool2d(x, 5, stride=1)  # 25 offsets: more than MAX_OFFSETS bits
    assert type(out.grad_fn).__name__ != "MaxPoolBackward"
    np.testing.assert_array_equal(out.detach().numpy(), F.max_pool2d(x.detach(), 5, stride=1).numpy())


def test_a_second_backward_says_the_graph_was_freed():
    out = F.max_pool2d(kiln.randn(1, 2, 4, 4, requires_grad=True), 2).sum()
    out.backward(retain_graph=True)
    out.backward()  # retained: runs again
    with pytest.raises(RuntimeError, match="second time \\(through MaxPoolBackward\\)"):
        out.backward()
