"""One step of ``nn.LSTMCell``/``nn.GRUCell``/``nn.RNNCell`` as the ``rnn_scan`` primitive over one time
step, with a backward written for one step: what a trace records of a cell.

A cell looped in Python over T time steps is traced T times, so every node of its step is recorded,
printed into the cache key, rolled into a loop and kept alive T times over. Through the layer's path
(``_rnn.scan_direction`` and the ``rnn_scan`` VJP, written for T steps) a traced LSTM cell step was
about 40 nodes: the layer's output (sliced and copied, and dead), the input projection over a (1, B,
in) sequence and its gradients through reshapes of it, the packed cotangent as a pad per state and
their sum, the gradients of the gate pre-activations copied contiguous, ``dW_hh`` from the previous
states sliced out of the packed output. Here, with T = 1 known: the previous state is the step's input
``h``, the gradients are products of 2-D arrays (``dW = dz^T x``, no transposes of the result), the
cotangent of both new states is one concatenation of them between zeros, the backward's pieces are
views of its one row (a gradient may be a view: no copy, no sum over the one step), and nothing is
copied; the weights' gradients are one product a step (``_joined``); the biases' sum, ``W_ih``'s
transpose, the joined weights and the cotangent's zeros are recorded once per call (``derived``), not
once per step. Two LSTM cells and a Linear head looped over time (benchmarks' lstm_cells): 94 traced
nodes per step before, 49 now.

Its backward under ``create_graph`` (or wherever grad mode is on while it runs) recomputes the step
with grad on and differentiates that (``rnn_scan``'s VJP is exact to any order then), as
``_rnn._recomputed_grads`` does for a layer.
"""

from __future__ import annotations

import kiln
from kiln.frontend.dispatch import apply
from kiln.ir.primitives import P
from kiln.ir.primitives.linalg import padded_rows
from kiln.ir.primitives.recurrence_layout import ScanLayout
from kiln.ir.primitives.recurrence_native import with_transposed

from ._derived import derived

__all__ = ["scan_step"]

_SCAN, _SCAN_BACKWARD = P["rnn_scan"], P["rnn_scan_backward"]


def scan_step(mode: str, x, states: list, weights: tuple) -> tuple:
    """The new state tuple ((h,), or an LSTM's (h, c)) of one step over ``x`` (B, in) from ``states``
    (B, H) with ``weights`` (w_ih, w_hh, b_ih, b_hh; biases may be None)."""
    w_ih, w_hh, b_ih, b_hh = weights
    layout = ScanLayout(mode, w_hh.shape[1])
    # (keyed by the sizes too: two bias-free cells of one hidden size may share their zeros, no others)
    biases = derived(("rnn_scan biases", layout), (x, b_ih, b_hh), lambda: _scan_biases(layout, x, b_ih, b_hh))
    joined = None
    if layout.mode != "GRU":  # (a GRU's dW_hh is another product than dW_ih's: dz_hh^T h)
        joined = derived(
            ("rnn_scan joined weights",), (x, w_ih, w_hh, biases[0]), lambda: _joined(w_ih, w_hh, biases[0])
        )
    return _ScanStep.apply(layout, x, *states, w_ih, w_hh, *biases, joined)


def _joined(w_ih, w_hh, bias):
    """``[W_ih | W_hh | bias]`` (G H, in + H + 1), made once per traced call: the one input through
    which a step's backward gives the three their gradients, ``dz^T [x | h | 1]``. Per step that is
    one concatenation and one product, and one sum with the earlier steps' -- not two products, a
    sum over the batch and three sums with the earlier steps' (3 nodes a step of a cell fewer); the
    concatenation's backward splits the total once."""
    return kiln.cat([w_ih, w_hh, bias.unsqueeze(1)], dim=1)


