"""product_call.Product (kiln's own product kernel for the eager RNN layers' large products) and
eager_recurrence.matmul, its eager entry: equal to float64 numpy within a sum's rounding bound for
row-major and transposed A, strided rows, with and without accumulating, one row tile or many
split over threads; arrays it does not take are left untouched for numpy. BatchedProduct (stacks of
products: a transformer's attention) likewise, eager and compiled."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import product_ir
from kiln.codegen.llvm.product_call import BatchedProduct, Product
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
@pytest.mark.parametrize("b_rows", ["contiguous", "apart"])
def test_product_equals_numpy(two_threads, dtype, m, k, n, a_layout, accumulate, b_rows):
    rng = np.random.default_rng(m + 10 * k + 100 * n)
    if a_layout == "rows":
        a = rng.standard_normal((m, k)).astype(dtype)
    elif a_layout == "transposed":
        a = rng.standard_normal((k, m)).astype(dtype).T
    else:
        a = rng.standard_normal((m, k + 5)).astype(dtype)[:, 2 : k + 2]
    b = rng.standard_normal((k, n)).astype(dtype)
    if b_rows == "apart":  # B's rows read where they lie (a column slice: an LSTM's packed gate gradients)
        b = np.ascontiguousarray(np.pad(b, ((0, 0), (3, 4))))[:, 3 : n + 3]
    out_full = rng.standard_normal((m, n + 3)).astype(dtype)
    out, start = out_full[:, :n], out_full.copy()
    assert _product(dtype, n, accumulate)(a, b, out)
    _check(out, a, b, start[:, :n] if accumulate else None)
    np.testing.assert_array_equal(out_full[:, n:], start[:, n:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_layout", ["rows", "transposed"])
def test_every_count_of_rows_left_after_whole_tiles(dtype, a_layout):
    """m = 1 to 2 tiles of rows: the rows past the last whole tile run as tiles of 4, 2 and 1 rows
    (``small_gemm``), each at its rows of A and C, accumulating into C."""
    rng = np.random.default_rng(7)
    product = _product(dtype, 40, True)  # a whole column tile and a narrow one (float32)
    for m in range(1, 2 * 8 + 1):
        a = (
            rng.standard_normal((m, 9)).astype(dtype)
            if a_layout == "rows"
            else rng.standard_normal((9, m)).astype(dtype).T
        )
        b = rng.standard_normal((9, 40)).astype(dtype)
        out = rng.standard_normal((m + 2, 40)).astype(dtype)
        start = out.copy()
        assert product(a, b, out[1 : m + 1])
        _check(out[1 : m + 1], a, b, start[1 : m + 1])
        np.testing.assert_array_equal(out[[0, m + 1]], start[[0, m + 1]])  # the rows around untouched


def test_arrays_it_does_not_take_are_left_to_numpy():
    product = _product(np.float32, 8, False)
    a, b, out = np.ones((4, 3), np.float32), np.ones((3, 8), np.float32), np.zeros((4, 8), np.float32)
    assert not product(a, np.asfortranarray(b), out)  # B's rows must be contiguous
    assert not product(a, np.ones((3, 16), np.float32)[:, ::2], out)  # (not every other element)
    assert not product(a.astype(np.float64), b, out)  # another dtype
    assert not product(a, np.ones((3, 9), np.float32), np.zeros((4, 9), np.float32))  # another n
    assert not product(a, b, np.zeros((8, 4), np.float32).T)  # out's rows not contiguous
    assert not product(np.ones((4, 6), np.float32)[:, ::2], b, out)  # A neither row nor column contiguous
    both = np.zeros((8, 8), np.float32)
    assert not product(both[:, :3], b, both[:4])  # out overlaps A
    assert not out.any() and not both.any()
    with pytest.raises(ValueError, match="float32/float64"):
        product_ir.product_ir(kiln.int32, 8, False, "kiln_product_int32_n8")


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


def test_b_whose_rows_lie_apart_is_not_copied(eager_on, counted, monkeypatch):
    """A weight gradient's product, gates^T @ x with x a column slice of a wider buffer (the recurrence's
    backward packs its outputs): the kernel reads B's rows where they lie, no copy (``linalg.b_operand``)."""
    from kiln.ir.primitives import linalg  # noqa: PLC0415

    copies: list[tuple] = []
    monkeypatch.setattr(linalg, "c_order", lambda a: copies.append(a.shape) or np.ascontiguousarray(a))
    rng = np.random.default_rng(2)
    gates = rng.standard_normal((560, 768)).astype(np.float32)[:, :512]
    packed = rng.standard_normal((560, 1408)).astype(np.float32)
    x = packed[:, 128:256]
    y = eager_products.matmul(gates.T, x)
    assert counted == [True] and copies == []
    _check(y, gates.T, x)
    out = np.empty((512, 128), np.float32)
    assert eager_products.product(gates.T, x, out) is out and copies == []
    _check(out, gates.T, x)


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


# ----------------------------------------------------------------------------- stacks of products
_BATCHED: dict = {}


def _batched(dtype, n: int) -> BatchedProduct:
    key = (np.dtype(dtype), n)
    if key not in _BATCHED:
        _BATCHED[key] = BatchedProduct.build(dtype, n)
    return _BATCHED[key]


