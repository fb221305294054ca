"""Random draws over dynamic sizes (issue 33): a program with dropout compiles once for every size.

A draw's shape and the generator's advance past it (``ceil(numel / 4)`` Philox blocks) are ops of
the graph over the symbolic sizes, so one dynamic specialization serves a DataLoader's ragged last
batch and a language model's varying lengths. At every size the compiled call draws the bits the
eager call draws from the same seed, and leaves the generator where the eager call leaves it.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from tests.conftest import assert_close

rng = np.random.default_rng(0)


def f32(*shape, dtype=np.float32) -> np.ndarray:
    return rng.normal(size=shape).astype(dtype)


def rng_state() -> np.ndarray:
    return kiln.get_rng_state().numpy().copy()


def dynamic_events(compiled) -> list[str]:
    return [e.detail for e in compiled.state.events if "dynamic:" in e.detail]


def _seeded_calls(fn, args, seed: int):
    """``fn(*args)`` right after ``manual_seed(seed)``: its results as arrays, the generator's state
    after it, and the next eager draw (what the program's caller would draw next)."""
    kiln.manual_seed(seed)
    out = fn(*[kiln.tensor(a) for a in args])
    out = out if isinstance(out, tuple) else (out,)
    state = rng_state()
    return [t.detach().numpy().copy() for t in out], state, kiln.rand(5).numpy()


def _mlp_step():
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 4))
    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        hidden = model[2](model[1](model[0](x)))  # tanh is never exactly 0: the zeros are the mask
        loss = F.cross_entropy(model[3](hidden), y)
        loss.backward()
        opt.step()
        return loss, hidden == 0

    return model, step


