"""Random numbers: Philox-4x32-10 against Random123's known answers, generator state and
reproducibility, and the distributions' statistics on 1e5 samples.

Statistical bounds are about 5 standard errors wide (false alarms ~1e-6 per check), and each
test uses a fixed seed, so a failure is a real change, never a fluke of the day.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.frontend.dispatch import apply
from kiln.ir.primitives import P
from kiln.ir.primitives.random import philox4x32
from kiln.ir.types import TensorType

N = 100_000

# Random123's kat_vectors for philox4x32_R(10): (counter words, key words, output words).
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [0xA4093822, 0x299F31D0],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ),
]


def gen(seed: int = 0) -> kiln.Generator:
    return kiln.Generator().manual_seed(seed)


def values(t: kiln.Tensor) -> np.ndarray:
    return t.detach().numpy().astype(np.float64)


# ----------------------------------------------------------------------------- Philox itself
@pytest.mark.parametrize("counter, key, expected", KAT)
def test_philox_matches_random123_known_answers(counter, key, expected):
    out = philox4x32(np, np.array(counter, dtype=np.uint64).reshape(4, 1), np.array(key, dtype=np.uint64))
    assert [int(w) for w in out[:, 0]] == expected


def test_philox_batches_agree_with_single_blocks():
    counters = np.array([c for c, _, _ in KAT], dtype=np.uint64).T  # (4, 3)
    batch = philox4x32(np, counters, np.zeros(2, dtype=np.uint64))
    for i in range(3):
        single = philox4x32(np, counters[:, i : i + 1], np.zeros(2, dtype=np.uint64))
        assert batch[:, i].tolist() == single[:, 0].tolist()


def test_random_bits_is_philox_of_seed_and_offset():
    # Seed 0, offset 0: the first known answer, word by word.
    bits = apply(P["random_bits"], kiln.tensor([0, 0]), shape=(2, 2))
    assert bits.dtype is kiln.int64 and bits.flatten().tolist() == KAT[0][2]
    # Seed -1 is the key ffffffff ffffffff; an offset past 2**32 carries into counter word 1.
    seed, offset = -1, (1 << 32) + 5
    bits = apply(P["random_bits"], kiln.tensor([seed, offset]), shape=(7,)).tolist()
    counter = np.array([[5, 6], [1, 1], [0, 0], [0, 0]], dtype=np.uint64)
    expected = philox4x32(np, counter, np.array([0xFFFFFFFF] * 2, dtype=np.uint64)).T.reshape(-1)[:7]
    assert bits == expected.tolist()


def test_random_bits_shapes_and_errors():
    state = kiln.tensor([3, 0])
    assert apply(P["random_bits"], state, shape=()).shape == ()
    assert apply(P["random_bits"], state, shape=(0, 3)).shape == (0, 3)
    with pytest.raises(TypeError, match=r"int64 tensor of shape \(2,\).*got float32"):
        P["random_bits"].infer(TensorType((2,), kiln.float32), shape=(3,))
    with pytest.raises(TypeError, match=r"shape \(2,\).*got int64 of shape \(3,\)"):
        P["random_bits"].infer(TensorType((3,), kiln.int64), shape=(3,))
    with pytest.raises(ValueError, match="non-negative"):
        P["random_bits"].infer(TensorType((2,), kiln.int64), shape=(-1,))
    assert not P["random_bits"].differentiable


def test_random_bits_are_balanced_32_bit_words():
    bits = gen(1).bits((N,)).numpy()
    assert bits.min() >= 0 and bits.max() < 1 << 32
    ones = (bits[:, None] >> np.arange(32)) & 1  # every bit position is 1 half the time
    assert np.all(np.abs(ones.mean(0) - 0.5) < 5 * 0.5 / math.sqrt(N))


# ----------------------------------------------------------------------------- generator state
def test_same_seed_same_stream_and_draws_advance():
    a, b = gen(123), gen(123)
    first = kiln.rand(5, generator=a)
    assert kiln.equal(first, kiln.rand(5, generator=b))
    assert not kiln.equal(first, kiln.rand(5, generator=a))  # the next draw is new
    assert not kiln.equal(first, kiln.rand(5, generator=gen(124)))


def test_offset_counts_128_bit_blocks():
    g = gen(5)
    assert g.get_offset() == 0
    g.bits((7,))
    assert g.get_offset() == 2  # ceil(7 / 4)
    kiln.rand(4, 3, generator=g)  # float32: one word each
    assert g.get_offset() == 5
    kiln.rand(4, dtype=kiln.float64, generator=g)  # float64: two words each
    assert g.get_offset() == 7
    g.bits((0,))
    assert g.get_offset() == 7


def test_draws_are_prefixes_of_longer_draws():
    # Element k comes from block offset + k // 4: a shorter draw is the start of a longer one.
    assert kiln.equal(kiln.rand(10, generator=gen(9)), kiln.rand(20, generator=gen(9))[:10])


def test_get_state_and_set_state_restore_the_stream():
    g = gen(77)
    kiln.randn(10, generator=g)
    state = g.get_state()
    assert state.dtype is kiln.uint8 and state.shape == (16,)
    expected = kiln.randn(6, generator=g)
    kiln.rand(100, generator=g)
    g.set_state(state)
    assert kiln.equal(kiln.randn(6, generator=g), expected)
    # An int64 [seed, offset] works too, and a fresh generator can take another's state.
    other = kiln.Generator().set_state(kiln.tensor([77, 3]))
    assert kiln.equal(other.bits((4,)), gen(77).set_offset(3).bits((4,)))
    with pytest.raises(RuntimeError, match="16 bytes.*got float32 of shape \\(3,\\)"):
        g.set_state(kiln.zeros(3))
    with pytest.raises(TypeError, match="kiln Tensor"):
        g.set_state([1, 2])


def test_generators_are_independent():
    a, b = gen(1), gen(1)
    kiln.manual_seed(1)
    kiln.rand(1000, generator=a)  # drawing from a moves neither b nor the default generator
    assert kiln.equal(kiln.rand(3, generator=b), kiln.rand(3, generator=gen(1)))
    assert kiln.equal(kiln.rand(3), kiln.rand(3, generator=gen(1)))


def test_seeds_and_the_default_generator():
    assert kiln.manual_seed(42) is kiln.default_generator
    assert kiln.initial_seed() == 42
    x = kiln.rand(4)
    kiln.manual_seed(42)
    assert kiln.equal(kiln.rand(4), x)
    state = kiln.get_rng_state()
    y = kiln.randn(3)
    kiln.set_rng_state(state)
    assert kiln.equal(kiln.randn(3), y)
    # A negative seed is its 64 bits, as in PyTorch.
    assert gen(-1).initial_seed() == 2**64 - 1
    assert kiln.equal(kiln.rand(3, generator=gen(-1)), kiln.rand(3, generator=gen(2**64 - 1)))
    new = kiln.seed()
    assert kiln.initial_seed() == new and 0 <= new < 2**64
    assert gen().seed() != gen().seed()  # entropy from the OS (equal with probability 2**-64)
    assert kiln.Generator().initial_seed() == 67280421310721  # PyTorch's default seed


def test_bad_seeds_and_generators():
    with pytest.raises(TypeError, match="int seed, got float"):
        kiln.manual_seed(1.5)
    with pytest.raises(RuntimeError, match=r"\[-2\*\*63, 2\*\*64\), got"):
        kiln.Generator().manual_seed(2**64)
    with pytest.raises(TypeError, match="kiln.Generator, got int"):
        kiln.rand(3, generator=3)
    with pytest.raises(ValueError, match="non-negative offset"):
        kiln.Generator().set_offset(-1)


# ----------------------------------------------------------------------------- uniform and normal
class ConstantBits(kiln.Generator):
    """A generator whose words are all ``word``: pins down the bits-to-float mapping."""

    def __init__(self, word: int) -> None:
        super().__init__()
        self.word = word

    def bits(self, shape):
        return kiln.full(shape, self.word, dtype=kiln.int64)


@pytest.mark.parametrize("dtype, width", [(kiln.float16, 11), (kiln.float32, 24), (kiln.float64, 53)])
def test_uniform_uses_the_top_bits_and_never_returns_one(dtype, width):
    top = kiln.rand(3, generator=ConstantBits(2**32 - 1), dtype=dtype)
    assert top.dtype is dtype and values(top).tolist() == [1 - 2.0**-width] * 3
    assert values(kiln.rand(2, generator=ConstantBits(0), dtype=dtype)).tolist() == [0.0, 0.0]
    half = kiln.rand(1, generator=ConstantBits(2**31), dtype=dtype)  # top bit set
    assert values(half)[0] == 0.5 + (0.0 if dtype is not kiln.float64 else 2.0**-28)  # and the second word's


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_rand_statistics(dtype):
    u = values(kiln.rand(N, generator=gen(2), dtype=dtype))
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / N)
    assert abs(u.var() - 1 / 12) < 5 * math.sqrt(1 / 180 / N)
    counts = np.bincount((u * 10).astype(int), minlength=10)  # chi-square over 10 bins
    chi2 = ((counts - N / 10) ** 2 / (N / 10)).sum()
    assert chi2 < 40  # 9 degrees of freedom: P(chi2 > 40) ~ 1e-5
    if dtype is kiln.float64:  # the low bits are random too, not multiples of 2**-24
        assert np.mean(u * 2**24 != np.floor(u * 2**24)) > 0.99


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_randn_statistics(dtype):
    z = values(kiln.randn(N, generator=gen(3), dtype=dtype))
    assert np.isfinite(z).all()
    assert abs(z.mean()) < 5 / math.sqrt(N)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / N)
    # Kolmogorov-Smirnov distance to the normal CDF (the 1e-6 critical value is ~0.0083).
    z.sort()
    cdf = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    steps = np.arange(1, N + 1) / N
    assert max(np.max(steps - cdf), np.max(cdf - steps + 1 / N)) < 0.0083


def test_rand_and_randn_shapes_dtypes_and_flags():
    assert kiln.rand(2, 3).shape == (2, 3) and kiln.rand((2, 3)).shape == (2, 3) and kiln.rand([4]).shape == (4,)
    assert kiln.rand(()).shape == () and kiln.randn(0, 3).shape == (0, 3)
    assert kiln.rand(2).dtype is kiln.float32 and kiln.randn(2, dtype=kiln.float16).dtype is kiln.float16
    x = kiln.randn(3, requires_grad=True)
    assert x.requires_grad and x.is_leaf
    base = kiln.zeros(2, 5, dtype=kiln.float64)
    assert kiln.rand_like(base).dtype is kiln.float64 and kiln.randn_like(base).shape == (2, 5)
    assert kiln.rand_like(base, dtype=kiln.float32).dtype is kiln.float32
    with pytest.raises(NotImplementedError, match="floating point dtype, got int64"):
        kiln.rand(3, dtype=kiln.int64)
    with pytest.raises(NotImplementedError, match="floating point dtype, got int32"):
        kiln.randn(3, dtype=kiln.int32)
    with pytest.raises(TypeError, match="rand\\(\\): argument 'size' must be a tuple of ints"):
        kiln.rand(2.5)
    with pytest.raises(RuntimeError, match="negative dimension"):
        kiln.randn(-1)


def test_random_ops_are_not_recorded_by_autograd():
    x = kiln.rand(3)
    assert x.grad_fn is None and not x.requires_grad


# ----------------------------------------------------------------------------- integers
def test_randint_range_and_uniformity():
    r = kiln.randint(-3, 7, (N,), generator=gen(4))
    assert r.dtype is kiln.int64 and r.shape == (N,)
    counts = np.bincount(r.numpy() + 3, minlength=10)
    assert counts.sum() == N and len(counts) == 10
    assert ((counts - N / 10) ** 2 / (N / 10)).sum() < 40


def test_randint_large_ranges_and_signatures():
    big = kiln.randint(0, 10**12, (N,), generator=gen(5)).numpy()
    assert big.min() >= 0 and big.max() < 10**12
    assert abs(big.mean() / 10**12 - 0.5) < 5 * math.sqrt(1 / 12 / N)
    assert kiln.randint(5, (3, 2)).shape == (3, 2)
    assert kiln.randint(2, 5, size=(4,)).numpy().min() >= 2
    assert kiln.randint(low=2, high=3, size=(4,)).tolist() == [2, 2, 2, 2]
    assert kiln.randint(10, (3,), dtype=kiln.float32).dtype is kiln.float32
    full = kiln.empty(N, dtype=kiln.int64).random_(generator=gen(6)).numpy()  # [0, 2**63)
    assert full.min() >= 0 and full.max() > 2**62
    like = kiln.randint_like(kiln.zeros(2, 3, dtype=kiln.int32), 4)
    assert like.dtype is kiln.int32 and like.shape == (2, 3) and like.numpy().max() < 4
    with pytest.raises(RuntimeError, match="from=5 >= to=3"):
        kiln.randint(5, 3, (2,))
    with pytest.raises(TypeError, match=r"\(high, size\) or \(low, high, size\)"):
        kiln.randint()
    with pytest.raises(TypeError, match="'high' must be an int, got float"):
        kiln.randint(2.5, (2,))


def test_randperm_is_a_reproducible_permutation():
    p = kiln.randperm(1000, generator=gen(8))
    assert p.dtype is kiln.int64 and sorted(p.tolist()) == list(range(1000))
    assert kiln.equal(p, kiln.randperm(1000, generator=gen(8)))
    assert not kiln.equal(p, kiln.randperm(1000, generator=gen(9)))
    assert kiln.randperm(0).shape == (0,) and kiln.randperm(5, dtype=kiln.int32).dtype is kiln.int32
    # Each position is uniform: position 0 holds each of 0..4 a fifth of the time.
    firsts = np.bincount([kiln.randperm(5, generator=g).tolist()[0] for g in [gen(100)] * 5000], minlength=5)
    assert np.all(np.abs(firsts / 5000 - 0.2) < 5 * math.sqrt(0.16 / 5000))
    with pytest.raises(RuntimeError, match="non-negative, got -1"):
        kiln.randperm(-1)


# ----------------------------------------------------------------------------- parameterized draws
def test_normal_with_tensors_and_numbers():
    mean = kiln.tensor([[-5.0], [0.0], [10.0]])
    std = kiln.tensor([0.5, 2.0])
    x = kiln.normal(mean, std, generator=gen(10))
    assert x.shape == (3, 2) and x.dtype is kiln.float32
    big = values(kiln.normal(kiln.full((N,), 3.0, dtype=kiln.float64), 2.0, generator=gen(11)))
    assert abs(big.mean() - 3) < 5 * 2 / math.sqrt(N) and abs(big.std() - 2) < 5 * 2 * math.sqrt(0.5 / N)
    y = values(kiln.normal(1.0, kiln.full((N,), 0.5), generator=gen(12)))
    assert abs(y.mean() - 1) < 5 * 0.5 / math.sqrt(N)
    z = kiln.normal(2.0, 3.0, (4, 5), generator=gen(13))
    assert z.shape == (4, 5) and z.dtype is kiln.float32
    assert kiln.normal(0.0, 1.0, size=(2,), dtype=kiln.float64).dtype is kiln.float64
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        kiln.normal(0.0, -1.0, (3,))
    with pytest.raises(TypeError, match="size is required"):
        kiln.normal(0.0, 1.0)


def test_normal_and_bernoulli_pass_a_zero_gradient_as_pytorch(torch):
    mean = kiln.zeros(3, requires_grad=True)
    std = kiln.ones(3, requires_grad=True)
    out = kiln.normal(mean, std)
    assert out.requires_grad and out.grad_fn.name() == "NormalBackward"
    out.sum().backward()
    tm, ts = torch.zeros(3, requires_grad=True), torch.ones(3, requires_grad=True)
    torch.normal(tm, ts).sum().backward()
    assert mean.grad.tolist() == tm.grad.tolist() == [0.0] * 3 and std.grad.tolist() == ts.grad.tolist()
    p = kiln.full((4,), 0.5, requires_grad=True)
    kiln.bernoulli(p).sum().backward()
    assert p.grad.tolist() == [0.0] * 4


def test_bernoulli():
    p = kiln.full((N,), 0.3, dtype=kiln.float64)
    b = kiln.bernoulli(p, generator=gen(14))
    assert b.dtype is kiln.float64 and set(np.unique(b.numpy())) <= {0.0, 1.0}
    assert abs(b.numpy().mean() - 0.3) < 5 * math.sqrt(0.21 / N)
    edges = kiln.bernoulli(kiln.tensor([0.0, 1.0, 0.0, 1.0]))
    assert edges.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert abs(kiln.bernoulli(kiln.zeros(N), 0.8).numpy().mean() - 0.8) < 0.01
    assert p.bernoulli().shape == (N,)
    with pytest.raises(RuntimeError, match="p to be in \\[0, 1\\], but got p=1.5"):
        kiln.bernoulli(kiln.zeros(2), 1.5)


# ----------------------------------------------------------------------------- in-place fills
def test_uniform_and_normal_fill_in_place():
    x = kiln.empty(N, dtype=kiln.float64)
    version = x._version_value
    assert x.uniform_(-2.0, 3.0, generator=gen(15)) is x and x._version_value == version + 1
    u = x.numpy()
    assert u.min() >= -2 and u.max() < 3 and abs(u.mean() - 0.5) < 5 * 5 / math.sqrt(12 * N)
    x.normal_(4.0, 0.5, generator=gen(16))
    assert abs(x.numpy().mean() - 4) < 5 * 0.5 / math.sqrt(N) and abs(x.numpy().std() - 0.5) < 0.01
    view = kiln.zeros(4, 6)[:, ::2]  # non-contiguous views fill in place, in the base's memory
    view.uniform_(5.0, 6.0)
    assert (view.numpy() >= 5).all()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        kiln.zeros(3, requires_grad=True).normal_()
    with pytest.raises(NotImplementedError, match="floating point tensor, got int64"):
        kiln.zeros(3, dtype=kiln.int64).uniform_()
    with pytest.raises(RuntimeError, match="from=2.0 > to=1.0"):
        kiln.zeros(3).uniform_(2.0, 1.0)


def test_other_in_place_distributions():
    e = kiln.empty(N, dtype=kiln.float64).exponential_(2.0, generator=gen(17)).numpy()
    assert e.min() >= 0 and abs(e.mean() - 0.5) < 5 * 0.5 / math.sqrt(N)
    ln = kiln.empty(N, dtype=kiln.float64).log_normal_(0.0, 0.25, generator=gen(18)).numpy()
    assert abs(np.log(ln).mean()) < 5 * 0.25 / math.sqrt(N) and abs(np.log(ln).std() - 0.25) < 0.005
    c = kiln.empty(N, dtype=kiln.float64).cauchy_(1.0, 2.0, generator=gen(19)).numpy()
    assert abs(np.median(c) - 1.0) < 0.05 and abs(np.mean(np.abs(c - 1) < 2) - 0.5) < 0.01  # quartiles at +-sigma
    b = kiln.zeros(N, dtype=kiln.int64).bernoulli_(0.25, generator=gen(20)).numpy()
    assert set(np.unique(b)) == {0, 1} and abs(b.mean() - 0.25) < 0.007
    r = kiln.zeros(N).random_(3, 8, generator=gen(21)).numpy()
    assert set(np.unique(r)) == {3.0, 4.0, 5.0, 6.0, 7.0}
    assert set(np.unique(kiln.zeros(1000, dtype=kiln.uint8).random_(4).numpy())) == {0, 1, 2, 3}
    assert kiln.zeros(1000, dtype=kiln.uint8).random_().numpy().max() > 200
    assert kiln.zeros(N).random_().numpy().max() <= 2**24
    with pytest.raises(RuntimeError, match="lambda > 0.0"):
        kiln.zeros(2).exponential_(0.0)


# ----------------------------------------------------------------------------- multinomial
def test_multinomial_with_replacement_matches_the_weights():
    w = kiln.tensor([1.0, 0.0, 6.0, 3.0])
    s = kiln.multinomial(w, N, replacement=True, generator=gen(22))
    assert s.dtype is kiln.int64 and s.shape == (N,)
    freq = np.bincount(s.numpy(), minlength=4) / N
    assert freq[1] == 0 and np.all(np.abs(freq - [0.1, 0, 0.6, 0.3]) < 0.01)


def test_multinomial_without_replacement():
    w = kiln.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 5.0, 1.0, 1.0]])
    s = kiln.multinomial(w, 3, generator=gen(23))
    assert s.shape == (2, 3)
    assert sorted(s.tolist()[0]) == [0, 1, 2] and sorted(s.tolist()[1]) == [1, 2, 3]
    firsts = kiln.multinomial(kiln.tensor([1.0, 2.0, 3.0, 4.0]).repeat(20000, 1), 2, generator=gen(24))
    assert np.all(np.abs(np.bincount(firsts.numpy()[:, 0], minlength=4) / 20000 - [0.1, 0.2, 0.3, 0.4]) < 0.02)
    assert all(a != b for a, b in firsts.tolist())
    with pytest.raises(RuntimeError, match="cannot sample 5 samples from 4 categories without replacement"):
        kiln.multinomial(kiln.ones(4), 5)
    with pytest.raises(RuntimeError, match="fewer nonzero weights"):
        kiln.multinomial(kiln.tensor([1.0, 0.0, 0.0]), 2)
    with pytest.raises(RuntimeError, match="inf, nan or element < 0"):
        kiln.multinomial(kiln.tensor([1.0, -1.0]), 1)
    with pytest.raises(RuntimeError, match="1-D or 2-D floating point"):
        kiln.multinomial(kiln.tensor([1, 2]), 1)


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.float32, kiln.float64])
@pytest.mark.parametrize("draw", ["rand", "randn"])
def test_eager_draws_on_the_arrays_equal_the_ops(monkeypatch, dtype, draw):
    from kiln.frontend.ops import random as random_ops

    def draws():
        g = gen(11)
        out = [getattr(kiln, draw)(*shape, generator=g, dtype=dtype).numpy() for shape in ((5, 7), (3,), (0, 2))]
        return out, g.get_offset(), g.philox_state._version[0]

    on_arrays, offset, version = draws()
    monkeypatch.setattr(random_ops, "_on_arrays", lambda g: False)
    ops, ops_offset, ops_version = draws()
    for a, b in zip(on_arrays, ops, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert offset == ops_offset and version == ops_version
