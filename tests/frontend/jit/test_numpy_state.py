"""numpy work inside a compiled call that the trace cannot see: draws from a numpy generator the
call reaches (their Cython methods are invisible to a profiler, so the draw is seen by the state),
and tensors made from arrays the call computed with numpy (nanoGPT's ``get_batch`` inside its
training step: random rows of a memmap, converted with ``astype``). Each test runs the compiled
function and the plain one side by side; the results must be eager's, and the call runs eagerly
with the reason said. Arrays that live on between calls still compile (test_hazards.py)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.jit import TraceBreakError

from .helpers import compiled_calls, events

GENERATORS = {
    "RandomState": lambda: np.random.RandomState(0),
    "Generator": lambda: np.random.default_rng(0),
    "MT19937": lambda: np.random.Generator(np.random.MT19937(0)),
}


def _breaks(f) -> list[str]:
    return [e.detail for e in events(f, "break")]


def _values(outs) -> list[float]:
    return [float(o.sum().numpy()) for o in outs]


@pytest.mark.parametrize("make", GENERATORS.values(), ids=GENERATORS.keys())
def test_a_draw_from_a_numpy_generator_in_the_closure_runs_eagerly(make):
    rng, twin = make(), make()

    def f(x, gen):
        return x * gen.random()

    g = kiln.compile(lambda x: f(x, rng), wait=True)
    x = kiln.ones(2)
    got = _values(g(x) for _ in range(4))
    assert got == pytest.approx(_values(f(x, twin) for _ in range(4)), rel=1e-6, abs=1e-7)
    assert len(set(got)) == 4
    assert compiled_calls(g) == [] and "numpy's random generator" in _breaks(g)[0], _breaks(g)


_batch_rng = np.random.RandomState(0)


def _batch(data: np.ndarray):
    """nanoGPT's get_batch, small: a helper that draws from a global generator."""
    ix = _batch_rng.randint(len(data) - 4, size=(3,))
    return kiln.stack([kiln.from_numpy(data[i : i + 4].astype(np.int64)) for i in ix])


def test_a_helper_drawing_from_a_global_numpy_generator_runs_eagerly():
    global _batch_rng
    data = np.arange(50, dtype=np.uint16)
    g = kiln.compile(lambda x: x + _batch(data), wait=True)
    x = kiln.zeros(3, 4, dtype=kiln.int64)
    _batch_rng = np.random.RandomState(0)
    got = _values(g(x) for _ in range(4))
    _batch_rng = np.random.RandomState(0)
    expected = _values(x + _batch(data) for _ in range(4))
    assert got == expected and len(set(got)) > 1
    assert compiled_calls(g) == [] and "_batch_rng" in _breaks(g)[0], _breaks(g)


@pytest.mark.parametrize("make", ["from_numpy", "tensor", "as_tensor"])
def test_a_tensor_made_from_an_array_the_call_computed_runs_eagerly(make):
    buf = np.zeros(3, np.float32)  # refilled between calls; the call computes with numpy from it

    def f(x):
        return x + getattr(kiln, make)(buf * 2)

    g = kiln.compile(f, wait=True)
    x = kiln.zeros(3)
    got, expected = [], []
    for i in range(4):
        buf[:] = i
        got.append(g(x).numpy().copy())
        expected.append(f(x).numpy().copy())
    np.testing.assert_allclose(np.stack(got), np.stack(expected), rtol=1e-6, atol=1e-7)
    assert compiled_calls(g) == [] and "computed with numpy" in _breaks(g)[0], _breaks(g)
    assert "test_numpy_state.py" in _breaks(g)[0]


def test_fullgraph_raises_for_an_array_the_call_computed():
    g = kiln.compile(lambda x: x + kiln.from_numpy(np.ones(3, np.float32) * 2), fullgraph=True, wait=True)
    with pytest.raises(TraceBreakError, match="computed with numpy"):
        g(kiln.zeros(3))


@pytest.mark.parametrize("how", ["global buffer", "view of a buffer", "attribute"])
def test_arrays_that_live_on_between_calls_still_compile(how):
    class Box:
        pass

    box, buf = Box(), np.zeros(3, np.float32)
    box.buf = buf
    read = {
        "global buffer": lambda: kiln.from_numpy(buf),
        "view of a buffer": lambda: kiln.from_numpy(buf[:2]).sum() + kiln.from_numpy(buf[2:]),
        "attribute": lambda: kiln.tensor(box.buf),
    }[how]
    g = kiln.compile(lambda x: x + read(), wait=True)
    x = kiln.ones(3)
    for i in range(4):
        buf[:] = np.arange(3) * i
        np.testing.assert_allclose(g(x).numpy(), (x + read()).numpy(), rtol=1e-6, atol=1e-7)
    assert _breaks(g) == [] and sum(compiled_calls(g)) >= 2


def test_of_several_arrays_the_one_the_call_computed_is_named():
    # a buffer the caller keeps and refills, read beside an array the call computes from it: only the
    # computed one is the call's own (the buffer alone would compile, as above)
    kept, base = np.zeros(4, np.float32), np.arange(4, dtype=np.float32)

    def f(x):
        return x + kiln.from_numpy(kept) + kiln.tensor(base[::-1] * kept)

    g = kiln.compile(f, wait=True)
    x = kiln.ones(4)
    for i in range(4):
        kept[:] = i
        np.testing.assert_allclose(g(x).numpy(), f(x).numpy(), rtol=1e-6, atol=1e-7)
    assert compiled_calls(g) == [] and "float32[4] that the call computed" in _breaks(g)[0], _breaks(g)
