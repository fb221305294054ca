"""Random ops inside compiled code draw from the kiln generator, advanced per call: new masks each
call, re-seeding reproduces the sequence, and compiled and eager give bit-identical numbers."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F

from .helpers import compiled_calls

X = np.linspace(1.0, 2.0, 64, dtype=np.float32).reshape(8, 8)


def drop(x):
    return F.dropout(x, p=0.5, training=True)


def uniform(x):
    return x + kiln.rand(8, 8)


def normal(x):
    return x * kiln.randn(8, 8)


def _run(fn, seed: int, n: int) -> list[np.ndarray]:
    kiln.manual_seed(seed)
    x = kiln.tensor(X)
    return [fn(x).numpy().copy() for _ in range(n)]


def test_dropout_mask_differs_per_call():
    f = kiln.compile(drop)
    outs = _run(f, 0, 5)
    masks = [o != 0 for o in outs]
    for i in range(len(masks)):
        for j in range(i):
            assert not np.array_equal(masks[i], masks[j]), f"calls {i} and {j} gave the same mask"
    # kept values are scaled by 1 / (1 - p)
    for o in outs:
        np.testing.assert_allclose(o[o != 0], (X * 2)[o != 0], rtol=1e-6, atol=0)
    assert compiled_calls(f) == [4]


def test_reseeding_reproduces_the_sequence():
    f = kiln.compile(uniform)
    first = _run(f, 123, 4)
    second = _run(f, 123, 4)  # all compiled calls now
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert compiled_calls(f) == [7]
    assert not np.array_equal(first[1], first[2])


@pytest.mark.parametrize(
    ("fn", "seed", "calls", "rtol", "atol"),
    [
        (drop, 7, 5, 0.0, 0.0),  # dropout masks: bit for bit
        (uniform, 11, 5, 0.0, 0.0),  # uniform bits: bit for bit
        (normal, 5, 4, 1e-6, 1e-7),  # normals: within a few ulp
    ],
    ids=["dropout", "uniform", "normal"],
)
def test_compiled_draws_equal_eager_from_the_same_seed(fn, seed, calls, rtol, atol):
    f = kiln.compile(fn)
    compiled = _run(f, seed, calls)
    eager = _run(fn, seed, calls)
    for i, (c, e) in enumerate(zip(compiled, eager, strict=True)):
        np.testing.assert_allclose(c, e, rtol=rtol, atol=atol, err_msg=f"call {i}")
    assert compiled_calls(f) == [calls - 1]


def test_eager_and_compiled_interleaved_share_the_generator():
    # Compiled calls advance the generator exactly as eager calls do.
    f = kiln.compile(uniform)
    kiln.manual_seed(3)
    x = kiln.tensor(X)
    mixed = [f(x).numpy().copy() if i % 2 else uniform(x).numpy().copy() for i in range(6)]
    f(x)
    eager = _run(uniform, 3, 6)
    for i, (m, e) in enumerate(zip(mixed, eager, strict=True)):
        np.testing.assert_array_equal(m, e, err_msg=f"call {i}")
    assert compiled_calls(f)[0] >= 2


def test_explicit_generator_is_advanced_per_call():
    g = kiln.Generator().manual_seed(42)

    @kiln.compile
    def f(x):
        return F.dropout(x, 0.3, generator=g)

    x = kiln.tensor(X)
    outs = [f(x).numpy().copy() for _ in range(4)]
    g.manual_seed(42)
    eager = [F.dropout(x, 0.3, generator=g).numpy().copy() for _ in range(4)]
    for c, e in zip(outs, eager, strict=True):
        np.testing.assert_array_equal(c, e)
    assert not np.array_equal(outs[2], outs[3]) and compiled_calls(f) == [3]


def test_check_true_on_dropout_passes():
    f = kiln.compile(drop, check=True)
    outs = _run(f, 0, 4)
    eager = _run(drop, 0, 4)
    for c, e in zip(outs, eager, strict=True):
        np.testing.assert_array_equal(c, e)
    assert compiled_calls(f) == [3]


def _save_draw_restore(x):
    """Draws, restores the state saved before them and draws again (as checkpoint's recomputation)."""
    state = kiln.get_rng_state()
    a = x + kiln.rand(8, 8)
    kiln.set_rng_state(state)
    return a, x + kiln.rand(8, 8), state


def _generator_state_calls(fn, seed: int, n: int):
    kiln.manual_seed(seed)
    x = kiln.tensor(X)
    runs = []
    for _ in range(n):
        runs.append([t.numpy().copy() for t in fn(x)] + [kiln.get_rng_state().numpy().copy()])
    return runs, kiln.rand(4).numpy()


def test_get_and_set_rng_state_inside_compiled_calls_equal_eager():
    # The state is read and written with ops on the state tensor: each compiled call saves the state
    # it is called with (not the traced call's, as a constant) and restores it.
    f = kiln.compile(_save_draw_restore)
    (compiled, next_draw), (eager, eager_draw) = (
        _generator_state_calls(f, 9, 4),
        _generator_state_calls(_save_draw_restore, 9, 4),
    )
    for i, (c, e) in enumerate(zip(compiled, eager, strict=True)):
        np.testing.assert_array_equal(c[0], c[1], err_msg=f"call {i}: the restored state drew other numbers")
        for a, b in zip(c, e, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"call {i}")
    assert not np.array_equal(compiled[0][2], compiled[1][2])  # a fresh state per call
    np.testing.assert_array_equal(next_draw, eager_draw)
    assert compiled_calls(f) == [3]


def test_set_state_from_an_int64_state_inside_a_compiled_call():
    g = kiln.Generator().manual_seed(2**64 - 3)  # a seed whose int64 word is negative

    @kiln.compile
    def replay(x):
        saved = g.philox_state.clone()
        first = kiln.rand(5, generator=g)
        g.set_state(saved)
        return first, kiln.rand(5, generator=g) + x

    x = kiln.zeros(5)
    for _ in range(4):
        first, again = replay(x)
        np.testing.assert_array_equal(first.numpy(), again.numpy())
    assert g.initial_seed() == 2**64 - 3 and g.get_offset() == 8  # 2 blocks per call
    assert compiled_calls(replay) == [3]


@pytest.mark.parametrize("read", ["get_offset", "initial_seed"])
def test_reading_the_generator_as_python_numbers_stops_the_trace(read):
    # a Python int from the state would be the traced call's, frozen into every compiled call
    f = kiln.compile(lambda x: x + getattr(kiln.default_generator, read)() % 7, fullgraph=True)
    with pytest.raises(kiln.jit.TraceBreakError, match=f"Generator.{read}"):
        f(kiln.tensor(X))


def _big_constants(f) -> list[tuple[int, ...]]:
    return [a.shape for a in f.graph.constants.values() if a.size >= 64]


def test_traced_dropout_holds_no_constant_of_the_input_size():
    # The keep probability was a tensor filled with it (full_like): traced, a constant as big as the
    # input, stored in the program and read per call (a GAT's attention: 23M elements).
    def step(x, w):
        return (F.dropout(x, 0.4, training=True) * w).sum()

    f = kiln.compile(step)
    kiln.manual_seed(3)
    x, w = kiln.tensor(X), kiln.tensor(X[::-1].copy())
    outs = [f(x, w).item() for _ in range(4)]
    kiln.manual_seed(3)
    eager = [step(x, w).item() for _ in range(4)]
    np.testing.assert_allclose(outs, eager, rtol=1e-6, atol=1e-6)  # (a sum: its order may differ)
    assert len(set(outs)) > 1 and compiled_calls(f) == [3]
    assert _big_constants(f) == []


@pytest.mark.parametrize("draw", ["bernoulli", "bernoulli_", "normal"])
def test_a_probability_made_in_the_trace_is_read_without_a_gather(draw, monkeypatch):
    # Detaching a tensor made in the trace (a born constant) made the tracer find each element of
    # the view in its base (view_positions over the whole tensor); under no_grad nothing needs it.
    import kiln.frontend.ops.inplace as inplace  # noqa: PLC0415

    def f(x):
        p = kiln.full_like(x, 0.25)
        if draw == "bernoulli":
            return x * kiln.bernoulli(p)
        if draw == "bernoulli_":
            return x * kiln.empty_like(x).bernoulli_(p)
        return x + kiln.normal(p, p)

    seen = []
    original = inplace.view_positions
    monkeypatch.setattr(inplace, "view_positions", lambda *a: seen.append(1) or original(*a))
    g = kiln.compile(f)
    kiln.manual_seed(5)
    x = kiln.tensor(X)
    outs = [g(x).numpy().copy() for _ in range(4)]
    kiln.manual_seed(5)
    eager = [f(x).numpy().copy() for _ in range(4)]
    for c, e in zip(outs, eager, strict=True):
        np.testing.assert_allclose(c, e, rtol=1e-6, atol=1e-7)
    assert not np.array_equal(outs[0], outs[1]) and compiled_calls(g) == [3]
    assert seen == []
