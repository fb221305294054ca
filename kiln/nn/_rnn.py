"""One layer of ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (one or both directions, or one step of a cell) as
one fused computation per direction, on the recurrence kernels of ``kiln/ir/primitives``.

As PyTorch's native RNN kernels do: the input projection of all time steps is one matmul (biases
added once), the recurrence runs the gate math in place (``recurrence_numpy.py``; an LSTM's and a
GRU's as one native call per direction once ``frontend/eager_recurrence.py`` has compiled it, its
per-step products on kiln's own kernel there and on one BLAS thread in numpy's), and its backward
runs through time and then computes ``dW_ih``, ``dW_hh`` and ``dx`` as one matmul each over all
steps. Eagerly, those large products run on kiln's own product kernel once compiled
(``eager_products.matmul``), as the decoder's do through the matmul primitive: 2-layer LSTM LM
training step (H=128, B=16, T=35, V=500), kiln / PyTorch eager in one process, alternating,
medians of 60 steps, 3 rounds, one thread, on the busy shared 2-core machine: 1.23-1.29 before
the native step product and these, 0.81-0.84 with the layer's, 0.71-0.77 with the decoder's too.
Two wrappers share those kernels:

- traced (``kiln.compile``, ``kiln.export``) and on devices other than the CPU: the ``rnn_scan``
  primitive (``_rnn_scan.scan_direction``), so a traced layer is a few nodes whatever the sequence's
  length;
- eagerly on the CPU: ``_FusedLayer``, one autograd node per layer over plain contiguous arrays. The
  primitive's one packed output costs an eager call more (its copies, a few more autograd nodes),
  which this avoids.
  Its backward under ``create_graph`` (or when traced) differentiates the primitive's path instead,
  whose VJP is exact to any order.

``fusable`` says when a module may take either: float32/float64 inputs of one dtype and device, at
least one step and one sequence, outside autocast (which lowers each product's inputs to bfloat16:
the per-step ops do that) and outside ``kiln.onnx.export``'s trace (which writes the per-step ops,
or ONNX's own LSTM and GRU operators, for ONNX has no ``rnn_scan``).

Measured (compile_cost's 2-layer LSTM LM step, V=500, H=128, B=16, T=35, SGD + clipping, one
thread, on a busy shared 2-core machine): a traced step is 284 nodes at T=35 and at T=350 (the
per-step ops: 5,062 and 48,532); a cold compile took 0.4-2.5 s (per-step ops: 8.8 s), its passes
and code generation the same time at T=350 (1.2-1.4 s), what grows being the traced first call's
own run of the step. Per step (CPU time, alternating calls in one process, medians): compiled/eager
0.94-0.96 (13.7-15.3 ms against 14.4-16.3 ms). It was 1.12-1.21 while the recurrences' packed outputs
were fresh numpy arrays, whose pages faulted in on every call; they are now the program's arena
(``eager_into``), and the LSTM step's gate math runs on a contiguous buffer rather than the packed
output's strided rows. Since then the compiled step no longer pads the cotangent to the packed width
nor copies dz (``_rnn_scan.py``, ``simplify``), and the native forward reads gx where it lies and
writes the prev/final rows itself: eager step / compiled step, one thread, CPU time, interleaved, 2
runs of 4-5 rounds, 1f7a7ae -> now: T=35 1.15-1.18 -> 1.25, T=350 0.88-0.89 -> 1.01-1.02; two
threads, wall, load 1.6: T=35 1.23-1.24 -> 1.28-1.40.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import kiln
from kiln.frontend import (
    autocast,
    eager_products,
    eager_recurrence,  # noqa: F401 - installs the native LSTM and GRU recurrences
)
from kiln.frontend.jit import state as _jit
from kiln.ir.primitives import recurrence_native
from kiln.ir.primitives import recurrence_numpy as kernels
from kiln.ir.primitives.recurrence_layout import GATES

from ._rnn_scan import scan_direction

__all__ = ["fusable", "eager_on_cpu", "fused_layer", "scan_direction"]


def fusable(x, tensors) -> bool:
    """Whether a layer over ``x`` (T, B, in), or one step (B, in), with these weights and states may run
    fused (see the module docs)."""
    if autocast.state.any or _jit.per_step_recurrences.get():
        return False
    dtype, device = x.dtype, x.device
    if 0 in x.shape[:-1] or dtype not in (kiln.float32, kiln.float64):
        return False
    return all(t.dtype == dtype and t.device == device for t in tensors if t is not None)


def _tracing() -> bool:
    return bool(_jit.tracing) and _jit.current.get() is not None


def eager_on_cpu(x) -> bool:
    """Whether a fusable layer over ``x`` runs as ``_FusedLayer`` (else as ``rnn_scan``)."""
    return x.device.type == "cpu" and not _tracing()


def fused_layer(mode: str, x, states: list[tuple], weights: list[tuple], output: bool = True):
    """One layer: ``x`` (T, B, in), or (B, in) for one step; per direction its state tuple ((h,) or (h, c), each (B, H)) and
    weights (w_ih, w_hh, b_ih, b_hh; biases may be None). Returns the output (T, B, D H) and the
    final state tuple of each direction; with ``output=False`` (a cell's step, whose output is its
    final h) the output is None and costs nothing eagerly: no copy, no zero gradient for it."""
    if not eager_on_cpu(x):
        y, finals = _scanned_layer(mode, _sequence(x), states, weights)
        return (y if output else None), finals
    has_bias = weights[0][2] is not None
    flat = []
    for state, (w_ih, w_hh, b_ih, b_hh) in zip(states, weights, strict=True):
        flat += [*state, w_ih, w_hh] + ([b_ih, b_hh] if has_bias else [])
    spec = _Spec(mode, len(states), len(states[0]), has_bias, output)
    keep = kiln.is_grad_enabled() and any(t.requires_grad for t in (x, *flat))
    results = _FusedLayer.apply(spec, keep, x, *flat)
    y, finals = (results[0], results[1:]) if output else (None, results)
    per_direction = spec.states
    return y, [tuple(finals[d * per_direction : (d + 1) * per_direction]) for d in range(spec.directions)]


def _sequence(x):
    """``x`` as (T, B, in): a step's (B, in) as one time step. (Eagerly, ``_FusedLayer`` takes a step as
    it is: an ``unsqueeze`` would cost a cell's step an op and an autograd node more.)"""
    return x.unsqueeze(0) if x.dim() == 2 else x