def _scan_biases(layout: ScanLayout, x, b_ih, b_hh) -> tuple:
    """``rnn_scan``'s bias (G H), and a GRU's ``b_hn`` (H) after it."""
    hidden, gru = layout.hidden, layout.mode == "GRU"
    if b_ih is None:
        zeros = lambda n: kiln.zeros(n, dtype=x.dtype, device=x.device)  # noqa: E731
        return (zeros(layout.gates * hidden), zeros(hidden)) if gru else (zeros(layout.gates * hidden),)
    if gru:  # b_hh's n block is added after the reset gate, inside the recurrence
        return b_ih + kiln.nn.functional.pad(b_hh[: 2 * hidden], (0, hidden)), b_hh[2 * hidden :]
    return (b_ih + b_hh,)


def _forward(layout: ScanLayout, x, states: tuple, w_ih_t, w_hh, biases: tuple) -> tuple:
    """(the packed output of ``rnn_scan`` over the one step, the new states)."""
    gx = kiln.matmul(x, w_ih_t).unsqueeze(0)
    packed = _scan(layout, gx, biases, states, w_hh)
    # new memory (a sum over the one step), not views of the packed output the backward reads
    return packed, tuple(packed.narrow(-1, *layout.final(s)).sum(0) for s in range(layout.states))


def _scan(layout: ScanLayout, gx, biases: tuple, states: tuple, w_hh):
    """``rnn_scan`` over the step. An LSTM's native step kernel reads ``W_hh^T`` in C order: on the CPU
    that copy is made once per traced call and version of ``W_hh`` (``derived``), not once per step (it
    was 31 us of each step of benchmarks' lstm_cells trace, 57 ms of its 1,000 steps)."""
    args = (_SCAN, gx, biases[0], *states, w_hh, *biases[1:])
    if layout.mode != "LSTM" or w_hh._device.type != "cpu":
        return apply(*args, mode=layout.mode, reverse=False)
    # (with the array it was made from: a weight given other memory since is copied by the kernel again)
    array, transposed = derived(("rnn_scan W_hh^T array",), (gx, w_hh), lambda: (w_hh._data, padded_rows(w_hh._data.T)))
    if array is not w_hh._data:
        return apply(*args, mode=layout.mode, reverse=False)
    return with_transposed(array, transposed, apply, *args, mode=layout.mode, reverse=False)


class _ScanStep(kiln.autograd.Function):
    """``apply(layout, x, *states, w_ih, w_hh, bias[, b_hn], joined)`` -> the new states. ``joined``
    (``_joined``, None for a GRU) only carries the weights' gradients: the forward reads the weights."""

    kiln_only = True

    @staticmethod
    def forward(ctx, layout: ScanLayout, x, *flat):
        count = layout.states
        states, w_ih, w_hh, biases = flat[:count], flat[count], flat[count + 1], flat[count + 2 : -1]
        w_ih_t = derived(("rnn_scan w_ih^T",), (x, w_ih), lambda: w_ih.transpose(0, 1))
        packed, new_states = _forward(layout, x, states, w_ih_t, w_hh, biases)
        ctx.save_for_backward(x, *flat[:-1], packed)
        ctx.layout = layout
        return new_states

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        inputs, packed = saved[:-1], saved[-1]
        needs = ctx.needs_input_grad[1:]
        if kiln.is_grad_enabled():  # create_graph: a backward that autograd can differentiate again
            # (the weights' own gradients, none through ``joined``: the sum reaching the parameters is one)
            return (None, *_differentiable_grads(ctx.layout, inputs, grads, needs[:-1]), None)
        return (None, *_step_grads(ctx.layout, inputs, packed, grads, needs))


