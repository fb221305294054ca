"""Recurrent layers: ``RNN``, ``LSTM``, ``GRU`` (multi-layer, batch_first, bidirectional, packed input).

Parameters are named ``weight_ih_l{k}{suffix}``, ``weight_hh_l{k}{suffix}``, ``bias_ih_l{k}{suffix}``
and ``bias_hh_l{k}{suffix}`` (suffix ``_reverse`` for the backward direction), with the gates stacked
along dim 0 in PyTorch's order: LSTM (i, f, g, o), GRU (r, z, n). The one-step cells live in rnn_cells.py.

A ``PackedSequence`` input (from ``nn.utils.rnn.pack_padded_sequence``) runs each time step on the
sequences still active at that step (they are sorted by length, longest first), so padding never
enters the state; the output is packed the same way.

Each layer of a padded float32/float64 batch runs fused (``nn/_rnn.py``): eagerly on the CPU as one
autograd node, in ``kiln.compile`` traces (and on other devices) as one ``rnn_scan`` primitive per
direction, so a traced layer is a few nodes whatever the sequence's length. Autocast,
``kiln.onnx.export``'s trace, other dtypes, packed input and subclasses with their own ``_step`` run
the per-step ops below.
"""

from __future__ import annotations

import functools
import math
import warnings

import kiln

from .. import _rnn, init
from .. import functional as F
from ..parameter import Parameter
from ..utils.rnn import PackedSequence
from .module import Module
from .rnn_cells import GRUCell, LSTMCell, RNNCell, RNNCellBase, decomposed_direction, step_function

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]


