"""Small matrix products on one BLAS thread (``threads.run_blas_product``), eager and compiled."""

import numpy as np
import pytest

import kiln
from kiln.runtime import threads

SMALL = ((16, 128), (128, 512))  # 1M multiply-adds: the LSTM-sized product
LARGE = ((64, 512), (512, 512))  # 16M: worth a second thread
TINY = ((16, 51), (51, 204))  # 166K multiply-adds: an LSTMCell step's product, which OpenBLAS keeps on one thread


class FakeBlas:
    """Stands for OpenBLAS's thread-count functions: records every count set."""

    def __init__(self, threads_now: int) -> None:
        self.threads = threads_now
        self.sets: list[int] = []

    def get(self) -> int:
        return self.threads

    def set(self, n: int) -> None:
        self.sets.append(n)
        self.threads = n


@pytest.fixture
def fake_blas(monkeypatch):
    blas = FakeBlas(2)
    monkeypatch.setattr(threads._blas, "found", True)
    monkeypatch.setattr(threads._blas, "get_threads", blas.get)
    monkeypatch.setattr(threads._blas, "set_threads", blas.set)
    return blas


def _operands(shapes):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]


@pytest.mark.parametrize(
    ("a", "b", "macs"),
    [
        ((16, 128), (128, 512), 16 * 128 * 512),
        ((4, 16, 128), (128, 512), 4 * 16 * 128 * 512),  # a stack times a matrix: one product
        ((4, 16, 128), (4, 128, 512), 16 * 128 * 512),  # a batch: one product per matrix
        ((16, 128), (4, 128, 512), 16 * 128 * 512),
    ],
)
def test_matmul_macs_counts_the_multiply_adds_of_one_blas_call(a, b, macs):
    assert threads.matmul_macs(a, b) == macs


def test_a_small_product_runs_on_one_thread_and_the_count_is_restored(fake_blas):
    seen = []
    assert threads.run_blas_product(lambda x: seen.append(fake_blas.threads) or x, 1 << 20, 7) == 7
    assert seen == [1] and fake_blas.sets == [1, 2]


def test_a_large_product_keeps_the_blas_threads(fake_blas):
    seen = []
    threads.run_blas_product(lambda: seen.append(fake_blas.threads), threads.BLAS_MIN_PARALLEL_MACS)
    assert seen == [2] and fake_blas.sets == []


def test_one_blas_thread_already_is_left_alone(fake_blas):
    fake_blas.threads = 1
    threads.run_blas_product(lambda: None, 1)
    assert fake_blas.sets == []


def test_the_count_is_restored_when_the_product_raises(fake_blas):
    def fails():
        raise ValueError("shapes do not match")

    with pytest.raises(ValueError, match="shapes do not match"):
        threads.run_blas_product(fails, 1)
    assert fake_blas.threads == 2


def test_numpys_openblas_runs_a_small_product_on_one_thread():
    threads._find_blas()
    get, set_ = threads._blas.get_threads, threads._blas.set_threads
    if get is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS threadpoolctl finds")
    before = get()
    set_(2)
    try:
        a, b = _operands(SMALL)
        seen = []

        def product(x, y):
            seen.append(get())
            return x @ y

        np.testing.assert_allclose(threads.run_blas_product(product, 1 << 20, a, b), a @ b, rtol=1e-4, atol=1e-4)
        assert seen == [1] and get() == 2
    finally:
        set_(before)


@pytest.mark.parametrize(("shapes", "sets"), [(SMALL, [1, 2]), (LARGE, []), (TINY, [])])
def test_eager_matmul_mm_and_bmm(fake_blas, shapes, sets):
    a, b = _operands(shapes)
    out = kiln.from_numpy(a) @ kiln.from_numpy(b)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)
    assert fake_blas.sets == sets
    fake_blas.sets.clear()
    kiln.mm(kiln.from_numpy(a), kiln.from_numpy(b))
    kiln.bmm(kiln.from_numpy(a[None]), kiln.from_numpy(b[None]))
    assert fake_blas.sets == sets * 2


@pytest.mark.parametrize(
    ("a", "b", "splits"),
    [
        (*TINY, False),
        ((64, 64), (64, 64), False),  # 256K: OpenBLAS's own limit, included
        ((64, 64), (64, 65), True),
        ((4, 16, 51), (51, 204), True),  # a stack times a matrix: one product of 663K
        ((4, 16, 51), (4, 51, 204), False),  # a batch: four products of 166K
        ((16, 51), (51, 1), False),  # matrix-vector: a 16x51 matrix
        ((1, 100), (100, 100), True),  # a 100x100 matrix: gemv splits from 9216 elements
        ((96, 96), (96, 1), True),
    ],
)
def test_blas_splits_follows_openblas_own_one_thread_rule(a, b, splits):
    assert threads.blas_splits(a, b) is splits


@pytest.mark.parametrize(("shapes", "sets"), [(SMALL, [1, 2]), (LARGE, []), (TINY, [])])
def test_compiled_matmul(fake_blas, shapes, sets):
    a, b = (kiln.from_numpy(x) for x in _operands(shapes))
    product = kiln.compile(lambda x, y: (x @ y) * 2.0)
    product(a, b)  # traced (and run) on the first call
    fake_blas.sets.clear()
    for _ in range(2):
        out = product(a, b)
        np.testing.assert_allclose(out.numpy(), (a.numpy() @ b.numpy()) * 2.0, rtol=1e-5, atol=1e-5)
    assert fake_blas.sets == sets * 2


@pytest.mark.parametrize(("shapes", "sets"), [(SMALL, [1, 2]), (LARGE, []), (TINY, [])])
def test_eager_linear(fake_blas, shapes, sets):
    # (F.linear's own product path: the weight is (out, in), its transpose the product's B)
    a, b = _operands(shapes)
    out = kiln.nn.functional.linear(kiln.from_numpy(a), kiln.from_numpy(np.ascontiguousarray(b.T)))
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)
    assert fake_blas.sets == sets
