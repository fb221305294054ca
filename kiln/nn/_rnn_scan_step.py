"""One step of ``nn.LSTMCell``/``nn.GRUCell``/``nn.RNNCell`` as the ``rnn_scan`` primitive over one time
step, with a backward written for one step: what a trace records of a cell (and what a step runs off
the CPU).

A cell looped in Python over T time steps is traced T times, so every node of its step is recorded,
printed into the cache key, rolled into a loop and kept alive T times over. Through the layer's path
(``_rnn.scan_direction`` and the ``rnn_scan`` VJP, written for T steps) a traced LSTM cell step was
about 40 nodes: the layer's output (sliced and copied, and dead), the input projection over a (1, B,
in) sequence and its gradients through reshapes of it, the packed cotangent as a pad per state and
their sum, the gradients of the gate pre-activations copied contiguous, ``dW_hh`` from the previous
states sliced out of the packed output. Here, with T = 1 known: the previous state is the step's input
``h``, the gradients are products of 2-D arrays (``dW = dz^T x``, no transposes of the result), the
cotangent of both new states is one pad of their concatenation, and nothing is copied. Two LSTM cells
and a Linear head looped over time (benchmarks' lstm_cells): 94 traced nodes per step before, 70 now.

Its backward under ``create_graph`` (or wherever grad mode is on while it runs) differentiates the
layer's path instead (``_rnn._recomputed_grads``), whose VJP is exact to any order, as
``_rnn_step.CellStepBackward`` does.
"""

from __future__ import annotations

import kiln
from kiln.frontend.dispatch import apply
from kiln.ir.primitives import P
from kiln.ir.primitives.recurrence_layout import ScanLayout

from . import _rnn

__all__ = ["scan_step"]

_SCAN, _SCAN_BACKWARD, _PAD = P["rnn_scan"], P["rnn_scan_backward"], P["pad"]


def scan_step(mode: str, x, states: list, weights: tuple) -> tuple:
    """The new state tuple ((h,), or an LSTM's (h, c)) of one step over ``x`` (B, in) from ``states``
    (B, H) with ``weights`` (w_ih, w_hh, b_ih, b_hh; biases may be None)."""
    has_bias = weights[2] is not None
    flat = (*states, *(weights if has_bias else weights[:2]))
    spec = _rnn._Spec(mode, 1, len(states), has_bias, False)
    return _ScanStep.apply(spec, x, *flat)


class _ScanStep(kiln.autograd.Function):
    """``apply(spec, x, *states, w_ih, w_hh[, b_ih, b_hh])`` -> the new states."""

    @staticmethod
    def forward(ctx, spec: _rnn._Spec, x, *flat):
        states, (w_ih, w_hh, b_ih, b_hh) = spec.split(flat)[0]
        layout = ScanLayout(spec.mode, w_hh.shape[1])
        bias, extra = _scan_biases(spec.mode, layout, x, b_ih, b_hh)
        gx = kiln.matmul(x, w_ih.transpose(0, 1)).unsqueeze(0)
        packed = apply(_SCAN, gx, bias, *states, w_hh, *extra, mode=spec.mode, reverse=False)
        ctx.save_for_backward(x, *flat, packed)
        ctx.spec = spec
        # new memory (a sum over the one step), not views of the packed output the backward reads
        return tuple(packed.narrow(-1, *layout.final(s)).sum(0) for s in range(layout.states))

    @staticmethod
    def backward(ctx, *grads):
        spec = ctx.spec
        saved = ctx.saved_tensors
        inputs, packed = saved[:-1], saved[-1]
        needs = ctx.needs_input_grad[1:]
        if kiln.is_grad_enabled():  # create_graph: a backward that autograd can differentiate again
            zeros = lambda: kiln.zeros_like(inputs[1])  # noqa: E731 - a new state that no loss reads
            grads = tuple(zeros() if g is None else g for g in grads)
            return (None, *_rnn._recomputed_grads(spec, inputs, grads, needs))
        return (None, *_step_grads(spec, inputs, packed, grads, needs))


def _scan_biases(mode: str, layout: ScanLayout, x, b_ih, b_hh) -> tuple:
    """``rnn_scan``'s bias (G H) and a GRU's ``b_hn`` (in a list, empty for the other modes)."""
    hidden = layout.hidden
    if b_ih is None:
        zeros = lambda n: kiln.zeros(n, dtype=x.dtype, device=x.device)  # noqa: E731
        return zeros(layout.gates * hidden), ([zeros(hidden)] if mode == "GRU" else [])
    if mode == "GRU":  # b_hh's n block is added after the reset gate, inside the recurrence
        return b_ih + kiln.nn.functional.pad(b_hh[: 2 * hidden], (0, hidden)), [b_hh[2 * hidden :]]
    return b_ih + b_hh, []


def _step_grads(spec: _rnn._Spec, inputs: tuple, packed, grads: tuple, needs: tuple) -> list:
    """The gradients of ``inputs`` (x, *states, w_ih, w_hh[, b_ih, b_hh]) from those of the new states."""
    count = spec.states
    x, states, w_ih, w_hh = inputs[0], inputs[1 : 1 + count], inputs[1 + count], inputs[2 + count]
    layout = ScanLayout(spec.mode, w_hh.shape[1])
    cotangent = _cotangent(layout, packed, grads)
    if cotangent is None:  # no new state reaches a loss
        return [None] * len(needs)
    back = apply(_SCAN_BACKWARD, packed, w_hh, cotangent, mode=spec.mode, reverse=False)
    batch, width = x.shape[0], layout.gates * layout.hidden
    dz = back.narrow(-1, *layout.dz).reshape(batch, width)
    dz_hh = back.narrow(-1, *layout.dz_hh).reshape(batch, width) if spec.mode == "GRU" else dz
    found: list = [dz @ w_ih if needs[0] else None]
    found += [back.narrow(-1, *layout.initial(s)).sum(0) if needs[1 + s] else None for s in range(count)]
    dz_t = dz.transpose(0, 1) if needs[1 + count] or (needs[2 + count] and dz_hh is dz) else None
    found += [dz_t @ x if needs[1 + count] else None]
    found += [(dz_t if dz_hh is dz else dz_hh.transpose(0, 1)) @ states[0] if needs[2 + count] else None]
    if spec.bias:  # an LSTM's and an Elman RNN's two biases get one sum (as add's VJP passes one to both)
        db_ih = dz.sum(0) if needs[3 + count] or (dz_hh is dz and needs[4 + count]) else None
        db_hh = db_ih if dz_hh is dz else dz_hh.sum(0) if needs[4 + count] else None
        found += [db_ih, db_hh]
    return [g if need else None for g, need in zip(found, needs, strict=True)]


def _cotangent(layout: ScanLayout, packed, grads: tuple):
    """The packed output's gradient: the new states' gradients at their ``final`` spans, zeros
    elsewhere; one pad of their concatenation (an LSTM's h and c spans are adjacent), None when no
    state has one."""
    present = [g for g in grads if g is not None]
    if not present:
        return None
    joined = present[0] if len(present) == 1 else kiln.cat(present, dim=-1)
    low = layout.final(0 if grads[0] is not None else 1)[0]
    high = layout.width - low - joined.shape[-1]
    return apply(_PAD, joined.unsqueeze(0), low=(0, 0, low), high=(0, 0, high), interior=(0, 0, 0), value=0)