class RNNBase(Module):
    """What RNN, LSTM and GRU share: the parameters, the layer/direction loop, and packed-sequence support."""

    _gates = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None) -> None:  # fmt: skip
        super().__init__()
        if mode not in self._gates:
            raise ValueError(f"Unrecognized RNN mode: {mode}")
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"hidden_size must be a positive integer, got {hidden_size}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers}")
        if not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError(f"dropout should be a number in range [0, 1] representing the probability of an element "
                             f"being zeroed, got {dropout}")  # fmt: skip
        if proj_size:
            raise NotImplementedError("LSTM with proj_size > 0 is not supported by kiln")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
                          stacklevel=3)  # fmt: skip
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, float(dropout), bidirectional
        self.proj_size = proj_size
        directions = 2 if bidirectional else 1
        gate_size = self._gates[mode] * hidden_size
        kw = {"device": device, "dtype": dtype}
        self._flat_weights_names: list[str] = []
        self._all_weights: list[list[str]] = []
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else hidden_size * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                names = [f"weight_ih{suffix}", f"weight_hh{suffix}"]
                setattr(self, names[0], Parameter(kiln.empty(gate_size, layer_in, **kw)))
                setattr(self, names[1], Parameter(kiln.empty(gate_size, hidden_size, **kw)))
                if bias:
                    names += [f"bias_ih{suffix}", f"bias_hh{suffix}"]
                    for name in names[2:]:
                        setattr(self, name, Parameter(kiln.empty(gate_size, **kw)))
                self._flat_weights_names += names
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -bound, bound)

    def flatten_parameters(self) -> None:
        """Kept for PyTorch programs (cuDNN's contiguous weight buffer): kiln's weights need no flattening."""

    @property
    def all_weights(self) -> list[list[Parameter]]:
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    @property
    def _flat_weights(self) -> list[Parameter]:
        return [getattr(self, name) for name in self._flat_weights_names]

    def _weights(self, layer: int, direction: int) -> tuple:
        params = [getattr(self, n) for n in self._all_weights[layer * (2 if self.bidirectional else 1) + direction]]
        return tuple(params) if self.bias else (params[0], params[1], None, None)

    def _step(self, gx, state, w_hh, b_hh):
        return step_function(self.mode)(gx, state, w_hh, b_hh)

    def _initial(self, x, hx, batch: int, batched: bool, sorted_indices):
        """Zero or user-given initial state as a (num_layers * directions, batch, hidden) tensor."""
        rows = self.num_layers * (2 if self.bidirectional else 1)
        if hx is None:
            return kiln.zeros(rows, batch, self.hidden_size, dtype=x.dtype, device=x.device)
        expected = (rows, batch, self.hidden_size) if batched else (rows, self.hidden_size)
        if tuple(hx.shape) != expected:
            raise RuntimeError(f"Expected hidden size {expected}, got {tuple(hx.shape)}")
        hx = hx if batched else hx.unsqueeze(1)
        return hx if sorted_indices is None else kiln.index_select(hx, 1, sorted_indices)

    def _run(self, input, states):
        """Run every layer and direction; ``states`` is a list of per-state (rows, N, H) tensors or None."""
        name = type(self).__name__
        if isinstance(input, PackedSequence):
            return self._run_packed(input, states)
        if input.dim() not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.dim()}D instead")
        batched = input.dim() == 3
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.shape[-1]}")  # fmt: skip
        x = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        states = [self._initial(x, s, x.shape[1], batched, None) for s in states]
        # a subclass's own step runs as it is written
        scan = type(self)._step is RNNBase._step and _rnn.fusable(x, [*states, *self._flat_weights])
        if scan and _rnn.eager_on_cpu(x):
            x, finals = self._layers(x, states, functools.partial(_rnn.fused_layer, self.mode))
        else:  # per direction, a composite region for kiln.onnx (rnn_scan in traces when ``scan``)
            x, finals = self._layers(x, states, self._per_direction(functools.partial(self._direction, scan=scan)))
        if not batched:
            return x.squeeze(1), [f.squeeze(1) for f in finals]
        return (x.transpose(0, 1) if self.batch_first else x), finals

    def _layers(self, x, states, run_layer):
        """Every layer in turn: ``run_layer(x, states, weights)``, with a state tuple and the weights
        per direction, returns the layer's output and the final state tuple per direction."""
        directions = 2 if self.bidirectional else 1
        finals: list[list] = [[] for _ in states]
        for layer in range(self.num_layers):
            rows = range(layer * directions, (layer + 1) * directions)
            weights = [self._weights(layer, direction) for direction in range(directions)]
            x, layer_finals = run_layer(x, [tuple(s[row] for s in states) for row in rows], weights)
            for state in layer_finals:
                for f, s in zip(finals, state, strict=True):
                    f.append(s)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        return x, [kiln.stack(f, dim=0) for f in finals]

    @staticmethod
    def _per_direction(run_direction):
        """A ``run_layer`` for ``_layers`` that runs ``run_direction(x, state, weights, reverse)`` per direction."""

        def run_layer(x, states, weights):
            runs = [run_direction(x, s, w, bool(d)) for d, (s, w) in enumerate(zip(states, weights, strict=True))]
            out = runs[0][0] if len(runs) == 1 else kiln.cat([out for out, _ in runs], dim=-1)
            return out, [state for _, state in runs]

        return run_layer

    @kiln.jit.composite("rnn_direction")  # kiln.onnx writes an LSTM's as ONNX's LSTM operator
    def _direction(self, x, state, weights, reverse: bool, scan: bool = False):
        """One direction of one layer: as the ``rnn_scan`` primitive (``scan``) or as per-step ops."""
        if scan:
            return _rnn.scan_direction(self.mode, x, state, weights, reverse)
        return decomposed_direction(self._step, x, state, weights, reverse)

    def _run_packed(self, packed: PackedSequence, states):
        data, batch_sizes = packed.data, [int(b) for b in packed.batch_sizes.tolist()]
        if data.dim() != 2 or data.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {data.shape[-1]}")  # fmt: skip
        states = [self._initial(data, s, batch_sizes[0], True, packed.sorted_indices) for s in states]

        def run_direction(x, state, weights, reverse):
            return self._direction_packed(x, batch_sizes, state, weights, reverse)

        data, finals = self._layers(data, states, self._per_direction(run_direction))
        if packed.unsorted_indices is not None:
            finals = [kiln.index_select(f, 1, packed.unsorted_indices) for f in finals]
        return PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices), finals

    def _direction_packed(self, data, batch_sizes, state, weights, reverse: bool):
        """One direction over packed rows: step t updates only the first ``batch_sizes[t]`` sequences."""
        w_ih, w_hh, b_ih, b_hh = weights
        gates_x = F.linear(data, w_ih, b_ih)
        offsets = [0]
        for size in batch_sizes:
            offsets.append(offsets[-1] + size)
        outs = [None] * len(batch_sizes)
        if not reverse:
            # Rows beyond the active ones keep their last state: at the end each holds its final state.
            for t, size in enumerate(batch_sizes):
                active = tuple(s[:size] for s in state)
                new = self._step(gates_x[offsets[t] : offsets[t + 1]], active, w_hh, b_hh)
                state = tuple(kiln.cat([n, s[size:]], dim=0) if size < s.shape[0] else n
                              for n, s in zip(new, state, strict=True))  # fmt: skip
                outs[t] = new[0]
        else:
            # Backward in time: a sequence joins (from its initial state) at its own last step.
            current = tuple(s[: batch_sizes[-1]] for s in state)
            for t in range(len(batch_sizes) - 1, -1, -1):
                size = batch_sizes[t]
                if size > current[0].shape[0]:
                    current = tuple(kiln.cat([c, s[c.shape[0] : size]], dim=0)
                                    for c, s in zip(current, state, strict=True))  # fmt: skip
                current = self._step(gates_x[offsets[t] : offsets[t + 1]], current, w_hh, b_hh)
                outs[t] = current[0]
            state = current
        return kiln.cat(outs, dim=0), state

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


class RNN(RNNBase):
    """Elman RNN, ``h_t = tanh(x W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` (or relu); returns ``output, h_n``.

    Arguments follow PyTorch: ``RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True,
    batch_first=False, dropout=0.0, bidirectional=False)``.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None) -> None:  # fmt: skip
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, device=device, dtype=dtype)  # fmt: skip

    def forward(self, input, hx=None):
        output, (h,) = self._run(input, [hx])
        return output, h

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s if self.nonlinearity == "tanh" else s + ", nonlinearity='relu'"


class LSTM(RNNBase):
    """Long short-term memory; ``forward(input, (h0, c0))`` returns ``output, (h_n, c_n)``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None) -> None:  # fmt: skip
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device=device, dtype=dtype)  # fmt: skip

    def forward(self, input, hx=None):
        states = [None, None] if hx is None else list(hx)
        if len(states) != 2:
            raise RuntimeError(f"LSTM: expected hx to be a tuple (h_0, c_0), got {len(states)} tensors")
        output, (h, c) = self._run(input, states)
        return output, (h, c)


class GRU(RNNBase):
    """Gated recurrent unit; ``forward(input, h0)`` returns ``output, h_n``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)  # fmt: skip

    def forward(self, input, hx=None):
        output, (h,) = self._run(input, [hx])
        return output, h


_ = (GRUCell, LSTMCell, RNNCell, RNNCellBase)  # re-exported: torch.nn.modules.rnn holds the cells too
