"""One-step recurrent cells (``RNNCell``, ``LSTMCell``, ``GRUCell``) and the step functions the layers share.

A cell's step runs the fused layer's kernels over one time step: eagerly on the CPU as one lean autograd
node (``nn/_rnn_step.py``), traced as ``rnn_scan`` over the one step (``nn/_rnn_scan_step.py``); autocast
and other dtypes run the step functions below.
"""

from __future__ import annotations

import functools
import math

import kiln

from .. import _rnn, _rnn_scan_step, _rnn_step, init
from .. import functional as F
from ..parameter import Parameter
from .module import Module

__all__ = [
    "RNNCellBase",
    "RNNCell",
    "LSTMCell",
    "GRUCell",
    "rnn_step",
    "lstm_step",
    "gru_step",
    "step_function",
    "decomposed_direction",
]


def rnn_step(gx, state, w_hh, b_hh, nonlinearity):
    """``gx`` is the input's projection (x W_ih^T + b_ih); returns the new state tuple (h,)."""
    (h,) = state
    return (nonlinearity(gx + F.linear(h, w_hh, b_hh)),)


def lstm_step(gx, state, w_hh, b_hh):
    h, c = state
    i, f, g, o = kiln.chunk(gx + F.linear(h, w_hh, b_hh), 4, dim=-1)
    c = kiln.sigmoid(f) * c + kiln.sigmoid(i) * kiln.tanh(g)
    return kiln.sigmoid(o) * kiln.tanh(c), c


def gru_step(gx, state, w_hh, b_hh):
    (h,) = state
    xr, xz, xn = kiln.chunk(gx, 3, dim=-1)
    hr, hz, hn = kiln.chunk(F.linear(h, w_hh, b_hh), 3, dim=-1)
    r = kiln.sigmoid(xr + hr)
    z = kiln.sigmoid(xz + hz)
    n = kiln.tanh(xn + r * hn)
    return ((1 - z) * n + z * h,)


def step_function(mode: str):
    """The step of a layer's ``mode`` (``RNNBase.mode``): ``step(gx, state, w_hh, b_hh) -> state``."""
    if mode == "LSTM":
        return lstm_step
    if mode == "GRU":
        return gru_step
    return functools.partial(rnn_step, nonlinearity=kiln.tanh if mode == "RNN_TANH" else kiln.relu)


def decomposed_direction(step, x, state, weights, reverse: bool):
    """One direction of one layer as per-step ops (under autocast, in ONNX export's trace, for a custom
    step): ``x`` (T, B, in), ``state`` a tuple of (B, H) tensors, ``weights`` (w_ih, w_hh, b_ih, b_hh).
    Returns (output (T, B, H), state)."""
    w_ih, w_hh, b_ih, b_hh = weights
    # The input projection for all time steps at once; only the recurrence is sequential.
    gates_x = F.linear(x, w_ih, b_ih)
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    outs = [None] * x.shape[0]
    for t in steps:
        state = step(gates_x[t], state, w_hh, b_hh)
        outs[t] = state[0]
    if not outs:
        return kiln.zeros(0, x.shape[1], w_hh.shape[1], dtype=x.dtype, device=x.device), state
    return kiln.stack(outs, dim=0), state


class RNNCellBase(Module):
    """Parameters ``weight_ih`` (G H, input), ``weight_hh`` (G H, H), ``bias_ih``, ``bias_hh`` (G H)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        kw = {"device": device, "dtype": dtype}
        self.weight_ih = Parameter(kiln.empty(num_chunks * hidden_size, input_size, **kw))
        self.weight_hh = Parameter(kiln.empty(num_chunks * hidden_size, hidden_size, **kw))
        if bias:
            self.bias_ih = Parameter(kiln.empty(num_chunks * hidden_size, **kw))
            self.bias_hh = Parameter(kiln.empty(num_chunks * hidden_size, **kw))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -bound, bound)

    def _prepare(self, input, hx, count: int):
        """(batched input, list of ``count`` batched states, whether the input was batched)."""
        name = type(self).__name__
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.shape[-1]} expected {self.input_size}")
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            zeros = kiln.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
            return x, [zeros] * count, batched
        states = list(hx) if count > 1 else [hx]
        for s in states:
            if s.dim() != (2 if batched else 1):
                raise ValueError(f"{name}: Expected hidden to be {2 if batched else 1}D, got {s.dim()}D instead")
            if s.shape[-1] != self.hidden_size:
                raise RuntimeError(f"hidden has inconsistent hidden_size: got {s.shape[-1]}, expected "
                                   f"{self.hidden_size}")  # fmt: skip
        return x, [s if batched else s.unsqueeze(0) for s in states], batched

    def _project(self, x):
        return F.linear(x, self.weight_ih, self.bias_ih)

    def _fused_step(self, mode: str, x, states: list):
        """The new state tuple from the fused layer's kernels over one step (eagerly on the CPU one lean
        autograd node, ``_rnn_step``; traced ``rnn_scan`` over the one step, ``_rnn_scan_step``; eagerly on
        another device the layer's ``rnn_scan``), or None where they do not apply."""
        weights = (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        tensors = [*states, *weights]
        if _rnn_step.lean(x, tensors):
            return _rnn_step.cell_step(mode, x, states, weights)
        if not _rnn.fusable(x, tensors):
            return None
        if _rnn._tracing():
            return _rnn_scan_step.scan_step(mode, x, states, weights)
        _, (state,) = _rnn.fused_layer(mode, x, [tuple(states)], [weights], output=False)
        return state

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        nonlinearity = getattr(self, "nonlinearity", "tanh")
        return s if nonlinearity == "tanh" else s + f", nonlinearity={nonlinearity!r}"


class RNNCell(RNNCellBase):
    """``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (or relu)."""

    kiln_only = True

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh", device=None,
                 dtype=None) -> None:  # fmt: skip
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)

    def forward(self, input, hx=None):
        x, states, batched = self._prepare(input, hx, 1)
        mode = "RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU"
        state = self._fused_step(mode, x, states)
        if state is None:
            state = step_function(mode)(self._project(x), tuple(states), self.weight_hh, self.bias_hh)
        (h,) = state
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step: ``forward(input, (h, c))`` returns ``(h', c')``."""

    kiln_only = True

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):
        x, states, batched = self._prepare(input, hx, 2)
        state = self._fused_step("LSTM", x, states)
        h, c = lstm_step(self._project(x), tuple(states), self.weight_hh, self.bias_hh) if state is None else state
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step: ``forward(input, h)`` returns ``h'``."""

    kiln_only = True

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):
        x, states, batched = self._prepare(input, hx, 1)
        state = self._fused_step("GRU", x, states)
        (h,) = gru_step(self._project(x), tuple(states), self.weight_hh, self.bias_hh) if state is None else state
        return h if batched else h.squeeze(0)