def _attention_operands(rng, dtype, batch: tuple[int, ...], m: int, k: int, n: int, a_layout: str):
    """A of ``a_layout`` ("rows": the heads of a packed projection, rows ``3 k`` apart; "transposed":
    a transposed stack) and B with rows ``2 n`` apart, both with batch strides of their own."""
    if a_layout == "rows":
        a = rng.standard_normal((*batch, m, 3 * k)).astype(dtype)[..., k : 2 * k]
    else:
        a = np.swapaxes(rng.standard_normal((*batch, k, m)).astype(dtype), -1, -2)
    b = rng.standard_normal((*batch, k, 2 * n)).astype(dtype)[..., :n]
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [(3,), (2, 3), (1, 4), (4, 1)])
@pytest.mark.parametrize(("m", "k", "n"), [(64, 32, 64), (13, 7, 40), (1, 5, 16)])
@pytest.mark.parametrize("a_layout", ["rows", "transposed"])
def test_batched_product_equals_numpy(two_threads, dtype, batch, m, k, n, a_layout):
    """Each matrix of the stack equals float64 numpy's product within a sum's rounding bound, whatever
    the strides of the batch dims; the output's columns past ``n`` are untouched."""
    rng = np.random.default_rng(m + 10 * k + 100 * n + len(batch))
    a, b = _attention_operands(rng, dtype, batch, m, k, n, a_layout)
    out_full = rng.standard_normal((*batch, m, n + 3)).astype(dtype)
    out, start = out_full[..., :n], out_full.copy()
    assert _batched(dtype, n)(a, b, out)
    for index in np.ndindex(*batch):
        _check(out[index], a[index], b[index])
    np.testing.assert_array_equal(out_full[..., n:], start[..., n:])


def test_batched_product_declines_what_it_does_not_take():
    product = _batched(np.float32, 16)
    a, b = np.ones((2, 4, 3), np.float32), np.ones((2, 3, 16), np.float32)
    out = np.zeros((2, 4, 16), np.float32)
    assert not product(a, np.ones((1, 3, 16), np.float32), out)  # batch dims that differ (a broadcast)
    assert not product(a, np.swapaxes(np.ones((2, 16, 3), np.float32), -1, -2), out)  # B's rows not contiguous
    assert not product(a.astype(np.float64), b, out)  # another dtype
    assert not product(np.ones((1, 2, 2, 4, 3), np.float32), np.ones((1, 2, 2, 3, 16), np.float32),
                       np.zeros((1, 2, 2, 4, 16), np.float32))  # three batch dims  # fmt: skip
    assert not product(np.ones((2, 4, 6), np.float32)[..., ::2], b, out)  # A neither row nor column contiguous
    both = np.zeros((2, 4, 32), np.float32)
    assert not product(both[..., :3], b, both[..., 16:])  # out overlaps A
    assert not out.any() and not both.any()


@pytest.fixture
def counted_batched(monkeypatch):
    """The batched kernel's calls: whether each took its arrays."""
    calls: list[bool] = []
    original = BatchedProduct.__call__

    def count(self, *arrays):
        calls.append(original(self, *arrays))
        return calls[-1]

    monkeypatch.setattr(BatchedProduct, "__call__", count)
    return calls


def test_attention_products_run_the_batched_kernel_eager_and_compiled(eager_on, counted_batched):
    """A transformer's attention, q k^T (the key transposed: copied row-major for the kernel) and the
    weights times v, on the batched kernel in eager calls and in a compiled program's, equal to numpy
    over several calls; a product of broadcast batch dims stays on numpy."""
    rng = np.random.default_rng(2)
    qkv = kiln.from_numpy(rng.standard_normal((4, 64, 3 * 128)).astype(np.float32))

    def attention(x):
        q, k, v = (t.reshape(4, 64, 4, 32).transpose(1, 2) for t in x.split(128, dim=-1))
        return ((q @ k.transpose(-1, -2)) * 0.1).softmax(-1) @ v

    packed = qkv.numpy().reshape(4, 64, 3, 4, 32).transpose(2, 0, 3, 1, 4).astype(np.float64)
    scores = packed[0] @ np.swapaxes(packed[1], -1, -2) * 0.1
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = weights / weights.sum(-1, keepdims=True) @ packed[2]
    np.testing.assert_allclose(attention(qkv).numpy(), expected, rtol=1e-4, atol=1e-5)
    assert counted_batched == [True, True]
    compiled = kiln.compile(attention, wait=True)
    for _ in range(3):
        np.testing.assert_allclose(compiled(qkv).numpy(), expected, rtol=1e-4, atol=1e-5)
    assert counted_batched.count(True) >= 6 and all(counted_batched)
    counted_batched.clear()
    broadcast = kiln.from_numpy(rng.standard_normal((1, 4, 64, 32)).astype(np.float32))
    scores = kiln.matmul(kiln.from_numpy(packed[0].astype(np.float32)), broadcast.transpose(-1, -2))
    assert counted_batched == []
    np.testing.assert_allclose(scores.numpy(), packed[0] @ np.swapaxes(broadcast.numpy(), -1, -2), rtol=1e-4,
                               atol=1e-4)  # fmt: skip


WARM_PRODUCT = """
import sys
import numpy as np
from kiln.codegen.llvm.product_call import BatchedProduct, Product
rng = np.random.default_rng(0)
a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 48)).astype(np.float32)
out = np.zeros((40, 48), np.float32)
assert Product.build(np.float32, 48, False)(a, b, out)
stack = np.zeros((2, 40, 48), np.float32)
assert BatchedProduct.build(np.float32, 48)(np.stack([a, a]), np.stack([b, b]), stack)
np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(stack, np.stack([out, out]), rtol=1e-6, atol=1e-6)
print("llvm" if "llvmlite.binding" in sys.modules else "no llvm",
      "ir" if "kiln.codegen.llvm.product_ir" in sys.modules else "no ir")
"""


def test_a_warm_process_loads_its_product_kernels_without_llvm(second_process):
    """A product kernel's object code is cached under its name: a second process on the cache makes no
    IR and loads no LLVM for it (the first eager product of a warm DCGAN took 46 ms of CPU beside its
    traced call), and computes the same products."""
    assert second_process(WARM_PRODUCT) == ["llvm ir", "no llvm no ir"]