def _steps_batch(xa) -> tuple[int, int]:
    """(T, B) of an input array (T, B, in) or of one step (B, in)."""
    return (1, xa.shape[0]) if xa.ndim == 2 else xa.shape[:2]


def _scanned_layer(mode: str, x, states: list[tuple], weights: list[tuple]):
    runs = [scan_direction(mode, x, state, w, reverse=d == 1)
            for d, (state, w) in enumerate(zip(states, weights, strict=True))]  # fmt: skip
    out = runs[0][0] if len(runs) == 1 else kiln.cat([out for out, _ in runs], dim=-1)
    return out, [state for _, state in runs]


# ----------------------------------------------------------------------------- eagerly on the CPU
@dataclass(frozen=True)
class _Spec:
    mode: str
    directions: int
    states: int  # 2 for an LSTM's (h, c), else 1
    bias: bool
    output: bool  # whether the layer returns its output (T, B, D H) before the final states

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


def _kernel_order(a, reverse: bool):
    return a[::-1] if reverse else a


def _previous(states, first, reverse: bool, name: str):
    """The state before each step (T, B, H), natural order, from the states after them and the
    initial one: in the scratch array ``name`` (``recurrence_numpy.scratch``)."""
    out = kernels.scratch(name, states.shape, states.dtype)
    if reverse:
        out[:-1], out[-1] = states[1:], first
    else:
        out[0], out[1:] = first, states[:-1]
    return out


class _Saved:
    """One direction's arrays kept for the backward, natural time order: the gate activations
    (T, B, G, H) and ``block`` (n, T, B, H), one array for fewer allocations and saved tensors (a
    cell's step pays for each): the states after each step ``hs``, an LSTM's cell states ``cs``
    and ``extra``: an LSTM's tanh(c), a GRU's h W_hn^T + b_hn."""

    __slots__ = ("gates", "block", "hs", "cs", "extra")

    def __init__(self, gates, block) -> None:
        self.gates, self.block = gates, block
        self.hs = block[0]
        self.cs = block[1] if len(block) == 3 else None
        self.extra = block[-1] if len(block) > 1 else None

    @staticmethod
    def empty(mode: str, steps: int, batch: int, hidden: int, dtype) -> np.ndarray:
        """An uninitialised ``block`` for ``mode``."""
        return np.empty(({"LSTM": 3, "GRU": 2}.get(mode, 1), steps, batch, hidden), dtype=dtype)

    def tensors(self) -> tuple:
        """As tensors for ``save_for_backward``, which drops them after a backward without retain_graph."""
        return kiln.from_numpy(self.gates), kiln.from_numpy(self.block)

    @classmethod
    def unpack(cls, tensors: tuple) -> list[_Saved]:
        return [cls(_array(tensors[k]), _array(tensors[k + 1])) for k in range(0, len(tensors), 2)]


