"""The recurrence primitives (kiln/ir/primitives/recurrence.py) beyond the registry's walk: the step-by-step
array code (cupy's kernels, rnn_scan's VJP under create_graph) against numpy's in-place kernels, shape
rules over symbolic sizes and their errors, the packed layout by hand, and second-order gradients."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kiln
from kiln.frontend.dispatch import apply
from kiln.ir.dtypes import float32, float64
from kiln.ir.primitives import P, recurrence_numpy
from kiln.ir.primitives.recurrence import _INPUTS, _scan_args
from kiln.ir.primitives.recurrence_layout import MODES, ScanLayout
from kiln.ir.primitives.recurrence_numpy import scratch
from kiln.ir.types import Sym, TensorType
from tests.conftest import assert_close

SCAN, BACKWARD = P["rnn_scan"], P["rnn_scan_backward"]


class _OtherNamespace:
    """numpy under another name: the kernels take the path they take for cupy."""

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_step_code_equals_numpy_kernels(mode, reverse):
    rng = np.random.default_rng(0)
    args = _scan_args(rng, mode, 6, 3, 5)
    w_hh = args[_INPUTS[mode].index("w_hh")]
    fast = SCAN.eager(np, *args, mode=mode, reverse=reverse)
    steps = SCAN.eager(_OtherNamespace(), *args, mode=mode, reverse=reverse)
    np.testing.assert_allclose(steps, fast, rtol=1e-12, atol=1e-14)
    g = rng.normal(size=fast.shape)  # a cotangent on every part: states, finals, gates, extras
    fast_back = BACKWARD.eager(np, fast, w_hh, g, mode=mode, reverse=reverse)
    steps_back = BACKWARD.eager(_OtherNamespace(), fast, w_hh, g, mode=mode, reverse=reverse)
    np.testing.assert_allclose(steps_back, fast_back, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("cotangent", ["every part", "states only"])
def test_one_lstm_step_into_an_arena_equals_step_code(reverse, cotangent):
    """One step (an LSTMCell's, a compiled loop's trip) takes its own lean path: the same values, every
    element of ``out`` written, with and without cotangents on the gates and tanh(c)."""
    rng = np.random.default_rng(2)
    args = _scan_args(rng, "LSTM", 1, 3, 5)
    w_hh, layout = args[_INPUTS["LSTM"].index("w_hh")], ScanLayout("LSTM", 5)
    out = np.full((1, 3, layout.width), np.nan)
    SCAN.eager_into(np, *args, mode="LSTM", reverse=reverse, out=out)
    steps = SCAN.eager(_OtherNamespace(), *args, mode="LSTM", reverse=reverse)
    np.testing.assert_allclose(out, steps, rtol=1e-12, atol=1e-14)
    g = rng.normal(size=out.shape)
    if cotangent == "states only":  # as a loop body's backward gets it: h and c padded into zeros
        keep = np.zeros(layout.width, bool)
        for start, size in (layout.out(0), layout.out(1), layout.final(0), layout.prev(1)):
            keep[start : start + size] = True
        g[..., ~keep] = 0
    back = np.full((1, 3, layout.grad_width), np.nan)
    BACKWARD.eager_into(np, out, w_hh, g, mode="LSTM", reverse=reverse, out=back)
    steps_back = BACKWARD.eager(_OtherNamespace(), out, w_hh, g, mode="LSTM", reverse=reverse)
    np.testing.assert_allclose(back, steps_back, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("steps", [5, 1])
def test_backward_of_a_cotangent_in_parts_equals_the_packed_one(mode, reverse, steps):
    """rnn_scan_backward takes its cotangent one array per part of a row too (what a compiled program
    passes), the parts nobody reads as broadcast zeros, which the kernel skips: the same result as the
    whole cotangent with those parts zero. Given parts of any layout: h's as the transposed view a
    batch_first loss gives, a final state's broadcast over time as its sum's gradient is."""
    rng = np.random.default_rng(4)
    args = _scan_args(rng, mode, steps, 3, 5)
    w_hh, layout = args[_INPUTS[mode].index("w_hh")], ScanLayout(mode, 5)
    packed = SCAN.eager(np, *args, mode=mode, reverse=reverse)
    zero = lambda size: np.broadcast_to(np.zeros(()), (steps, 3, size))  # noqa: E731
    parts = [zero(size) for _, size in layout.parts]
    given = {layout.parts.index(layout.out(0)): rng.normal(size=(3, steps, 5)).transpose(1, 0, 2),
             layout.parts.index(layout.final(0)): np.broadcast_to(rng.normal(size=(3, 5)), (steps, 3, 5))}  # fmt: skip
    for k, part in given.items():
        parts[k] = part
    whole = np.concatenate([np.broadcast_to(p, p.shape) for p in parts], axis=-1)
    want = BACKWARD.eager(_OtherNamespace(), packed, w_hh, whole, mode=mode, reverse=reverse)
    for run in (BACKWARD.eager, BACKWARD.eager):  # twice: the scratch zeros are filled again
        got = run(np, packed, w_hh, *parts, mode=mode, reverse=reverse)
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(BACKWARD.eager(np, packed, w_hh, whole, mode=mode, reverse=reverse), want,
                               rtol=1e-11, atol=1e-13)  # fmt: skip
    assert not any(np.any(p) for k, p in enumerate(parts) if k not in given)  # the parts were only read


def test_no_steps_give_empty_results():
    for xp in (np, _OtherNamespace()):
        args = _scan_args(np.random.default_rng(1), "LSTM", 0, 2, 3)
        out = SCAN.eager(xp, *args, mode="LSTM", reverse=False)
        assert out.shape == (0, 2, ScanLayout("LSTM", 3).width)
        back = BACKWARD.eager(xp, out, args[_INPUTS["LSTM"].index("w_hh")], out, mode="LSTM", reverse=True)
        assert back.shape == (0, 2, ScanLayout("LSTM", 3).grad_width)


def test_layout_by_hand_for_a_two_step_elman_rnn():
    """out, final, prev and gates of rnn_scan's rows, computed here with numpy's tanh."""
    rng = np.random.default_rng(2)
    gx, h0, w = rng.normal(size=(2, 1, 2)), rng.normal(size=(1, 2)), rng.normal(size=(2, 2))
    for reverse in (False, True):
        packed = SCAN.eager(np, gx, np.zeros(2), h0, w, mode="RNN_TANH", reverse=reverse)
        first, second = (1, 0) if reverse else (0, 1)
        h1 = np.tanh(gx[first] + h0 @ w.T)
        h2 = np.tanh(gx[second] + h1 @ w.T)
        want = np.zeros((2, 1, 8))
        want[first] = np.concatenate([h1, np.zeros((1, 2)), h0, h1], -1)  # out, final, prev, gates
        want[second] = np.concatenate([h2, h2, h1, h2], -1)
        np.testing.assert_allclose(packed, want, rtol=1e-14)


@pytest.mark.parametrize("mode", MODES)
def test_shape_rules_keep_symbolic_steps_and_batch(mode):
    steps, batch = Sym("T"), Sym("B")
    hidden, gates = 3, {"LSTM": 12, "GRU": 9}.get(mode, 3)
    shapes = {"gx": (steps, batch, gates), "bias": (gates,), "h0": (batch, hidden), "c0": (batch, hidden),
              "w_hh": (gates, hidden), "b_hn": (hidden,)}  # fmt: skip
    types = [TensorType(shapes[name], float32) for name in _INPUTS[mode]]
    layout = ScanLayout(mode, hidden)
    out = SCAN.infer(*types, mode=mode, reverse=True)
    assert out.shape == (steps, batch, layout.width)
    back = BACKWARD.infer(out, types[_INPUTS[mode].index("w_hh")], out, mode=mode, reverse=True)
    assert back.shape == (steps, batch, layout.grad_width)


def test_shape_rule_errors_say_what_was_expected():
    f32 = lambda *shape: TensorType(shape, float32)  # noqa: E731
    with pytest.raises(RuntimeError, match=r"expected w_hh of shape \[4 \* hidden, hidden\], got \[8, 3\]"):
        SCAN.infer(f32(5, 2, 12), f32(12), f32(2, 3), f32(2, 3), f32(8, 3), mode="LSTM", reverse=False)
    with pytest.raises(RuntimeError, match=r"expected h0 of shape \[2, 3\], got \[4, 3\]"):
        SCAN.infer(f32(5, 2, 3), f32(3), f32(4, 3), f32(3, 3), mode="RNN_TANH", reverse=False)
    with pytest.raises(RuntimeError, match=r"expected bias of shape \[9\], got \[3\]"):
        SCAN.infer(f32(5, 2, 9), f32(3), f32(2, 3), f32(9, 3), f32(3), mode="GRU", reverse=False)
    with pytest.raises(TypeError, match=r"takes 5 inputs \(gx, bias, h0, w_hh, b_hn\), got 4"):
        SCAN.infer(f32(5, 2, 9), f32(9), f32(2, 3), f32(9, 3), mode="GRU", reverse=False)
    with pytest.raises(TypeError, match="one dtype on one device.*h0: float64"):
        SCAN.infer(f32(5, 2, 3), f32(3), TensorType((2, 3), float64), f32(3, 3), mode="RNN_RELU", reverse=False)
    with pytest.raises(ValueError, match="mode must be one of LSTM, GRU, RNN_TANH, RNN_RELU, got 'gru'"):
        SCAN.infer(f32(5, 2, 9), f32(9), f32(2, 3), f32(9, 3), f32(3), mode="gru", reverse=False)
    with pytest.raises(RuntimeError, match=r"expected g of shape \[5, 2, 4\]"):
        BACKWARD.infer(f32(5, 2, 4), f32(1, 1), f32(5, 2, 3), mode="RNN_TANH", reverse=False)
    with pytest.raises(RuntimeError, match=r"expected g's part 3 of shape \[5, 2, 1\], got \[5, 2, 2\]"):
        BACKWARD.infer(f32(5, 2, 4), f32(1, 1), *[f32(5, 2, 1)] * 3, f32(5, 2, 2), mode="RNN_TANH", reverse=False)
    with pytest.raises(TypeError, match=r"the cotangent whole or in 4 parts, got 2 arrays"):
        BACKWARD.infer(f32(5, 2, 4), f32(1, 1), f32(5, 2, 1), f32(5, 2, 3), mode="RNN_TANH", reverse=False)


@pytest.mark.parametrize("mode", MODES)
def test_second_order_gradients_through_the_scan(mode):
    """Under create_graph the VJP runs the backward through time as kiln ops: gradgradcheck in float64."""
    rng = np.random.default_rng(3)
    args = [kiln.from_numpy(a).requires_grad_() for a in _scan_args(rng, mode, 3, 2, 2)]
    fn = lambda *xs: apply(SCAN, *xs, mode=mode, reverse=mode == "GRU")  # noqa: E731
    assert kiln.autograd.gradgradcheck(fn, args, atol=1e-6, rtol=1e-4)


def test_first_order_gradients_agree_with_and_without_create_graph():
    rng = np.random.default_rng(4)
    for mode in MODES:
        args = [kiln.from_numpy(a).requires_grad_() for a in _scan_args(rng, mode, 4, 3, 2)]
        out = apply(SCAN, *args, mode=mode, reverse=True)
        g = kiln.from_numpy(rng.normal(size=tuple(out.shape)))
        plain = kiln.autograd.grad(out, args, g, retain_graph=True)
        graph = kiln.autograd.grad(out, args, g, create_graph=True)
        assert all(t.requires_grad for t in graph)
        for a, b in zip(plain, graph, strict=True):
            assert_close(a, b.detach(), rtol=1e-12, atol=1e-13)


def test_scratch_reuses_memory_by_name_dtype_and_thread():
    a = scratch("test.a", (4, 5), np.float32)
    assert a.shape == (4, 5) and a.dtype == np.float32 and a.flags.c_contiguous
    smaller = scratch("test.a", (3, 2), np.float32)
    assert smaller.shape == (3, 2) and np.shares_memory(a, smaller)  # fits: the same memory
    assert not np.shares_memory(a, scratch("test.b", (4, 5), np.float32))  # another name
    assert not np.shares_memory(a, scratch("test.a", (4, 5), np.float64))  # another dtype
    larger = scratch("test.a", (6, 5), np.float64)
    assert larger.shape == (6, 5) and np.shares_memory(larger, scratch("test.a", (2,), np.float64))
    other = []
    thread = threading.Thread(target=lambda: other.append(scratch("test.a", (2,), np.float64)))
    thread.start()
    thread.join()
    assert not np.shares_memory(larger, other[0])  # each thread its own


def test_scratch_keeps_no_large_arrays(monkeypatch):
    monkeypatch.setattr(recurrence_numpy, "SCRATCH_KEEP_BYTES", 64)
    kept = scratch("test.c", (16,), np.float32)  # 64 bytes: kept
    assert np.shares_memory(kept, scratch("test.c", (16,), np.float32))
    big = scratch("test.c", (17,), np.float32)
    assert big.shape == (17,) and not np.shares_memory(big, scratch("test.c", (17,), np.float32))
    assert np.shares_memory(kept, scratch("test.c", (4, 4), np.float32))  # the kept one is still there