def _step_grads(layout: ScanLayout, inputs: tuple, packed, grads: tuple, needs: tuple) -> list:
    """The gradients of ``inputs`` (x, *states, w_ih, w_hh, bias[, b_hn]) and of ``joined`` (the weights'
    where it is given, see ``_joined``) from those of the new states."""
    count = layout.states
    x, states, w_ih, w_hh = inputs[0], inputs[1 : 1 + count], inputs[1 + count], inputs[2 + count]
    cotangent = _cotangent(layout, grads)
    if cotangent is None:  # no new state reaches a loss
        return [None] * len(needs)
    gru = layout.mode == "GRU"
    if not gru:  # the weights' gradients through ``joined`` alone
        needs = (*needs[: 1 + count], False, False, False, needs[-1])
    # (the one step's row: its pieces are views of it, as a gradient may be -- no copy, no node each)
    back = apply(_SCAN_BACKWARD, packed, w_hh, cotangent, mode=layout.mode, reverse=False)
    back = back.reshape(back.shape[1:])
    dz = back.narrow(-1, *layout.dz)
    dz_hh = back.narrow(-1, *layout.dz_hh) if gru else dz
    w_ih_needed, w_hh_needed = needs[1 + count], needs[2 + count]
    dz_t = dz.transpose(0, 1) if w_ih_needed or (w_hh_needed and not gru) or needs[-1] else None
    found: list = [dz @ w_ih if needs[0] else None]
    found += [back.narrow(-1, *layout.initial(s)) if needs[1 + s] else None for s in range(count)]
    found += [dz_t @ x if w_ih_needed else None]
    found += [(dz_hh.transpose(0, 1) if gru else dz_t) @ states[0] if w_hh_needed else None]
    found += [dz.sum(0) if needs[3 + count] else None]
    if gru:  # b_hn's gradient: the n block of dz_hh (the reset gate scales it)
        found += [dz_hh.narrow(-1, 2 * layout.hidden, layout.hidden).sum(0) if needs[4 + count] else None]
        return [*found, None]
    return [*found, dz_t @ kiln.cat([x, states[0], _ones(x)], dim=1) if needs[-1] else None]


def _ones(x):
    """A column of ones, one per row of ``x``: the bias's factor in ``dz^T [x | h | 1]``."""
    shape = (x.shape[0], 1)
    return derived(("rnn_scan ones", shape), (x,), lambda: kiln.ones(shape, dtype=x.dtype, device=x.device))


def _differentiable_grads(layout: ScanLayout, inputs: tuple, grads: tuple, needs: tuple) -> list:
    """The gradients of ``inputs`` through the step recomputed with grad on (``rnn_scan``'s VJP is
    differentiable to any order then). Each input that needs one enters through a new view of
    itself, so the gradients asked of autograd are this step's own."""
    count = layout.states
    zeros = lambda: kiln.zeros_like(inputs[1])  # noqa: E731 - a new state that no loss reads
    grads = tuple(zeros() if g is None else g for g in grads)
    with kiln.enable_grad():
        entries = [t.view_as(t) if need else t for t, need in zip(inputs, needs, strict=True)]
        x, states, w_ih, w_hh, biases = (entries[0], tuple(entries[1 : 1 + count]), entries[1 + count],
                                         entries[2 + count], tuple(entries[3 + count :]))  # fmt: skip
        _, new_states = _forward(layout, x, states, w_ih.transpose(0, 1), w_hh, biases)
        wanted = [e for e, need in zip(entries, needs, strict=True) if need]
        found = iter(kiln.autograd.grad(new_states, wanted, list(grads), create_graph=True, allow_unused=True))
    return [next(found) if need else None for need in needs]


def _cotangent(layout: ScanLayout, grads: tuple):
    """The packed output's gradient: the new states' gradients at their ``final`` spans, zeros
    elsewhere; one concatenation of zeros, the states' gradients (an LSTM's h and c spans are
    adjacent) and zeros, its zeros made once per traced call (``derived``; a pad of the states'
    concatenation was a node more a step). None when no state has a gradient."""
    present = [g for g in grads if g is not None]
    if not present:
        return None
    first = present[0]
    low = layout.final(0 if grads[0] is not None else 1)[0]
    high = layout.width - low - sum(g.shape[-1] for g in present)

    def zeros(width: int) -> list:
        shape = (first.shape[0], width)
        make = lambda: kiln.zeros(shape, dtype=first.dtype, device=first.device)  # noqa: E731
        return [derived(("rnn_scan cotangent zeros", shape), (first,), make)] if width else []

    return kiln.cat([*zeros(low), *present, *zeros(high)], dim=-1).unsqueeze(0)
