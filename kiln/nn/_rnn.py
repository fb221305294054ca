"""One layer of ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (one or both directions) as one fused computation.

As PyTorch's native RNN kernels do: the input projection of all time steps is one matmul (bias
added once), the recurrence runs the gate math on numpy arrays in place (``_rnn_kernels.py``), and the
layer is one autograd node whose backward runs through time on numpy arrays and then computes
``dW_ih``, ``dW_hh`` and ``dx`` as one matmul each over all steps.

``fusable`` says when the module may take this path: eager CPU float32/float64, outside a
``kiln.compile`` trace (which records the decomposed per-step ops, so that compiled programs and the
ONNX exporter see primitives) and outside autocast. A backward with ``create_graph`` (double
backward, ``kiln.func`` transforms) or inside a trace recomputes the layer with the decomposed ops
and differentiates that instead, so higher-order gradients stay exact. The cells (``rnn_cells.py``)
run one step as this layer over one time step.

Measured (2-layer LSTM LM step, V=500, E=128, H=128, B=16, T=35, SGD, one thread, against PyTorch
eager in one process on a busy 2-core machine): 4.9x PyTorch's time with the per-step ops, 1.5x fused.
PyTorch runs its LSTM on oneDNN; here the step's 16 x 128 @ 128 x 512 product alone is about two
thirds of a fused step (numpy's OpenBLAS runs its Haswell kernels on this AVX-512 CPU). A 1-layer GRU
LM step: 2.6x -> 0.8x.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import kiln
from kiln.frontend import autocast
from kiln.frontend.jit import state as _jit

from . import _rnn_kernels as kernels
from .modules import rnn_cells  # a module, not its names: the cells import this module too

__all__ = ["fusable", "fused_layer"]


#: How many leading gate blocks are sigmoids whose weight rows ``_rows`` halves (see the kernels).
_HALVED = {"LSTM": 0, "GRU": 2, "RNN_TANH": 0, "RNN_RELU": 0}
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def fusable(x, tensors) -> bool:
    """Whether a layer over ``x`` with these weights and states may run fused (see the module docs)."""
    if _tracing() or autocast.state.any:
        return False
    dtype = x.dtype
    if x.device.type != "cpu" or x.shape[0] == 0 or x.shape[1] == 0:
        return False
    if dtype not in (kiln.float32, kiln.float64):
        return False
    return all(t.dtype == dtype and t.device.type == "cpu" for t in tensors if t is not None)


def _tracing() -> bool:
    return bool(_jit.tracing) and _jit.current.get() is not None


def fused_layer(mode: str, x, states: list[tuple], weights: list[tuple]):
    """One layer: ``x`` (T, B, in); per direction its state tuple ((h,) or (h, c), each (B, H)) and
    weights (w_ih, w_hh, b_ih, b_hh; biases may be None). Returns the output (T, B, D H) and the
    final state tuple of each direction."""
    has_bias = weights[0][2] is not None
    flat = []
    for state, (w_ih, w_hh, b_ih, b_hh) in zip(states, weights, strict=True):
        flat += [*state, w_ih, w_hh] + ([b_ih, b_hh] if has_bias else [])
    spec = _Spec(mode, len(states), len(states[0]), has_bias)
    keep = kiln.is_grad_enabled() and any(t.requires_grad for t in (x, *flat))
    y, *finals = _FusedLayer.apply(spec, keep, x, *flat)
    per_direction = spec.states
    return y, [tuple(finals[d * per_direction : (d + 1) * per_direction]) for d in range(spec.directions)]


@dataclass(frozen=True)
class _Spec:
    mode: str
    directions: int
    states: int  # 2 for an LSTM's (h, c), else 1
    bias: bool

    def split(self, flat: tuple) -> list[tuple[tuple, tuple]]:
        """The flat tensor arguments as (states, (w_ih, w_hh, b_ih, b_hh)) per direction."""
        size = self.states + (4 if self.bias else 2)
        out = []
        for d in range(self.directions):
            group = flat[d * size : (d + 1) * size]
            state, w = group[: self.states], group[self.states :]
            out.append((state, tuple(w) if self.bias else (w[0], w[1], None, None)))
        return out


def _array(t):
    return None if t is None else t.numpy(force=True)


def _rows(mode: str, w, halve: bool):
    """``w`` (gate blocks stacked along dim 0) with the rows of a GRU's sigmoid gates halved if asked."""
    if not (halve and _HALVED[mode]):
        return w
    w = w.copy()
    w[: _HALVED[mode] * (w.shape[0] // _GATES[mode])] *= 0.5
    return w


def _kernel_order(a, reverse: bool):
    return a[::-1] if reverse else a


class _Saved:
    """One direction's arrays kept for the backward, in natural time order: the gate activations
    (T, B, G, H), the states h (T + 1, B, H; the initial one first in the direction's own order), an
    LSTM's cell states c (like h) and ``extra``: an LSTM's tanh(c), a GRU's h W_hn^T + b_hn (T, B, H)."""

    __slots__ = ("gates", "hs", "cs", "extra")

    def __init__(self, gates, hs, cs, extra) -> None:
        self.gates, self.hs, self.cs, self.extra = gates, hs, cs, extra

    def tensors(self) -> tuple:
        """As tensors for ``save_for_backward``, which drops them after a backward without retain_graph."""
        return tuple(None if a is None else kiln.from_numpy(a) for a in (self.gates, self.hs, self.cs, self.extra))

    @classmethod
    def unpack(cls, tensors: tuple) -> list[_Saved]:
        arrays = [_array(t) for t in tensors]
        return [cls(*arrays[k : k + 4]) for k in range(0, len(arrays), 4)]


def _forward_direction(mode: str, x2, shape, state, weights, reverse: bool) -> _Saved:
    steps, batch = shape
    w_ih, w_hh, b_ih, b_hh = (_array(w) for w in weights)
    hidden = w_hh.shape[1]
    gates = x2 @ _rows(mode, w_ih, halve=True).T
    if b_ih is not None:
        bias = b_ih + b_hh if mode != "GRU" else np.concatenate([b_ih[: 2 * hidden] + b_hh[: 2 * hidden],
                                                                 b_ih[2 * hidden :]])  # fmt: skip
        gates += _rows(mode, bias, halve=True)
    gates = gates.reshape(steps, batch, _GATES[mode], hidden)
    hs = np.empty((steps + 1, batch, hidden), dtype=x2.dtype)
    hk, ak = _kernel_order(hs, reverse), _kernel_order(gates, reverse)
    hk[0] = _array(state[0])
    w_hh_t = _rows(mode, w_hh, halve=True).T
    cs = extra = None
    if mode == "LSTM":
        cs, extra = np.empty_like(hs), np.empty((steps, batch, hidden), dtype=x2.dtype)
        ck = _kernel_order(cs, reverse)
        ck[0] = _array(state[1])
        kernels.lstm_forward(ak, hk, ck, _kernel_order(extra, reverse), w_hh_t)
    elif mode == "GRU":
        extra = np.empty((steps, batch, hidden), dtype=x2.dtype)
        b_hn = None if b_hh is None else b_hh[2 * hidden :]
        kernels.gru_forward(ak, hk, _kernel_order(extra, reverse), w_hh_t, b_hn)
    else:
        kernels.rnn_forward(ak, hk, w_hh_t, mode == "RNN_RELU")
    return _Saved(gates, hs, cs, extra)


def _outputs(saved: _Saved, reverse: bool) -> tuple:
    """(the direction's per-step outputs (T, B, H) view, its final states as copies)."""
    hs = saved.hs
    y = hs[:-1] if reverse else hs[1:]
    finals = [(hs[0] if reverse else hs[-1]).copy()]
    if saved.cs is not None:
        finals.append((saved.cs[0] if reverse else saved.cs[-1]).copy())
    return y, finals


def _backward_direction(mode: str, saved: _Saved, w_hh, dy, dfinal: list, reverse: bool):
    """(dz, dz_hh, gradients of the initial states) for one direction (``w_hh`` as given, unscaled)."""
    k = lambda a: _kernel_order(a, reverse)  # noqa: E731
    dz = np.empty_like(saved.gates)
    if mode == "LSTM":
        dh_last, dc_last = dfinal
        dh, dc = kernels.lstm_backward(
            k(saved.gates), k(saved.cs), k(saved.extra), w_hh, k(dy), dh_last, dc_last, k(dz)
        )
        return dz, dz, (dh, dc)
    if mode == "GRU":
        dz_hh = np.empty_like(dz)
        dh = kernels.gru_backward(k(saved.gates), k(saved.hs), k(saved.extra), w_hh, k(dy), dfinal[0], k(dz), k(dz_hh))
        return dz, dz_hh, (dh,)
    dh = kernels.rnn_backward(k(saved.gates), w_hh, k(dy), dfinal[0], mode == "RNN_RELU", k(dz))
    return dz, dz, (dh,)


class _FusedLayer(kiln.autograd.Function):
    """``apply(spec, keep, x, *flat)`` -> ``(y, *final states)``; ``keep``: save what the backward needs."""

    @staticmethod
    def forward(ctx, spec: _Spec, keep: bool, x, *flat):
        xa = _array(x)
        steps, batch = xa.shape[:2]
        x2 = xa.reshape(steps * batch, xa.shape[2])
        saved, ys, finals = [], [], []
        for d, (state, weights) in enumerate(spec.split(flat)):
            direction = _forward_direction(spec.mode, x2, (steps, batch), state, weights, reverse=d == 1)
            y, final = _outputs(direction, reverse=d == 1)
            saved.append(direction)
            ys.append(y)
            finals += final
        # The output is new memory, not the saved states: an in-place change of it cannot reach the backward.
        y = ys[0].copy() if len(ys) == 1 else np.concatenate(ys, axis=-1)
        if keep:  # the inputs' version counters guard against in-place changes before the backward
            ctx.save_for_backward(x, *flat, *(t for direction in saved for t in direction.tensors()))
            ctx.spec = spec
        return (kiln.from_numpy(y), *(kiln.from_numpy(f) for f in finals))

    @staticmethod
    def backward(ctx, dy, *dfinals):
        spec = ctx.spec
        needs = ctx.needs_input_grad[2:]
        saved_tensors = ctx.saved_tensors
        inputs, arrays = saved_tensors[: len(needs)], saved_tensors[len(needs) :]
        if kiln.is_grad_enabled() or _tracing():
            return (None, None, *_decomposed_grads(spec, inputs, (dy, *dfinals), needs))
        saved = _Saved.unpack(arrays)
        return (None, None, *_numpy_grads(spec, inputs, saved, _array(dy), [_array(g) for g in dfinals], needs))


def _numpy_grads(spec: _Spec, inputs: tuple, saved_arrays: list, dy, dfinals: list, needs: tuple) -> list:
    x, flat = inputs[0], inputs[1:]
    xa = _array(x)
    steps, batch = xa.shape[:2]
    x2 = xa.reshape(steps * batch, xa.shape[2])
    dx2 = None
    grads: list = []
    for d, ((_, weights), saved) in enumerate(zip(spec.split(flat), saved_arrays, strict=True)):
        w_ih, w_hh = _array(weights[0]), _array(weights[1])
        hidden = w_hh.shape[1]
        dfinal = dfinals[d * spec.states : (d + 1) * spec.states]
        dz, dz_hh, dstates = _backward_direction(spec.mode, saved, w_hh, dy[:, :, d * hidden : (d + 1) * hidden],
                                                 dfinal, reverse=d == 1)  # fmt: skip
        dz2, dz_hh2 = dz.reshape(steps * batch, -1), dz_hh.reshape(steps * batch, -1)
        if needs[0]:
            part = dz2 @ w_ih
            dx2 = part if dx2 is None else dx2 + part
        h_prev = (saved.hs[1:] if d == 1 else saved.hs[:-1]).reshape(steps * batch, hidden)
        grads += [*dstates, dz2.T @ x2, dz_hh2.T @ h_prev]
        if spec.bias:
            grads += [dz2.sum(0), dz_hh2.sum(0)]
    dx = None if dx2 is None else kiln.from_numpy(dx2.reshape(xa.shape))
    return [dx, *(kiln.from_numpy(g) if need else None for g, need in zip(grads, needs[1:], strict=True))]


def _decomposed_grads(spec: _Spec, inputs: tuple, grads: tuple, needs: tuple) -> list:
    """The layer's input gradients through the decomposed per-step ops, recomputed from ``inputs``.

    Each input that needs a gradient enters through a new view of itself, so the gradients asked
    of autograd are this layer's own (partial) ones even where inputs depend on each other."""
    create_graph = kiln.is_grad_enabled()
    with kiln.enable_grad():
        entries = [t.view_as(t) if need else t for t, need in zip(inputs, needs, strict=True)]
        y, finals = _decomposed_layer(spec, entries[0], tuple(entries[1:]))
        wanted = [e for e, need in zip(entries, needs, strict=True) if need]
        found = iter(kiln.autograd.grad([y, *finals], wanted, list(grads), create_graph=create_graph,
                                        allow_unused=True))  # fmt: skip
    return [next(found) if need else None for need in needs]


def _decomposed_layer(spec: _Spec, x, flat: tuple):
    """The layer with the per-step ops the module uses while traced: (output, final states)."""
    outs, finals = [], []
    for d, (state, weights) in enumerate(spec.split(flat)):
        out, final = rnn_cells.decomposed_direction(
            rnn_cells.step_function(spec.mode), x, tuple(state), weights, d == 1
        )
        outs.append(out)
        finals += list(final)
    return (outs[0] if len(outs) == 1 else kiln.cat(outs, dim=-1)), finals
