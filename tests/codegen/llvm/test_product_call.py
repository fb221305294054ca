"""product_call.Product (kiln's own product kernel for the eager RNN layers' large products) and
eager_recurrence.matmul, its eager entry: equal to float64 numpy within a sum's rounding bound for
row-major and transposed A, strided rows, with and without accumulating, one row tile or many
split over threads; arrays it does not take are left untouched for numpy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import product_call
from kiln.codegen.llvm.product_call import Product
from kiln.frontend import eager_kernels, eager_products
from kiln.runtime import threads

_BUILT: dict = {}


def _product(dtype, n: int, accumulate: bool) -> Product:
    key = (np.dtype(dtype), n, accumulate)
    if key not in _BUILT:
        _BUILT[key] = Product.build(dtype, n, accumulate)
    return _BUILT[key]


def _check(out, a, b, start=None):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    if start is not None:
        expected, scale = expected + start, scale + np.abs(start)
    bound = (a.shape[1] + 1) * np.finfo(out.dtype).eps * scale  # a sum of k + 1 rounded terms
    assert np.all(np.abs(out - expected) <= bound)


@pytest.fixture
def two_threads(monkeypatch):
    """Two threads, and every product split over them (the thresholds down to zero: the products run on
    the native pool where it exists)."""
    monkeypatch.setattr(threads, "PARALLEL_MIN_WORK_BYTES", 0)
    monkeypatch.setattr(threads, "NATIVE_MIN_WORK_BYTES", 0)
    monkeypatch.setattr(threads, "WAKE_MIN_WORK_BYTES", 0)
    before = kiln.get_num_threads()
    kiln.set_num_threads(2)
    yield
    kiln.set_num_threads(before)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("m", "k", "n"), [(560, 128, 512), (512, 560, 128), (13, 7, 51), (1, 1, 1), (0, 4, 8)])
@pytest.mark.parametrize("a_layout", ["rows", "transposed", "strided rows"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_product_equals_numpy(two_threads, dtype, m, k, n, a_layout, accumulate):
    rng = np.random.default_rng(m + 10 * k + 100 * n)
    if a_layout == "rows":
        a = rng.standard_normal((m, k)).astype(dtype)
    elif a_layout == "transposed":
        a = rng.standard_normal((k, m)).astype(dtype).T
    else:
        a = rng.standard_normal((m, k + 5)).astype(dtype)[:, 2 : k + 2]
    b = rng.standard_normal((k, n)).astype(dtype)
    out_full = rng.standard_normal((m, n + 3)).astype(dtype)
    out, start = out_full[:, :n], out_full.copy()
    assert _product(dtype, n, accumulate)(a, b, out)
    _check(out, a, b, start[:, :n] if accumulate else None)
    np.testing.assert_array_equal(out_full[:, n:], start[:, n:])


def test_arrays_it_does_not_take_are_left_to_numpy():
    product = _product(np.float32, 8, False)
    a, b, out = np.ones((4, 3), np.float32), np.ones((3, 8), np.float32), np.zeros((4, 8), np.float32)
    assert not product(a, np.asfortranarray(b), out)  # B must be C-contiguous
    assert not product(a.astype(np.float64), b, out)  # another dtype
    assert not product(a, np.ones((3, 9), np.float32), np.zeros((4, 9), np.float32))  # another n
    assert not product(a, b, np.zeros((8, 4), np.float32).T)  # out's rows not contiguous
    assert not product(np.ones((4, 6), np.float32)[:, ::2], b, out)  # A neither row nor column contiguous
    both = np.zeros((8, 8), np.float32)
    assert not product(both[:, :3], b, both[:4])  # out overlaps A
    assert not out.any() and not both.any()
    with pytest.raises(ValueError, match="float32/float64"):
        product_call.product_ir(kiln.int32, 8, False)


@pytest.fixture
def counted(monkeypatch):
    """The kernel's calls: whether each took its arrays."""
    calls: list[bool] = []
    original = Product.__call__

    def count(self, *arrays):
        calls.append(original(self, *arrays))
        return calls[-1]

    monkeypatch.setattr(Product, "__call__", count)
    return calls


def test_matmul_runs_the_kernel_with_eager_kernels_on(eager_on, counted):
    rng = np.random.default_rng(0)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((560, 128), (512, 128), (512,)))
    y = eager_products.matmul(x, w.T, bias)  # a transposed weight: copied C-contiguous for the kernel
    assert counted == [True]
    _check(y - bias, x, w.T)  # (bias added first: within the same bound)
    eager_kernels.set_enabled(False)
    np.testing.assert_array_equal(eager_products.matmul(x, w.T, bias), x @ w.T + bias)  # numpy's, exactly
    assert counted == [True]


def test_small_products_and_what_the_kernel_declines_stay_on_numpy(eager_on, counted):
    x, w = np.ones((8, 16), np.float32), np.ones((16, 8), np.float32)  # under MIN_MACS
    np.testing.assert_array_equal(eager_products.matmul(x, w), x @ w)
    big = (np.arange(600 * 128, dtype=np.float32).reshape(600, 128) / 1e4)[:, ::-1]  # negative strides: declined
    w = np.ones((128, 512), np.float32)
    np.testing.assert_array_equal(eager_products.matmul(big, w), big @ w)
    ints = np.ones((2, 2), np.int64)
    np.testing.assert_array_equal(eager_products.matmul(ints, ints), ints @ ints)
    assert counted == [False]


@pytest.mark.parametrize("stack", ["C order", "transposed (batch_first)"])
def test_the_matmul_primitive_runs_the_kernel_eager_and_compiled(eager_on, counted, stack):
    """The primitive's eager kernel (kiln.matmul, a Linear's product) and a compiled program's call of
    it ask the installed product first: a stack of rows times a weight's transpose, as a decoder."""
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((35, 16, 64)).astype(np.float32)
    x = kiln.from_numpy(rows if stack == "C order" else rows.transpose(1, 0, 2).copy()).transpose(0, 1)
    if stack == "C order":
        x = kiln.from_numpy(rows)
    w = kiln.from_numpy(rng.standard_normal((300, 64)).astype(np.float32))
    expected = x.numpy() @ w.numpy().T
    eager = kiln.matmul(x, w.T)
    assert counted == [True]
    compiled = kiln.compile(lambda a, b: kiln.matmul(a, b.T) * 2)
    for _ in range(2):
        np.testing.assert_allclose(compiled(x, w).numpy(), 2 * expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(eager.numpy(), expected, rtol=1e-4, atol=1e-4)
    assert counted == [True] * 3
