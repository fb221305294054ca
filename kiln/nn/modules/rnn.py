"""Recurrent layers: ``LSTM`` and ``GRU`` (multi-layer, batch_first, bidirectional), PyTorch's layout.

Parameters are named ``weight_ih_l{k}{suffix}``, ``weight_hh_l{k}{suffix}``, ``bias_ih_l{k}{suffix}``
and ``bias_hh_l{k}{suffix}`` (suffix ``_reverse`` for the backward direction), with the gates stacked
along dim 0 in PyTorch's order: LSTM (i, f, g, o), GRU (r, z, n).
"""

from __future__ import annotations

import math

import kiln

from .. import functional as F
from .. import init
from ..parameter import Parameter
from .module import Module

__all__ = ["LSTM", "GRU"]


class _RNNBase(Module):
    _gates = 1
    _mode = ""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__()
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"hidden_size must be a positive integer, got {hidden_size}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers}")
        if not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError(f"dropout should be a number in range [0, 1], got {dropout}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, float(dropout), bidirectional
        directions = 2 if bidirectional else 1
        gate_size = self._gates * hidden_size
        self._names: list[list[str]] = []
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else hidden_size * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                names = [f"weight_ih{suffix}", f"weight_hh{suffix}"]
                setattr(self, names[0], Parameter(kiln.empty(gate_size, layer_in, device=device, dtype=dtype)))
                setattr(self, names[1], Parameter(kiln.empty(gate_size, hidden_size, device=device, dtype=dtype)))
                if bias:
                    names += [f"bias_ih{suffix}", f"bias_hh{suffix}"]
                    for name in names[2:]:
                        setattr(self, name, Parameter(kiln.empty(gate_size, device=device, dtype=dtype)))
                self._names.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            init.uniform_(weight, -bound, bound)

    def _weights(self, layer: int, direction: int) -> tuple:
        names = self._names[layer * (2 if self.bidirectional else 1) + direction]
        params = [getattr(self, n) for n in names]
        return tuple(params) if self.bias else (params[0], params[1], None, None)

    def _initial(self, input, hx, batch: int, batched: bool):
        """Zero or user-given initial state as a (num_layers * directions, batch, hidden) tensor."""
        rows = self.num_layers * (2 if self.bidirectional else 1)
        expected = (rows, batch, self.hidden_size) if batched else (rows, self.hidden_size)
        if hx is None:
            return kiln.zeros(rows, batch, self.hidden_size, dtype=input.dtype, device=input.device)
        if tuple(hx.shape) != expected:
            raise RuntimeError(f"Expected hidden size {expected}, got {tuple(hx.shape)}")
        return hx if batched else hx.unsqueeze(1)

    def _run(self, input, states):
        """Run every layer and direction; ``states`` is a list of per-state (rows, N, H) tensors."""
        if input.dim() not in (2, 3):
            raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {input.dim()}D instead")
        batched = input.dim() == 3
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.shape[-1]}")  # fmt: skip
        x = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        batch = x.shape[1]
        states = [self._initial(x, s, batch, batched) for s in states]
        directions = 2 if self.bidirectional else 1
        finals: list[list] = [[] for _ in states]
        for layer in range(self.num_layers):
            outs = []
            for direction in range(directions):
                row = layer * directions + direction
                state = tuple(s[row] for s in states)
                out, state = self._direction(x, state, self._weights(layer, direction), reverse=bool(direction))
                outs.append(out)
                for f, s in zip(finals, state, strict=True):
                    f.append(s)
            x = outs[0] if directions == 1 else kiln.cat(outs, dim=2)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        finals = [kiln.stack(f, dim=0) for f in finals]
        if not batched:
            return x.squeeze(1), [f.squeeze(1) for f in finals]
        if self.batch_first:
            x = x.transpose(0, 1)
        return x, finals

    @kiln.jit.composite("rnn_direction")  # kiln.onnx writes an LSTM's as ONNX's LSTM operator
    def _direction(self, x, state, weights, reverse: bool):
        w_ih, w_hh, b_ih, b_hh = weights
        # The input projection for all time steps at once; only the recurrence is sequential.
        gates_x = F.linear(x, w_ih, b_ih)
        steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
        outs = [None] * x.shape[0]
        for t in steps:
            state = self._cell(gates_x[t], state, w_hh, b_hh)
            outs[t] = state[0]
        if not outs:
            return kiln.zeros(0, x.shape[1], self.hidden_size, dtype=x.dtype, device=x.device), state
        return kiln.stack(outs, dim=0), state

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


class LSTM(_RNNBase):
    """Long short-term memory; ``forward(input, (h0, c0))`` returns ``output, (h_n, c_n)``."""

    _gates = 4

    def _cell(self, gx, state, w_hh, b_hh):
        h, c = state
        i, f, g, o = kiln.chunk(gx + F.linear(h, w_hh, b_hh), 4, dim=-1)
        c = kiln.sigmoid(f) * c + kiln.sigmoid(i) * kiln.tanh(g)
        return kiln.sigmoid(o) * kiln.tanh(c), c

    def forward(self, input, hx=None):
        states = [None, None] if hx is None else list(hx)
        if len(states) != 2:
            raise RuntimeError(f"LSTM: expected hx to be a tuple (h_0, c_0), got {len(states)} tensors")
        output, (h, c) = self._run(input, states)
        return output, (h, c)


class GRU(_RNNBase):
    """Gated recurrent unit; ``forward(input, h0)`` returns ``output, h_n``."""

    _gates = 3

    def _cell(self, gx, state, w_hh, b_hh):
        (h,) = state
        xr, xz, xn = kiln.chunk(gx, 3, dim=-1)
        hr, hz, hn = kiln.chunk(F.linear(h, w_hh, b_hh), 3, dim=-1)
        r = kiln.sigmoid(xr + hr)
        z = kiln.sigmoid(xz + hz)
        n = kiln.tanh(xn + r * hn)
        return ((1 - z) * n + z * h,)

    def forward(self, input, hx=None):
        output, (h,) = self._run(input, [hx])
        return output, h
