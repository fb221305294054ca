"""philox_call.Philox (random_bits' compiled draw) and eager_random, its entry: the numpy kernel's bits
exactly, for any seed and offset (a counter that carries into its second word or wraps), partial
last blocks and draws split over threads; eager draws and compiled programs' draws run it once it is
ready, and equal numpy's then too."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm.philox_call import UNIT_BLOCKS, Philox
from kiln.frontend import eager_random
from kiln.ir.primitives import random
from kiln.runtime import threads

_BUILT: list[Philox] = []


def _philox() -> Philox:
    if not _BUILT:
        _BUILT.append(Philox.build())
    return _BUILT[0]


def numpy_bits(seed: int, offset: int, n: int) -> np.ndarray:
    """The primitive's numpy kernel's draw, whatever is installed."""
    installed = random._bits[:]
    random.install_bits(None)
    try:
        return random._random_bits_eager(np, np.array([seed, offset], np.int64), shape=(n,))
    finally:
        random._bits[:] = installed


@pytest.fixture
def two_threads(monkeypatch):
    """Two threads, and every draw split over them (the thresholds down to zero)."""
    for name in ("PARALLEL_MIN_WORK_BYTES", "NATIVE_MIN_WORK_BYTES", "WAKE_MIN_WORK_BYTES"):
        monkeypatch.setattr(threads, name, 0)
    before = kiln.get_num_threads()
    kiln.set_num_threads(2)
    yield
    kiln.set_num_threads(before)


@pytest.mark.parametrize(
    ("seed", "offset", "n"),
    [
        (0, 0, 4),
        (0, 0, 1),
        (-1, 7, 6),  # every key bit set
        (42, (1 << 32) - 3, 41),  # the counter's low word carries into the high one
        (5, (1 << 63) - 2, 17),
        (9, -5, 1000),  # the offset's 64 bits wrap past zero
        (1234, 5678, 32 * 784 + 3),  # a partial last block
        (7, 3, 4 * UNIT_BLOCKS * 5 + 2),  # several units, a partial last block in the last unit
    ],
)
def test_draw_equals_the_numpy_kernel(two_threads, seed, offset, n):
    got = _philox()(seed, offset, n)
    assert got.dtype == np.int64 and got.shape == (n,)
    np.testing.assert_array_equal(got, numpy_bits(seed, offset, n))


def test_an_empty_draw():
    assert _philox()(3, 4, 0).shape == (0,)


def test_eager_and_compiled_draws_run_the_kernel_and_equal_numpy(eager_on, monkeypatch):
    """With eager kernels on, kiln.rand and a compiled dropout draw on the kernel (counted), the same
    bits as numpy's from the same generator state, over several calls."""
    calls: list[int] = []
    original = Philox.__call__

    def count(self, seed, offset, n):
        calls.append(n)
        return original(self, seed, offset, n)

    monkeypatch.setattr(Philox, "__call__", count)
    monkeypatch.setattr(eager_random, "_draws", eager_random.MIN_DRAWS)  # past a model's initialization
    kiln.manual_seed(11)
    drawn = kiln.rand(37, 5)
    assert calls == [185]
    with monkeypatch.context() as numpy_only:
        numpy_only.setattr(random, "_bits", [])
        kiln.manual_seed(11)
        np.testing.assert_array_equal(kiln.rand(37, 5).numpy(), drawn.numpy())  # numpy's draw: the same numbers
    assert calls == [185]
    x = kiln.ones(32, 784)
    dropout = kiln.compile(lambda t: kiln.nn.functional.dropout(t, 0.5, training=True) * 3, wait=True)
    for _ in range(3):
        kiln.manual_seed(5)
        compiled = dropout(x).numpy()
        kiln.manual_seed(5)
        np.testing.assert_array_equal(compiled, (kiln.nn.functional.dropout(x, 0.5, training=True) * 3).numpy())
    assert calls.count(32 * 784) >= 6


def test_the_first_draws_of_a_process_stay_on_numpy(eager_on, monkeypatch):
    """A model's initialization draws its weights a few dozen times, once: those draws neither run nor
    load the kernel (its load slowed the first compiled call that overlapped it); from the
    ``MIN_DRAWS``-th draw on, the kernel runs -- the same numbers either way."""
    calls: list[int] = []
    original = Philox.__call__
    monkeypatch.setattr(Philox, "__call__", lambda self, *a: (calls.append(a[2]), original(self, *a))[1])
    monkeypatch.setattr(eager_random, "_draws", 0)
    kiln.manual_seed(5)
    early = [kiln.rand(3, 4) for _ in range(eager_random.MIN_DRAWS)]
    assert calls == [] and not any(key[0] == eager_random.NAME for key in eager_on.CACHE.entries)
    later = kiln.rand(3, 4)
    assert calls == [12]
    kiln.manual_seed(5)
    with monkeypatch.context() as numpy_only:
        numpy_only.setattr(random, "_bits", [])
        again = [kiln.rand(3, 4) for _ in range(eager_random.MIN_DRAWS + 1)]
    for a, b in zip([*early, later], again, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
