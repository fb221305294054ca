"""What a traced call costs beyond the eager call it is (issue 33, item 7).

The traced call runs the function eagerly while it records the graph; the program compiled from
that graph replaces every eager op of the call, so the call compiles none of their kernels (eager
kernels already compiled still run). Each test compares the traced call with an eager one.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln

from .helpers import array, compiled_calls

RTOL, ATOL = 1e-4, 1e-4


def _conv_step(x, w, g):
    """A convolution and its gradients: ops large enough for eager kernels (``eager_kernels.MIN_BYTES``)."""
    y = kiln.nn.functional.conv2d(x, w)
    y.backward(g)
    return y.tanh().sum()


def _inputs():
    rng = np.random.default_rng(3)
    x = kiln.tensor(rng.normal(size=(8, 3, 20, 20)).astype(np.float32), requires_grad=True)
    w = kiln.tensor(rng.normal(size=(6, 3, 5, 5)).astype(np.float32), requires_grad=True)
    g = kiln.tensor(rng.normal(size=(8, 6, 16, 16)).astype(np.float32))
    return x, w, g


@pytest.mark.parametrize("synchronous", [True, False], ids=["sync", "background"])
def test_a_traced_call_compiles_no_eager_kernel(on, monkeypatch, synchronous):
    monkeypatch.setattr(on.CACHE, "synchronous", synchronous)
    x, w, g = _inputs()
    step = kiln.compile(_conv_step, wait=True)
    traced = step(x, w, g)
    assert on.wait(120)
    assert list(on.CACHE.entries) == [], "the traced call compiled eager kernels the program replaces"
    grads = (array(x.grad).copy(), array(w.grad).copy())
    x.grad = w.grad = None
    eager = _conv_step(x, w, g)  # the same ops outside a trace compile theirs
    assert {key[0] for key in on.CACHE.entries} >= {"conv", "conv_weight"}
    np.testing.assert_allclose(array(traced), array(eager), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads[0], array(x.grad), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads[1], array(w.grad), rtol=RTOL, atol=ATOL)
    x.grad = w.grad = None
    np.testing.assert_allclose(array(step(x, w, g)), array(eager), rtol=RTOL, atol=ATOL)
    assert compiled_calls(step) == [1]


def test_a_traced_call_still_runs_the_eager_kernels_compiled_before(on, monkeypatch):
    monkeypatch.setattr(on.CACHE, "synchronous", True)
    x, w, g = _inputs()
    eager = _conv_step(x, w, g)  # compiles the conv kernels
    expected = (array(eager), array(x.grad).copy(), array(w.grad).copy())
    before = dict(on.CACHE.entries)
    assert all(entry.program is not None for entry in before.values())
    x.grad = w.grad = None
    with kiln.profiler.profile() as prof:
        traced = kiln.compile(_conv_step, wait=True)(x, w, g)
    ran = {e.name: e.args["kernel"] for e in prof.events() if e.cat == "op" and e.name.startswith("conv")}
    assert ran == {"conv": "compiled", "conv_weight": "compiled"}
    assert on.CACHE.entries.keys() == before.keys()
    for actual, wanted in zip((array(traced), array(x.grad), array(w.grad)), expected, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=RTOL, atol=ATOL)