def _forward_direction(mode: str, x2, shape, state, weights, reverse: bool) -> _Saved:
    steps, batch = shape
    w_ih, w_hh, b_ih, b_hh = (_array(w) for w in weights)
    hidden = w_hh.shape[1]
    bias = None
    if b_ih is not None:
        bias = b_ih + b_hh if mode != "GRU" else np.concatenate([b_ih[: 2 * hidden] + b_hh[: 2 * hidden],
                                                                 b_ih[2 * hidden :]])  # fmt: skip
    gates = eager_products.matmul(x2, w_ih.T, bias).reshape(steps, batch, GATES[mode], hidden)
    k = lambda a: _kernel_order(a, reverse)  # noqa: E731
    h0 = _array(state[0])
    saved = _Saved(gates, _Saved.empty(mode, steps, batch, hidden, x2.dtype))
    hs, cs, extra = saved.hs, saved.cs, saved.extra
    with recurrence_native.small_products(recurrence_native.step_macs(batch, w_hh)):
        if mode == "LSTM":
            kernels.lstm_forward(k(gates), h0, _array(state[1]), k(hs), k(cs), k(extra), w_hh.T)
        elif mode == "GRU":
            b_hn = np.zeros(hidden, dtype=x2.dtype) if b_hh is None else b_hh[2 * hidden :]
            kernels.gru_forward(k(gates), h0, k(hs), k(extra), w_hh.T, b_hn)
        else:
            kernels.rnn_forward(k(gates), h0, k(hs), w_hh.T, mode == "RNN_RELU")
    return saved


def _finals(saved: _Saved, reverse: bool) -> list:
    last = 0 if reverse else -1
    return [saved.hs[last].copy()] + ([] if saved.cs is None else [saved.cs[last].copy()])


def _backward_direction(mode: str, saved: _Saved, initial: list, w_hh, dy, dfinal: list, reverse: bool):
    """(dz, dz_hh, gradients of the initial states) for one direction: ``dy`` (T, B, H) and
    ``dfinal`` the gradients of its output and final states, ``initial`` its initial states."""
    k = lambda a: _kernel_order(a, reverse)  # noqa: E731
    # Every array here but the returned states' gradients is scratch: the caller uses dz and dz_hh
    # up before it asks for the next direction's.
    dH = kernels.scratch("rnn.dH", saved.hs.shape, saved.hs.dtype)  # each step's state's gradient from outside
    if dy is None:  # no output: only the final state's gradient
        dH.fill(0)
    else:
        np.copyto(dH, k(dy))
    dH[-1] += dfinal[0]
    dz = kernels.scratch("rnn.dz", saved.gates.shape, saved.gates.dtype)
    with recurrence_native.small_products(recurrence_native.step_macs(dH.shape[1], w_hh)):
        if mode == "LSTM":
            dC = kernels.scratch("rnn.dC", dH.shape, dH.dtype)
            dC[:-1], dC[-1] = 0, dfinal[1]
            c_prev = k(_previous(saved.cs, initial[1], reverse, "rnn.c_prev"))
            dh, dc = kernels.lstm_backward(k(saved.gates), c_prev, k(saved.extra), w_hh, dH, dC, None, k(dz))
            return dz, dz, (dh, dc)
        if mode == "GRU":
            dz_hh = kernels.scratch("rnn.dz_hh", dz.shape, dz.dtype)
            h_prev = k(_previous(saved.hs, initial[0], reverse, "rnn.h_prev"))
            dh = kernels.gru_backward(k(saved.gates), h_prev, k(saved.extra), w_hh, dH, None, None, k(dz), k(dz_hh))
            return dz, dz_hh, (dh,)
        dh = kernels.rnn_backward(k(saved.gates), w_hh, dH, None, mode == "RNN_RELU", k(dz))
        return dz, dz, (dh,)


