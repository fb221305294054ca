"""One LSTM step on rnn_scan's packed layout as one native function each way
(kiln/codegen/llvm/recurrence_step.py, ``LSTMStepKernels``): a compiled loop's trip over an
``nn.LSTMCell``. Equal to the numpy step path it replaces (``recurrence_numpy._lstm_scan_step``,
``_lstm_backward_step``) on contiguous and strided rows, with and without gate cotangents; actually
run (counted); arrays it does not take leave numpy to run; a compiled LSTMCell loop equals eager."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.codegen.llvm.recurrence_call import LSTMKernels, LSTMStepKernels
from kiln.frontend import eager_recurrence
from kiln.ir.primitives import recurrence_native
from kiln.ir.primitives import recurrence_numpy as kernels
from kiln.ir.primitives.recurrence_layout import ScanLayout
from kiln.runtime.threads import SmallProducts
from tests.conftest import assert_close
from tests.frontend.jit.test_compile_loops import _against_eager

_BUILT: dict = {}


def _built(cls, dtype, hidden: int):
    key = (cls, np.dtype(dtype), hidden)
    if key not in _BUILT:
        _BUILT[key] = cls.build(dtype, hidden)
    return _BUILT[key]


@pytest.fixture
def runs(monkeypatch):
    """Counts of the step kernels' forward and backward runs that took their arrays."""
    counts = {"forward": 0, "backward": 0}
    forward, backward = LSTMStepKernels.forward, LSTMStepKernels.backward

    def counted_forward(self, *args):
        took = forward(self, *args)
        counts["forward"] += took
        return took

    def counted_backward(self, *args):
        out = backward(self, *args)
        counts["backward"] += out is not None
        return out

    monkeypatch.setattr(LSTMStepKernels, "forward", counted_forward)
    monkeypatch.setattr(LSTMStepKernels, "backward", counted_backward)
    return counts


@pytest.fixture
def provide():
    """provide(step: bool): the native kernels installed straight from the code generator, the step
    kernels among them or not."""

    def use(step: bool) -> None:
        classes = {"LSTM": LSTMKernels, **({"LSTM_STEP": LSTMStepKernels} if step else {})}
        recurrence_native.install(lambda mode, dtype, hidden, steps: _built(classes[mode], dtype, hidden)
                                  if mode in classes else None)  # fmt: skip

    yield use
    recurrence_native.install(eager_recurrence.native, SmallProducts)


def _arrays(rng, dtype, batch: int, hidden: int, cotangent: str, strided: bool):
    """A step's inputs, its output arrays (NaN-filled: every element must be written) and a cotangent
    of the packed output; ``strided``: gx, the states, the outputs and the cotangent are row windows
    of wider arrays."""
    layout = ScanLayout("LSTM", hidden)
    pad = 3 if strided else 0

    def rows(shape, fill=None):
        wide = rng.normal(size=(*shape[:-1], shape[-1] + pad)).astype(dtype)
        if fill is not None:
            wide[...] = fill
        return wide[..., pad:] if strided else wide

    gx, h0, c0 = rows((1, batch, 4 * hidden)), rows((batch, hidden)), rows((batch, hidden))
    bias = rng.normal(size=4 * hidden).astype(dtype)
    w_hh = (0.5 * rng.normal(size=(4 * hidden, hidden))).astype(dtype)
    g = rows((1, batch, layout.width))
    for span in {"all": [], "no gates": [layout.gate_span], "states only": [layout.gate_span, layout.extra]}[cotangent]:
        g[..., span[0] : span[0] + span[1]] = 0
    return (
        (gx, bias, h0, c0, w_hh),
        g,
        rows((1, batch, layout.width), np.nan),
        rows((1, batch, layout.grad_width), np.nan),
    )


def _step_both_ways(inputs, g, out, grad_out):
    packed = kernels.scan(*inputs[:4], inputs[4], None, mode="LSTM", reverse=False, out=out)
    return packed.copy(), kernels.scan_backward(packed, inputs[4], g, mode="LSTM", reverse=False, out=grad_out).copy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("batch", "hidden"), [(16, 51), (1, 4), (3, 1), (9, 19)])