def test_a_training_step_with_dropout_over_ragged_batches_compiles_once_more_and_equals_eager():
    sizes = [32, 32, 19, 32, 7, 25, 32, 3, 19]
    batches = [(f32(n, 12), rng.integers(0, 4, n)) for n in sizes]
    eager_model, eager_step = _mlp_step()
    model, step = _mlp_step()
    compiled = kiln.compile(step)
    for k, (x, y) in enumerate(batches):
        (loss, mask), state, after = _seeded_calls(eager_step, (x, y), seed=100 + k)
        (c_loss, c_mask), c_state, c_after = _seeded_calls(compiled, (x, y), seed=100 + k)
        where = f"call {k} at batch {sizes[k]}"
        np.testing.assert_array_equal(c_mask, mask, err_msg=where)  # the dropout mask: bit for bit
        assert 0.3 < mask.mean() < 0.7, where
        np.testing.assert_array_equal(c_state, state, err_msg=where)  # the generator advanced alike
        np.testing.assert_array_equal(c_after, after, err_msg=where)  # so the next eager draw is the same
        assert_close(c_loss, loss, rtol=1e-5, atol=1e-6)
        for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
            assert_close(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
            assert_close(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6)
        if k == 2:
            made = len(compiled.state.specializations)
    # the static program of the first size, the dynamic one at the first 19, and none after
    assert len(compiled.state.specializations) == made == 2, compiled.state.events
    assert compiled.state.specializations[-1].dynamic == [(0, 0), (1, 0)]
    assert len(dynamic_events(compiled)) == 1, compiled.state.events


def test_a_language_model_with_dropout_over_varying_lengths_compiles_once_more():
    vocab, hidden = 11, 8

    def make():
        kiln.manual_seed(0)
        emb, out = nn.Embedding(vocab, hidden), nn.Linear(hidden, vocab)
        opt = kiln.optim.Adam([*emb.parameters(), *out.parameters()], lr=0.05)

        def step(tokens, targets):
            opt.zero_grad()
            h = F.dropout(kiln.tanh(emb(tokens)), 0.25, training=True)  # (3, T, 8)
            loss = F.cross_entropy(out(h).reshape(-1, vocab), targets.reshape(-1))
            loss.backward()
            opt.step()
            return loss, h == 0

        return step

    eager, compiled = make(), kiln.compile(make())
    lengths = [12, 12, 7, 30, 12, 5, 19, 2, 25]
    for k, t in enumerate(lengths):
        tokens = rng.integers(0, vocab, (3, t))
        args = (tokens, np.roll(tokens, -1, axis=1))
        (loss, mask), state, after = _seeded_calls(eager, args, seed=k)
        (c_loss, c_mask), c_state, c_after = _seeded_calls(compiled, args, seed=k)
        np.testing.assert_array_equal(c_mask, mask, err_msg=f"length {t}")
        np.testing.assert_array_equal(c_state, state, err_msg=f"length {t}")
        np.testing.assert_array_equal(c_after, after, err_msg=f"length {t}")
        assert_close(c_loss, loss, rtol=1e-5, atol=1e-6)
        if k == 2:
            made = len(compiled.state.specializations)
    assert len(compiled.state.specializations) == made == 2, compiled.state.events
    assert compiled.state.specializations[-1].dynamic == [(0, 1), (1, 1)]


def draws(x):
    """Every distribution kiln draws, at sizes that follow ``x``'s (n, 3): 3 * n elements are a
    multiple of 4 only for some n, so the advance rounds up to whole Philox blocks."""
    n = x.shape[0]
    probs = kiln.sigmoid(x)
    return (
        kiln.rand(x.shape),
        kiln.rand(n, 3, dtype=kiln.float64),  # two words per element
        kiln.randn(n, 3),
        kiln.randint(0, 10, (n, 3)),
        kiln.randint(-(1 << 40), 1 << 40, (n,)),  # wide: two words per element
        kiln.bernoulli(probs),
        kiln.rand_like(x),
        kiln.randn_like(x, dtype=kiln.float64),
        F.dropout(x, 0.5, training=True),
        kiln.rand(n, 3, 5)[:, 1:],  # a product of a symbol and static sizes (15 * n)
        F.dropout2d(x.reshape(n, 3, 1, 1).expand(n, 3, 2, 2), 0.5),  # a mask per channel: (n, 3, 1, 1)
        x.clone().uniform_(-1.0, 2.0),
        kiln.normal(x, 0.5),
    )


def test_every_distribution_at_a_dynamic_size_draws_the_eager_bits_and_advances_alike():
    compiled = kiln.compile(draws)
    sizes = [6, 6, 11, 3, 17, 6, 2, 9, 13]
    for k, n in enumerate(sizes):
        x = f32(n, 3)
        expected, state, after = _seeded_calls(draws, (x,), seed=40 + k)
        actual, c_state, c_after = _seeded_calls(compiled, (x,), seed=40 + k)
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            where = f"draw {i} at size {n}"
            assert a.shape == e.shape and a.dtype == e.dtype, where
            # normals: Box-Muller's log and cos, compiled, are within an ulp of numpy's; uniform_'s
            # low + u * (high - low) may contract to one fused multiply-add
            if i in (2, 7, 11, 12):
                assert_close(a, e, rtol=1e-6, atol=1e-6)
            else:
                np.testing.assert_array_equal(a, e, err_msg=where)
        np.testing.assert_array_equal(c_state, state, err_msg=f"size {n}")
        np.testing.assert_array_equal(c_after, after, err_msg=f"size {n}")
    assert len(compiled.state.specializations) == 2, compiled.state.events
    assert compiled.state.specializations[-1].dynamic == [(0, 0)]
    # the offset moved by ceil(numel / 4) blocks per draw: at n = 13 (39 elements) the first draw uses 10
    kiln.manual_seed(5)
    compiled(kiln.tensor(f32(13, 3)))
    kiln.manual_seed(5)
    kiln.rand(13, 3)
    assert kiln.default_generator.get_offset() == 10
    assert len(compiled.state.specializations) == 2


def test_two_dynamic_sizes_in_one_draw():
    def noisy(x):  # (B, T): B and T are both symbols, the draw's numel their product
        return x + kiln.randn(x.shape) * 0.1, kiln.rand(x.shape[0], x.shape[1], 3)

    compiled = kiln.compile(noisy)
    for k, (b, t) in enumerate([(4, 5), (6, 7), (3, 9), (5, 2), (9, 4)]):
        x = f32(b, t)
        expected, state, _ = _seeded_calls(noisy, (x,), seed=k)
        actual, c_state, _ = _seeded_calls(compiled, (x,), seed=k)
        assert_close(actual[0], expected[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(actual[1], expected[1])
        np.testing.assert_array_equal(c_state, state)
    assert len(compiled.state.specializations) == 2, compiled.state.events
    assert compiled.state.specializations[-1].dynamic == [(0, 0), (0, 1)]


def test_the_gradient_through_dropout_at_a_dynamic_size_matches_finite_differences():
    """float64, the mask fixed by the seed: the loss is smooth in ``w``, its gradient the masked,
    rescaled one; the compiled gradient at each size equals central differences of the eager loss."""
    w = kiln.tensor(f32(4, dtype=np.float64), requires_grad=True)

    def loss_of(x):
        return (F.dropout(kiln.tanh(x * w), 0.4, training=True) * x).sum()

    def step(x):
        w.grad = None
        loss = loss_of(x)
        loss.backward()
        return loss.detach(), w.grad

    compiled = kiln.compile(step)
    eps = 1e-6
    for k, n in enumerate([5, 5, 9, 3, 14]):
        x = kiln.tensor(f32(n, 4, dtype=np.float64))
        kiln.manual_seed(k)
        _, grad = compiled(x)
        numeric = np.zeros(4)
        for i in range(4):
            for sign in (1.0, -1.0):
                shifted = w.detach().numpy().copy()
                shifted[i] += sign * eps
                kiln.manual_seed(k)  # the same mask
                with kiln.no_grad():
                    numeric[i] += sign * float((F.dropout(kiln.tanh(x * kiln.tensor(shifted)), 0.4) * x).sum())
        numeric /= 2 * eps
        assert_close(grad.numpy(), numeric, rtol=1e-6, atol=1e-8)
        assert np.abs(numeric).max() > 1e-3  # some units were kept
    assert len(compiled.state.specializations) == 2, compiled.state.events
    assert compiled.state.specializations[-1].dynamic == [(0, 0)]


@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_each_backend_runs_the_dynamic_draw(backend):
    def noisy(x):
        return F.dropout(x, 0.5, training=True), kiln.rand(x.shape[0], 3)

    compiled = kiln.compile(noisy, options=kiln.CompileOptions(backend=backend))
    for k, n in enumerate([8, 8, 5, 21, 2]):
        x = f32(n, 3)
        expected, state, _ = _seeded_calls(noisy, (x,), seed=k)
        actual, c_state, _ = _seeded_calls(compiled, (x,), seed=k)
        for a, e in zip(actual, expected, strict=True):
            np.testing.assert_array_equal(a, e)
        np.testing.assert_array_equal(c_state, state)
    assert len(compiled.state.specializations) == 2, compiled.state.events
    assert len(dynamic_events(compiled)) == 1
