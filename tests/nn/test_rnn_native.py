"""The native LSTM and GRU recurrences (kiln/codegen/llvm/recurrence*.py, behind recurrence_numpy's kernels):
equal to the numpy kernels it replaces -- the kernels alone on rnn_scan's packed layout, eager
layers, compiled programs, finite differences -- and actually run (counted); arrays it does not
take, a compile still running and a compile that fails all leave numpy to run."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.codegen.llvm import engine
from kiln.codegen.llvm import recurrence_call as native
from kiln.codegen.llvm.recurrence_call import GRUKernels, LSTMKernels, LSTMStepKernels
from kiln.frontend import eager_kernels, eager_recurrence
from kiln.ir.primitives import P, recurrence_native, recurrence_numpy
from kiln.ir.primitives.recurrence import _INPUTS, _scan_args
from kiln.ir.primitives.recurrence_layout import ScanLayout
from kiln.nn import _rnn
from kiln.runtime import threads
from kiln.runtime.threads import SmallProducts
from tests.conftest import assert_close

SCAN, BACKWARD = P["rnn_scan"], P["rnn_scan_backward"]
_BUILT: dict = {}


CLASSES = {"LSTM": LSTMKernels, "GRU": GRUKernels, "LSTM_STEP": LSTMStepKernels}


@pytest.fixture
def runs(monkeypatch):
    """Counts of native forward and backward runs (either mode) that took their arrays."""
    counts = {"forward": 0, "backward": 0}

    def counted(method, took):
        def run(self, *args):
            result = method(self, *args)
            counts[method.__name__] += took(result)
            return result

        return run

    for cls in CLASSES.values():
        monkeypatch.setattr(cls, "forward", counted(cls.forward, bool))
        monkeypatch.setattr(cls, "backward", counted(cls.backward, lambda grads: grads is not None))
    return counts


def _built(mode: str, dtype, hidden: int):
    key = (mode, np.dtype(dtype), hidden)
    if key not in _BUILT:
        _BUILT[key] = CLASSES[mode].build(dtype, hidden)
    return _BUILT[key]


@pytest.fixture
def direct():
    """Native kernels installed straight from the code generator (no eager-kernel cache); use(False) removes them."""

    def use(on: bool) -> None:
        recurrence_native.install((lambda mode, dtype, hidden, steps: _built(mode, dtype, hidden)) if on else None)

    yield use
    recurrence_native.install(eager_recurrence.native, SmallProducts)


def _scan_both(direct, mode, args, reverse, g):
    w_hh = args[_INPUTS[mode].index("w_hh")]
    out = {}
    for on in (False, True):
        direct(on)
        packed = SCAN.eager(np, *args, mode=mode, reverse=reverse)
        out[on] = (packed, BACKWARD.eager(np, packed, w_hh, g, mode=mode, reverse=reverse))
    return out


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
# batches of 13 and 15: a product's tile of 8 rows, then the rows left as tiles of 4, 2 and 1 (small_gemm);
# hidden 32 and 64: W_hh^T's rows a multiple of 1 KiB apart, which the kernels read padded (padded_rows)
@pytest.mark.parametrize(("steps", "batch", "hidden"), [(6, 3, 5), (1, 1, 4), (3, 2, 1), (5, 4, 19), (3, 13, 6),
                                                        (2, 15, 3), (4, 3, 64), (3, 2, 32)])  # fmt: skip
@pytest.mark.parametrize("cotangent", ["all", "no gates", "states only"])
def test_kernels_equal_numpy_on_the_packed_layout(
    direct, runs, monkeypatch, mode, dtype, reverse, steps, batch, hidden, cotangent
):
    """rnn_scan and its backward (strided rows of the packed output, reversed views) with and without
    a cotangent on the gate activations (the backward's ``eA``) and on the extra block (an LSTM's
    tanh(c), a GRU's ``hn``: its ``g_hn``); one step too, which runs on numpy by default."""
    monkeypatch.setattr(recurrence_native, "MIN_STEPS", 1)
    rng = np.random.default_rng(steps * 100 + hidden)
    args = tuple(a.astype(dtype) for a in _scan_args(rng, mode, steps, batch, hidden))
    layout = ScanLayout(mode, hidden)
    g = rng.normal(size=(steps, batch, layout.width)).astype(dtype)
    for span in {"all": [], "no gates": [layout.gate_span], "states only": [layout.gate_span, layout.extra]}[cotangent]:
        g[..., span[0] : span[0] + span[1]] = 0
    out = _scan_both(direct, mode, args, reverse, g)
    # float32: the native step product sums in its own order, not the BLAS's (one GRU gradient element
    # of ~0.03 differed by 3.5e-6 after five steps; sums of 64 terms, 5e-5); float64 shows the formulas
    # are the same
    scale = max(1.0, hidden / 16)
    tol = dict(rtol=2e-5 * scale, atol=1e-5 * scale) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(out[True][0], out[False][0], **tol)
    np.testing.assert_allclose(out[True][1], out[False][1], **tol)
    assert runs == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_a_few_steps_over_a_large_weight_stay_on_numpy(direct, runs, mode):
    """Copying a large W_hh^T into the kernels' layout costs more than a few steps gain (a language
    model sampling a word per call): numpy's product reads the weight where it lies, the same values."""
    direct(True)
    hidden = 512  # W_hh of 4 x 512 x 512 elements: COPIED_FROM or more
    rnn = (nn.LSTM if mode == "LSTM" else nn.GRU)(8, hidden, dtype=kiln.float64)
    x = kiln.from_numpy(np.random.default_rng(0).standard_normal((1, 2, 8)))
    one_step = rnn(x)[0]
    assert runs == {"forward": 0, "backward": 0}
    long = rnn(kiln.cat([x] * recurrence_numpy.COPY_PAYS_STEPS))[0]
    assert runs["forward"] == 1
    assert_close(one_step, long[:1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("reverse", [False, True])
def test_kernels_take_a_cotangent_in_parts(direct, runs, mode, reverse):
    """A compiled program's cotangent, one array per part of a row (h's gradient a transposed view, the
    others broadcast zeros), runs native too, h's gradient read where it lies: the numpy kernels' result."""
    rng = np.random.default_rng(5)
    args = _scan_args(rng, mode, 7, 3, 6)
    w_hh, layout = args[_INPUTS[mode].index("w_hh")], ScanLayout(mode, 6)
    parts = [np.broadcast_to(np.zeros(()), (7, 3, size)) for _, size in layout.parts]
    parts[0] = rng.normal(size=(3, 7, 6)).transpose(1, 0, 2)  # h's: rows of 6 contiguous, strided steps
    out = {}
    for on in (False, True):
        direct(on)
        packed = SCAN.eager(np, *args, mode=mode, reverse=reverse)
        out[on] = BACKWARD.eager(np, packed, w_hh, *parts, mode=mode, reverse=reverse)
    np.testing.assert_allclose(out[True], out[False], rtol=1e-12, atol=1e-13)
    assert runs == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_backward_variants_for_gate_cotangents_compile_at_their_first_call(direct, mode):
    """``build`` compiles the forward and the plain backward only: the variants for a cotangent of the
    gate activations (a GRU's ``hn`` too), which the layers never give, compile when first run."""
    kernels = CLASSES[mode].build(np.float64, 6)
    assert set(kernels.functions) == set(kernels.FUNCTIONS) - kernels.LAZY and kernels.LAZY
    rng = np.random.default_rng(3)
    args = _scan_args(rng, mode, 4, 2, 6)
    direct(False)
    packed = SCAN.eager(np, *args, mode=mode, reverse=False)
    g = rng.normal(size=packed.shape)  # on every part, the gates' among them
    expected = BACKWARD.eager(np, packed, args[_INPUTS[mode].index("w_hh")], g, mode=mode, reverse=False)
    recurrence_native.install(lambda *_: kernels)
    got = BACKWARD.eager(np, packed, args[_INPUTS[mode].index("w_hh")], g, mode=mode, reverse=False)
    loaded = {name for name in kernels.LAZY if name in kernels.functions}
    assert loaded == {"LSTM": {"lstm_backward_tangents"}, "GRU": {"gru_backward_tangents_g_hn"}}[mode]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13)


def test_no_steps_write_nothing(direct, runs):
    direct(True)
    args = _scan_args(np.random.default_rng(0), "LSTM", 0, 2, 3)
    assert SCAN.eager(np, *args, mode="LSTM", reverse=False).shape == (0, 2, ScanLayout("LSTM", 3).width)
    A, hs = np.zeros((0, 2, 4, 3)), np.zeros((0, 2, 3))
    assert _built("LSTM", np.float64, 3).forward(A, args[2], args[3], hs, hs, hs, args[4].T)
    assert _built("LSTM", np.float64, 3).backward(A, hs, hs, args[4], hs, hs, None, A) is None


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("gx_rows", ["plain", "strided elements"])
def test_native_forward_reads_the_input_projection_where_it_lies(direct, runs, mode, reverse, gx_rows):
    """A forward given ``gx`` and ``bias`` (rnn_scan's) reads ``gx + bias`` as its pre-activations: ``A``
    (NaN on entry here) is only written, with the gate activations. ``gx`` whose rows the kernel does
    not take is added into ``A`` first; either way the numpy kernel's result."""
    rng = np.random.default_rng(6)
    steps, batch, hidden, gates = 5, 3, 4, 4 if mode == "LSTM" else 3
    h0, c0, w_hh = rng.normal(size=(batch, hidden)), rng.normal(size=(batch, hidden)), rng.normal(size=(gates * 4, 4))
    width = gates * hidden
    gx = rng.normal(size=(steps, batch, 2 * width))[..., ::2] if gx_rows == "strided elements" else \
        rng.normal(size=(steps, batch, width))  # fmt: skip
    gx, bias, b_hn = (gx[::-1] if reverse else gx), rng.normal(size=width), rng.normal(size=hidden)
    results = {}
    for on in (False, True):
        direct(on)
        A = np.full((steps, batch, gates, hidden), np.nan)
        states = [np.empty((steps, batch, hidden)) for _ in range(3 if mode == "LSTM" else 2)]
        if mode == "LSTM":
            recurrence_numpy.lstm_forward(A, h0, c0, *states, w_hh.T, gx, bias)
        else:
            recurrence_numpy.gru_forward(A, h0, *states, w_hh.T, b_hn, gx, bias)
        results[on] = [A, *states]
    for got, want in zip(results[True], results[False], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    assert runs["forward"] == 1


@pytest.mark.parametrize("reverse", [False, True])
def test_native_lstm_scan_writes_every_element_of_an_arena(direct, runs, reverse):
    """rnn_scan into a NaN-filled arena: the native LSTM kernel writes the packed output's prev and final
    rows itself, as the steps go; every element is written, the numpy kernels' values."""
    rng = np.random.default_rng(7)
    args = _scan_args(rng, "LSTM", 6, 3, 5)
    out = {}
    for on in (False, True):
        direct(on)
        out[on] = np.full((6, 3, ScanLayout("LSTM", 5).width), np.nan)
        SCAN.eager_into(np, *args, mode="LSTM", reverse=reverse, out=out[on])
    assert not np.isnan(out[True]).any()
    np.testing.assert_allclose(out[True], out[False], rtol=1e-12, atol=1e-13)
    assert runs["forward"] == 1


def test_packed_rows_the_kernel_does_not_take_are_filled_by_numpy(direct, runs):
    """prev/final views whose rows are not plain (strided elements): the native forward runs, and numpy
    fills them after it."""
    rng = np.random.default_rng(8)
    steps, batch, hidden = 4, 2, 3
    h0, c0, w_hh = rng.normal(size=(batch, hidden)), rng.normal(size=(batch, hidden)), rng.normal(size=(12, 3))
    gates = rng.normal(size=(steps, batch, 4, hidden))
    results = {}
    for on in (False, True):
        direct(on)
        A, states = gates.copy(), [np.empty((steps, batch, hidden)) for _ in range(3)]
        packed = tuple(np.full((steps, batch, 2 * hidden), np.nan)[..., ::2] for _ in range(4))
        recurrence_numpy.lstm_forward(A, h0, c0, *states, w_hh.T, packed=packed)
        results[on] = [A, *states, *packed]
    for got, want in zip(results[True], results[False], strict=True):
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(results[True][4][0], h0)  # prev h's first row: the initial state
    assert runs["forward"] == 1


def test_arrays_it_does_not_take_run_numpy(direct, runs):
    """Rows that are not contiguous blocks, another dtype, another hidden size: False/None, nothing written."""
    rng = np.random.default_rng(1)
    kernels = _built("LSTM", np.float64, 3)
    h0, c0, w_hh = rng.normal(size=(2, 3)), rng.normal(size=(2, 3)), rng.normal(size=(12, 3))
    gates = rng.normal(size=(4, 2, 4, 3))
    hs, cs, tanh_c = (np.full((4, 2, 6), 7.0)[..., ::2] for _ in range(3))  # rows of strided elements
    assert not kernels.forward(gates, h0, c0, hs, cs, tanh_c, w_hh.T)
    contiguous = [np.full((4, 2, 3), 7.0) for _ in range(3)]
    assert not kernels.forward(gates.astype(np.float32), h0, c0, *contiguous, w_hh.T)
    assert not _built("LSTM", np.float64, 4).forward(gates, h0, c0, *contiguous, w_hh.T)
    assert (hs == 7).all() and all((a == 7).all() for a in contiguous)
    assert runs["forward"] == 0
    # through lstm_forward: numpy runs, with the native kernels installed
    direct(True)
    want = [np.empty_like(hs) for _ in range(3)]
    gates_numpy = gates.copy()
    recurrence_native.install(None)
    recurrence_numpy.lstm_forward(gates_numpy, h0, c0, *want, w_hh.T)
    direct(True)
    recurrence_numpy.lstm_forward(gates, h0, c0, hs, cs, tanh_c, w_hh.T)
    for got, expected in zip((hs, cs, tanh_c, gates), (*want, gates_numpy), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-14)


OPTIONS = [dict(num_layers=2, bidirectional=True), dict(num_layers=1, batch_first=True), dict(num_layers=2, bias=False)]


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize(("steps", "batch", "with_state"), [(5, 3, True), (1, 1, False), (4, 1, True), (6, 2, False)])
def test_eager_layers_run_native_and_equal_numpy(eager_on, runs, mode, dtype, options, steps, batch, with_state):
    kiln.manual_seed(0)
    module = (nn.LSTM if mode == "LSTM" else nn.GRU)(3, 6, **options, dtype=dtype)
    rng = np.random.default_rng(steps)
    lead = (batch, steps) if options.get("batch_first") else (steps, batch)
    x = kiln.from_numpy(rng.normal(size=(*lead, 3)).astype(dtype.name)).requires_grad_()
    rows = options["num_layers"] * (2 if options.get("bidirectional") else 1)
    states = [kiln.from_numpy(rng.normal(size=(rows, batch, 6)).astype(dtype.name)).requires_grad_()
              for _ in range(2 if mode == "LSTM" else 1)] if with_state else []  # fmt: skip
    results = []
    for on in (False, True):
        eager_kernels.set_enabled(on)
        leaves = [x, *module.parameters(), *states]
        for t in leaves:
            t.grad = None
        given = (tuple(states) if mode == "LSTM" else states[0]) if states else None
        y, finals = module(x, given)
        finals = finals if mode == "LSTM" else (finals,)
        (y.sum() + sum(((s * s) * (k + 1)).sum() for k, s in enumerate(finals))).backward()
        results.append([y.detach(), *(s.detach() for s in finals), *(t.grad for t in leaves)])
    tol = dict(rtol=1e-4, atol=1e-5) if dtype is kiln.float32 else dict(rtol=1e-11, atol=1e-12)
    for got, want in zip(*reversed(results), strict=True):
        assert_close(got, want, **tol)
    expected = rows if steps >= recurrence_native.MIN_STEPS else 0
    assert runs == {"forward": expected, "backward": expected}


def test_one_step_runs_native(eager_on, runs):
    """A cell's step (one time step) runs the native kernels too: their call costs less than numpy's ufuncs."""
    kiln.manual_seed(0)
    cell = nn.LSTMCell(3, 5)
    h, c = cell(kiln.randn(2, 3, requires_grad=True))
    ((h * h).sum() + (c * c).sum()).backward()  # (a plain sum's gradient is a broadcast: numpy takes it)
    assert runs == {"forward": 1, "backward": 1}
    lstm = nn.LSTM(3, 5)
    lstm(kiln.randn(1, 2, 3, requires_grad=True))[0].sum().backward()
    assert runs == {"forward": 2, "backward": 2}


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("directions", [1, 2])
def test_gradcheck_through_the_native_kernels(eager_on, runs, mode, directions):
    rng = np.random.default_rng(4)

    def leaf(*shape):
        return kiln.from_numpy(rng.standard_normal(shape) * 0.6).requires_grad_()

    x = leaf(4, 2, 3)
    states, gates = (2, 12) if mode == "LSTM" else (1, 9)
    per_direction = [([leaf(2, 3) for _ in range(states)], [leaf(gates, 3), leaf(gates, 3), leaf(gates), leaf(gates)])
                     for _ in range(directions)]  # fmt: skip
    flat = [t for state, weights in per_direction for t in (*state, *weights)]
    size = states + 4

    def fn(x, *flat):
        groups = [flat[d * size : (d + 1) * size] for d in range(directions)]
        y, finals = _rnn.fused_layer(mode, x, [tuple(g[:states]) for g in groups], [tuple(g[states:]) for g in groups])
        return (y, *(s for state in finals for s in state))

    assert kiln.autograd.gradcheck(fn, (x, *flat))
    assert runs["forward"] > 0 and runs["backward"] > 0


def _compiled_steps(mode: str, calls: int = 3) -> list:
    """A compiled training step of a bidirectional 2-layer LSTM (GRU): its loss, final state and
    gradients per call."""
    kiln.manual_seed(0)
    layer, head = (nn.LSTM if mode == "LSTM" else nn.GRU)(4, 8, num_layers=2, bidirectional=True), nn.Linear(16, 1)
    params = [*layer.parameters(), *head.parameters()]

    @kiln.compile
    def step(x, h, c):
        y, finals = layer(x, (h, c) if mode == "LSTM" else h)
        last = finals[1] if mode == "LSTM" else finals
        loss = head(y).pow(2).mean() + last.sum() * 0.1
        return loss, last, kiln.autograd.grad(loss, params)

    rng = np.random.default_rng(0)
    got = []
    for _ in range(calls):
        x, h, c = (kiln.from_numpy(rng.normal(size=s).astype(np.float32)) for s in ((7, 3, 4), (4, 3, 8), (4, 3, 8)))
        loss, c2, grads = step(x, h, c)
        got.append([loss, c2, *grads])
    return got


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_compiled_step_runs_native_and_equals_numpy(eager_on, runs, mode):
    """rnn_scan and rnn_scan_backward in a compiled training step (their packed layout, the
    program's arena), over several calls."""
    eager_kernels.set_enabled(False)
    on_numpy = _compiled_steps(mode)
    eager_kernels.set_enabled(True)
    on_native = _compiled_steps(mode)
    for native_call, numpy_call in zip(on_native, on_numpy, strict=True):
        for a, b in zip(native_call, numpy_call, strict=True):
            assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert runs["forward"] >= 3 * 4 and runs["backward"] >= 3 * 4


def test_background_compile_runs_numpy_meanwhile(eager_on, runs, monkeypatch):
    monkeypatch.setattr(eager_kernels.CACHE, "synchronous", False)
    dtype = np.dtype(np.float64)
    assert eager_recurrence.native("LSTM", dtype, 7, 5) is None  # the miss queues the compile
    assert eager_kernels.wait(60)
    kernels = eager_recurrence.native("LSTM", dtype, 7, 5)
    assert isinstance(kernels, LSTMKernels) and kernels.hidden == 7
    assert eager_recurrence.native("LSTM", np.dtype(np.float16), 7, 5) is None  # numpy's dtypes only
    eager_kernels.set_enabled(False)
    assert eager_recurrence.native("LSTM", dtype, 7, 5) is None


@pytest.mark.parametrize("queued", [False, True])
def test_a_long_recurrence_waits_for_its_native_kernels(eager_on, runs, monkeypatch, queued):
    """A recurrence of WAIT_STEPS steps or more runs native at its first call: compiled in the caller's
    thread on a miss, or waited for while the worker compiles it (a numpy loop over hundreds of steps,
    beside a compile in another thread, cost an LSTM LM's first call at T=350 a quarter of a second)."""
    monkeypatch.setattr(eager_kernels.CACHE, "synchronous", False)
    dtype, steps = np.dtype(np.float64), eager_recurrence.WAIT_STEPS
    if queued:  # a short one's miss queued the compile first: the long one waits for the worker's
        assert eager_recurrence.native("GRU", dtype, 6, steps - 1) is None
    kernels = eager_recurrence.native("GRU", dtype, 6, steps)
    assert isinstance(kernels, GRUKernels) and kernels.hidden == 6
    assert eager_recurrence.native("GRU", dtype, 6, 1) is kernels
    kiln.manual_seed(0)
    lstm = nn.LSTM(2, 9, dtype=kiln.float64)
    before = runs["forward"]
    lstm(kiln.randn(steps, 2, 2, dtype=kiln.float64))  # its first call, no compile made for H=9 before
    assert runs["forward"] == before + 1


def test_a_long_recurrence_compiles_its_kernels_itself_while_they_wait_in_the_queue(eager_on, monkeypatch):
    """A compile queued behind others (here one that never ends until released) is taken over by the long
    recurrence that needs it, and the worker then skips it."""
    monkeypatch.setattr(eager_kernels.CACHE, "synchronous", False)
    release, built, ended = threading.Event(), [], []

    def blocking() -> eager_kernels.Entry:
        release.wait(20)
        ended.append(True)
        return eager_kernels.Entry(reason="a test's key")

    original = GRUKernels.build

    def build(cls, dtype, hidden):
        built.append(hidden)
        return original(dtype, hidden)

    monkeypatch.setattr(GRUKernels, "build", classmethod(build))
    try:
        assert eager_kernels.ready("test", ("test",), blocking) is None  # the worker is held by it
        dtype, steps = np.dtype(np.float64), eager_recurrence.WAIT_STEPS
        assert eager_recurrence.native("GRU", dtype, 6, 2) is None  # queued behind the held key
        kernels = eager_recurrence.native("GRU", dtype, 6, steps)
        assert not ended  # it did not wait for the keys ahead of its own
        assert isinstance(kernels, GRUKernels) and built == [6]
    finally:
        release.set()
    assert eager_kernels.wait(60)
    assert built == [6] and eager_recurrence.native("GRU", dtype, 6, 2) is kernels


def test_a_failed_compile_is_said_once_and_numpy_runs(eager_on, runs, monkeypatch):
    def fail(cls, dtype, hidden):
        raise RuntimeError("LLVM said no")

    monkeypatch.setattr(LSTMKernels, "build", classmethod(fail))
    kiln.manual_seed(0)
    lstm = nn.LSTM(3, 5)
    x = kiln.randn(4, 2, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y1, _ = lstm(x)
        y2, _ = lstm(x)
    said = [str(w.message) for w in caught if issubclass(w.category, kiln.CompileWarning)]
    assert len(said) == 1 and "lstm recurrence" in said[0] and "LLVM said no" in said[0], said
    eager_kernels.set_enabled(False)
    # (to rounding: the input projection still ran on kiln's product kernel, whose compile did not fail)
    assert_close(y1, lstm(x)[0], rtol=1e-5, atol=1e-6)
    assert_close(y2, y1, rtol=0, atol=0)
    assert runs["forward"] == 0


def test_a_second_build_loads_from_the_disk_cache(monkeypatch):
    LSTMKernels.build(np.float32, 11)

    def no_compile(texts, timeout=None):
        raise AssertionError(f"compiled {len(texts)} module(s) again")

    monkeypatch.setattr(engine, "compile_many", no_compile)
    kernels = LSTMKernels.build(np.float32, 11)
    assert kernels.hidden == 11 and native.FORMAT >= 1


@pytest.mark.parametrize("cls", [LSTMKernels, GRUKernels])
def test_a_disk_cache_hit_generates_no_ir(monkeypatch, cls):
    """The cache keys name the functions (the code generating them is in the key), so a hit does not
    generate their IR to hash it (20 ms of an LSTM's, at each process's first call)."""
    cls.build(np.float64, 13)

    def no_ir(*args, **kwargs):
        raise AssertionError("generated IR for a cached function")

    monkeypatch.setattr(cls, "FUNCTIONS", {name: no_ir for name in cls.FUNCTIONS})
    kernels = cls.build(np.float64, 13)
    assert set(kernels.functions) == set(cls.FUNCTIONS) - cls.LAZY


@pytest.mark.parametrize("compiled", [False, True])
def test_numpy_kernels_run_their_small_products_on_one_blas_thread(monkeypatch, compiled):
    """An Elman RNN's per-step products (numpy's kernels: no native one) run on one BLAS thread, eager and in a
    compiled program, and the count is restored after; a large product keeps every thread."""
    threads._find_blas()
    if threads._blas.get_threads is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS that threadpoolctl finds")
    seen = []
    for name in ("rnn_forward", "rnn_backward"):
        kernel = getattr(recurrence_numpy, name)

        def counted(*args, _kernel=kernel):
            seen.append(threads._blas.get_threads())
            return _kernel(*args)

        monkeypatch.setattr(recurrence_numpy, name, counted)
    before = threads.get_num_threads()
    kiln.set_num_threads(2)
    try:
        rnn = nn.RNN(3, 5)
        run = kiln.compile(lambda x: rnn(x)[0].sum()) if compiled else (lambda x: rnn(x)[0].sum())
        x = kiln.randn(4, 2, 3)
        for _ in range(2):
            rnn.zero_grad()
            run(x).backward()
        assert seen and set(seen) == {1}, seen
        assert threads._blas.get_threads() == 2
        with SmallProducts(threads.BLAS_MIN_PARALLEL_MACS):
            assert threads._blas.get_threads() == 2
    finally:
        kiln.set_num_threads(before)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch", [16, 17, 27])
def test_a_recurrence_splits_its_batch_rows_over_threads(direct, runs, monkeypatch, mode, dtype, reverse, batch):
    """Each batch row's recurrence reads its own rows only, so blocks of rows run on the threads as
    calls of their own (``_row_blocks``: the arrays moved to the block's first row, the step's scratch
    and the backward's carried state too), on the native pool (``spin``): the numpy kernels' result,
    and the split actually made."""
    for name in ("PARALLEL_MIN_WORK_BYTES", "NATIVE_MIN_WORK_BYTES", "WAKE_MIN_WORK_BYTES"):
        monkeypatch.setattr(threads, name, 0)
    monkeypatch.setattr(threads, "min_work_bytes", lambda spin: 0)
    monkeypatch.setattr(recurrence_native, "MIN_STEPS", 1)
    tables, spins = [], []
    row_blocks, parallel_for = native._row_blocks, threads.parallel_for
    monkeypatch.setattr(native, "_row_blocks", lambda *args: tables.append(row_blocks(*args)) or tables[-1])

    def spied(kernel, args, extent, work, spin=False):
        spins.append(spin)
        return parallel_for(kernel, args, extent, work, spin)

    monkeypatch.setattr(threads, "parallel_for", spied)
    previous = threads.get_num_threads()
    threads.set_num_threads(2)
    try:
        rng = np.random.default_rng(batch)
        args = tuple(a.astype(dtype) for a in _scan_args(rng, mode, 9, batch, 12))
        g = rng.normal(size=(9, batch, ScanLayout(mode, 12).width)).astype(dtype)
        out = _scan_both(direct, mode, args, reverse, g)
    finally:
        threads.set_num_threads(previous)
    tol = dict(rtol=2e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(out[True][0], out[False][0], **tol)
    np.testing.assert_allclose(out[True][1], out[False][1], **tol)
    assert runs == {"forward": 1, "backward": 1}
    half = batch // 2
    assert [t[:, 1].tolist() for t in tables] == [[half, batch - half]] * 2  # forward and backward, two blocks each
    assert spins == [True, True]