@pytest.mark.parametrize("cotangent", ["all", "no gates", "states only"])
@pytest.mark.parametrize("strided", [False, True])
def test_step_kernels_equal_the_numpy_step(provide, runs, dtype, batch, hidden, cotangent, strided):
    rng = np.random.default_rng(batch * 100 + hidden)
    inputs, g, out, grad_out = _arrays(rng, dtype, batch, hidden, cotangent, strided)
    found = {}
    for step in (False, True):
        provide(step)
        found[step] = _step_both_ways(inputs, g, out, grad_out)
    assert runs == {"forward": 1, "backward": 1}
    # float32: the step product sums in its own order, not the BLAS's; float64 shows the formulas agree
    tol = dict(rtol=2e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    for got, want in zip(found[True], found[False], strict=True):
        assert not np.isnan(got).any(), "every element of the packed rows is written"
        np.testing.assert_allclose(got, want, **tol)


def test_arrays_it_does_not_take_run_numpy(provide, runs):
    """Another hidden size's kernels, rows that are not contiguous blocks, a non-contiguous bias:
    declined (nothing written), the numpy step runs and gives the same values."""
    rng = np.random.default_rng(0)
    inputs, g, out, grad_out = _arrays(rng, np.float32, 4, 6, "all", False)
    provide(False)
    want = _step_both_ways(inputs, g, out.copy(), grad_out.copy())
    step = _built(LSTMStepKernels, np.float32, 6)
    other = _built(LSTMStepKernels, np.float32, 7)
    assert not other.forward(*inputs, out) and other.backward(want[0], inputs[4], g, grad_out) is None
    gapped = np.zeros((1, 4, 2 * inputs[0].shape[-1]), np.float32)[..., ::2]  # rows of strided elements
    gapped[...] = inputs[0]
    assert not step.forward(gapped, *inputs[1:], out)
    spread = np.repeat(inputs[1], 2)[::2]
    assert not step.forward(inputs[0], spread, *inputs[2:], out)
    assert step.backward(want[0], inputs[4], np.repeat(g, 2, axis=-1)[..., ::2], grad_out) is None
    assert np.isnan(out).all() and np.isnan(grad_out).all(), "a declined call writes nothing"
    provide(True)
    got = _step_both_ways((gapped, spread, *inputs[2:]), g, out, grad_out)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_compiled_lstm_cell_loop_runs_the_step_kernels_and_equals_eager(eager_on, runs, dtype):
    """Two LSTMCells looped over 12 time steps, SGD, compiled (its trips on the step kernels) against
    eager (on the recurrence kernels), over several calls."""
    _against_eager("lstm", dtype, "sgd")
    # two cells' steps per trip, forward and backward, in the calls that ran compiled
    assert runs["forward"] >= 2 * 11 and runs["backward"] >= 2 * 11


def test_a_weights_transpose_is_kept_only_while_it_is_held_unchanging():
    """``transposed`` makes w.T in C order once per ``unchanging`` context holding w (a compiled loop's
    invariants), for w itself only; outside one (or after it) each call copies again, so an in-place
    update of the weight between loop calls (an optimizer's) is read."""
    w, other = np.arange(12.0).reshape(4, 3), np.ones((4, 3))
    with recurrence_native.unchanging([w]):
        first = recurrence_native.transposed(w)
        assert recurrence_native.transposed(w) is first and first.flags.c_contiguous
        np.testing.assert_array_equal(first, w.T)
        assert recurrence_native.transposed(other) is not recurrence_native.transposed(other)
        view = w[:, :]  # another array over the same memory: not the one held
        assert recurrence_native.transposed(view) is not first
    w += 1
    after = recurrence_native.transposed(w)
    assert after is not first
    np.testing.assert_array_equal(after, w.T)
    with recurrence_native.unchanging([w]):
        np.testing.assert_array_equal(recurrence_native.transposed(w), w.T)


def _cells(update: bool):
    """(cell, step): ``step(xs, h)`` runs an LSTMCell over the steps of ``xs`` (T, B, 3) from ``(h, h)``;
    ``update``: then, without grad, twice over ``xs[0]``, with ``W_hh`` halved in place between."""
    kiln.manual_seed(0)
    cell = nn.LSTMCell(3, 4, dtype=kiln.float64)

    def step(xs, h):
        state = (h, h)
        for t in range(xs.shape[0]):
            state = cell(xs[t], state)
        if not update:
            return state
        with kiln.no_grad():
            before = cell(xs[0], state)
            cell.weight_hh.mul_(0.5)  # a new version of W_hh: its transpose is copied again
            after = cell(xs[0], state)
        return (*state, *before, *after)

    return cell, step


def test_a_traced_lstm_cell_loop_copies_w_hh_transposed_once_per_call(provide, runs, monkeypatch):
    """The step kernel's ``W_hh^T`` as the kernels read it is made once per traced call (``nn._rnn_scan_step``),
    not copied by each step's kernel (31 us a step of benchmarks' lstm_cells trace)."""
    provide(True)
    copies: list = []
    copy = recurrence_native.padded_rows
    monkeypatch.setattr(recurrence_native, "padded_rows", lambda a: (copies.append(a.shape), copy(a))[1])
    _, step = _cells(update=False)
    rng = np.random.default_rng(1)
    xs, h = kiln.from_numpy(rng.standard_normal((5, 2, 3))), kiln.from_numpy(rng.standard_normal((2, 4)))
    got = kiln.compile(step)(xs, h)  # the traced call
    assert runs["forward"] == 5, "each step ran the native step kernel"
    assert copies == [], "the kernels were handed the transpose the trace made"
    for a, b in zip(got, step(xs, h), strict=True):
        assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_a_weight_changed_in_place_within_a_traced_call_is_transposed_again(provide, runs):
    """The trace's ``W_hh^T`` is that of one version of ``W_hh``: after an in-place change within the
    call, the next step reads the new weight -- in the traced call and in the compiled ones."""
    provide(True)
    results = []
    for compiled in (True, False):
        _, step = _cells(update=True)
        fn = kiln.compile(step) if compiled else step
        rng = np.random.default_rng(2)
        calls = [(rng.standard_normal((3, 2, 3)), rng.standard_normal((2, 4))) for _ in range(3)]
        results.append([fn(kiln.from_numpy(xs), kiln.from_numpy(h)) for xs, h in calls])
    for got, want in zip(*results, strict=True):  # the first call is the traced one
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert runs["forward"] > 0