class _FusedLayer(kiln.autograd.Function):
    """``apply(spec, keep, x, *flat)`` -> ``(y, *final states)`` (without y unless ``spec.output``);
    ``keep``: save what the backward needs."""

    kiln_only = True  # calls no user code: a traced call runs it unwatched (``jit.hazards``)

    @staticmethod
    def forward(ctx, spec: _Spec, keep: bool, x, *flat):
        xa = _array(x)
        steps, batch = _steps_batch(xa)
        x2 = xa.reshape(steps * batch, xa.shape[-1])
        saved, ys, finals = [], [], []
        for d, (state, weights) in enumerate(spec.split(flat)):
            direction = _forward_direction(spec.mode, x2, (steps, batch), state, weights, reverse=d == 1)
            saved.append(direction)
            ys.append(direction.hs)
            finals += _finals(direction, reverse=d == 1)
        if keep:  # the inputs' version counters guard against in-place changes before the backward
            ctx.save_for_backward(x, *flat, *(t for direction in saved for t in direction.tensors()))
            ctx.spec = spec
        states = tuple(kiln.from_numpy(f) for f in finals)
        if not spec.output:
            return states
        # The output is new memory, not the saved states: an in-place change of it cannot reach the backward.
        y = ys[0].copy() if len(ys) == 1 else np.concatenate(ys, axis=-1)
        return (kiln.from_numpy(y), *states)

    @staticmethod
    def backward(ctx, *grads):
        spec = ctx.spec
        dy, dfinals = (grads[0], grads[1:]) if spec.output else (None, grads)
        needs = ctx.needs_input_grad[2:]
        saved_tensors = ctx.saved_tensors
        inputs, arrays = saved_tensors[: len(needs)], saved_tensors[len(needs) :]
        if kiln.is_grad_enabled() or _tracing():
            return (None, None, *_recomputed_grads(spec, inputs, grads, needs))
        saved = _Saved.unpack(arrays)
        return (None, None, *_numpy_grads(spec, inputs, saved, _array(dy), [_array(g) for g in dfinals], needs))


def _numpy_grads(spec: _Spec, inputs: tuple, saved_arrays: list, dy, dfinals: list, needs: tuple) -> list:
    x, flat = inputs[0], inputs[1:]
    xa = _array(x)
    steps, batch = _steps_batch(xa)
    x2 = xa.reshape(steps * batch, xa.shape[-1])
    dx2 = None
    grads: list = []
    for d, ((state, weights), saved) in enumerate(zip(spec.split(flat), saved_arrays, strict=True)):
        w_ih, w_hh = _array(weights[0]), _array(weights[1])
        hidden = w_hh.shape[1]
        initial = [_array(s) for s in state]
        dfinal = dfinals[d * spec.states : (d + 1) * spec.states]
        dy_d = None if dy is None else dy[:, :, d * hidden : (d + 1) * hidden]
        dz, dz_hh, dstates = _backward_direction(spec.mode, saved, initial, w_hh, dy_d, dfinal, reverse=d == 1)
        dz2, dz_hh2 = dz.reshape(steps * batch, -1), dz_hh.reshape(steps * batch, -1)
        if needs[0]:
            part = eager_products.matmul(dz2, w_ih)
            dx2 = part if dx2 is None else dx2 + part
        h_prev = _previous(saved.hs, initial[0], d == 1, "rnn.h_prev").reshape(steps * batch, hidden)
        grads += [*dstates, eager_products.matmul(dz2.T, x2), eager_products.matmul(dz_hh2.T, h_prev)]
        if spec.bias:  # an LSTM's and an Elman RNN's dz_hh is dz: one sum, two arrays
            db = dz2.sum(0)
            grads += [db, db.copy() if dz_hh is dz else dz_hh2.sum(0)]
    dx = None if dx2 is None else kiln.from_numpy(dx2.reshape(xa.shape))
    return [dx, *(kiln.from_numpy(g) if need else None for g, need in zip(grads, needs[1:], strict=True))]


def _recomputed_grads(spec: _Spec, inputs: tuple, grads: tuple, needs: tuple) -> list:
    """The layer's input gradients through ``rnn_scan`` (whose VJP is differentiable under
    ``create_graph``, and which a trace records), recomputed from ``inputs``.

    Each input that needs a gradient enters through a new view of itself, so the gradients asked
    of autograd are this layer's own (partial) ones even where inputs depend on each other."""
    create_graph = kiln.is_grad_enabled()
    with kiln.enable_grad():
        entries = [t.view_as(t) if need else t for t, need in zip(inputs, needs, strict=True)]
        x, flat = entries[0], tuple(entries[1:])
        pairs = spec.split(flat)
        y, finals = _scanned_layer(spec.mode, _sequence(x), [tuple(s) for s, _ in pairs], [w for _, w in pairs])
        outputs = [y, *(s for state in finals for s in state)][0 if spec.output else 1 :]
        wanted = [e for e, need in zip(entries, needs, strict=True) if need]
        found = iter(kiln.autograd.grad(outputs, wanted, list(grads), create_graph=create_graph, allow_unused=True))
    return [next(found) if need else None for need in needs]
