"""One step of ``nn.LSTMCell``/``nn.GRUCell``/``nn.RNNCell`` eagerly on the CPU: one lean autograd node.

A cell's step runs the recurrence kernels of the fused layer (``kiln/ir/primitives/recurrence_numpy.py``;
a step's backward calls them itself, as does an LSTM's forward; a GRU's or an Elman RNN's forward goes
through ``_rnn._forward_direction``) but records its own node, ``CellStepBackward``, not
the layer's ``autograd.Function``. A loop over 1,000 time steps builds thousands of these, and every
Python object a node keeps alive is walked again by each full collection of the cyclic garbage
collector, whose number per training step grows with the graph: the work grew with the square of the
loop's length. With the layer's node a step kept 34 tracked objects (its context, nine saved tensors,
a spec, output metadata, edge tuples), and a 1,000-step loop of two cells spent 260 ms of a 1.1 s
training step in the collector; this node keeps its inputs' tuple and their versions (and two arrays,
which the collector does not track), and makes its edges when the backward first reads them, as
``PrimBackward`` does for leaves.

The new state tensors are the forward's own arrays, not copies: one step's backward reads the gate
activations (and an LSTM's ``tanh(c')``), never the new states, so an in-place change of them leaves
the gradient alone. Under ``create_graph`` (or when a trace records the backward) the node
differentiates the ``rnn_scan`` primitive's path instead, as the layer's node does.
"""

from __future__ import annotations

import numpy as np

from kiln.frontend.autograd import grad_mode
from kiln.frontend.autograd.graph import Node, _edge_of, _forward_stack, _freed_error, _next_seq, version_error
from kiln.frontend.jit import state as _jit
from kiln.frontend.tensor import make_tensor
from kiln.ir.primitives import recurrence_numpy as kernels

from . import _rnn

__all__ = ["CellStepBackward", "cell_step", "lean"]

_NAMES = {"LSTM": "LSTMCell", "GRU": "GRUCell", "RNN_TANH": "RNNTanhCell", "RNN_RELU": "RNNReluCell"}
_grad_state = grad_mode.state


def lean(x, tensors) -> bool:
    """Whether a step over ``x`` (B, in) with these states and weights may take ``cell_step``: where the
    fused layer may run eagerly on the CPU, outside any trace and on no inference tensor (whose saving
    the layer's node refuses with its own error). A trace in another thread (eager kernels' composites
    are traced in the background while a fresh process's first steps run) records nothing of this one's."""
    return (
        not (_jit.tracing and _jit.current.get() is not None)
        and x._device.type == "cpu"
        and not x._inference
        and _rnn.fusable(x, tensors)
        and not any(t._inference for t in tensors if t is not None)
    )


def cell_step(mode: str, x, states: list, weights: tuple) -> tuple:
    """The new state tuple ((h,), or an LSTM's (h, c)) of one step: ``x`` (B, in), ``states`` (B, H)
    tensors, ``weights`` (w_ih, w_hh, b_ih, b_hh; biases may be None)."""
    inputs = (x, *states, *(w for w in weights if w is not None))
    if mode == "LSTM":
        gates, block = _lstm_forward(*[t._data for t in inputs])
    else:
        saved = _rnn._forward_direction(mode, x._data, (1, x._data.shape[0]), states, weights, reverse=False)
        gates, block = saved.gates, saved.block
    device, dtype = x._device, x._dtype
    count = 2 if mode == "LSTM" else 1
    outputs = tuple([make_tensor(block[s, 0], device, dtype) for s in range(count)])
    if not _grad_state.grad_enabled:
        return outputs
    wants = 0
    for i, t in enumerate(inputs):
        if t._requires_grad:
            wants |= 1 << i
    if wants:
        CellStepBackward.record(mode, inputs, wants, gates, block, outputs)
    return outputs


class CellStepBackward(Node):
    """The backward of one cell step. ``inputs``: (x, *states, w_ih, w_hh[, b_ih, b_hh]), held as the
    tensors (a create_graph backward differentiates through them); ``versions``: theirs at the step;
    ``wants``: a bit per input that required grad; ``gates``/``block``: the step's ``_rnn._Saved``."""

    __slots__ = ("mode", "inputs", "versions", "wants", "gates", "block", "num_outputs", "_edges")
    mode: str
    inputs: tuple | None  # None once released
    versions: tuple[int, ...]
    wants: int
    gates: np.ndarray | None
    block: np.ndarray | None
    num_outputs: int  # type: ignore[misc]  # Node's class attribute, a slot here
    _edges: tuple | None  # None until first read

    @classmethod
    def record(cls, mode: str, inputs: tuple, wants: int, gates, block, outputs: tuple) -> None:
        """Make the node of a step and attach it to the step's ``outputs``."""
        node = object.__new__(cls)
        node.seq = _next_seq()
        node.pre_hooks = node.hooks = None
        node.forward_stack = _forward_stack(2) if grad_mode.anomaly_used and _grad_state.anomaly else None
        node.mode, node.inputs, node.wants = mode, inputs, wants
        node.versions = tuple([t._version[0] for t in inputs])
        node.gates, node.block = gates, block
        node.num_outputs = len(outputs)
        node._edges = None
        for i, out in enumerate(outputs):
            out.grad_fn, out._output_nr, out._requires_grad = node, i, True

    @property
    def next_edges(self) -> tuple:  # type: ignore[override]  # Node's slot, made lazy here
        """One edge per input, made at the first read (by the backward): no edge tuples per step while
        the graph is built. (An input changed in place since the step fails the version check first.)"""
        edges = self._edges
        if edges is None:
            inputs, wants = self.inputs, self.wants
            if inputs is None:
                raise _freed_error(self)
            edges = self._edges = tuple([_edge_of(t) if wants >> i & 1 else None for i, t in enumerate(inputs)])
        return edges

    def name(self) -> str:
        return _NAMES[self.mode] + "Backward"

    def release(self) -> None:
        self.inputs = self.gates = self.block = None

    def apply(self, grads: list) -> tuple:
        inputs = self.inputs
        if inputs is None:
            raise _freed_error(self)
        for t, version in zip(inputs, self.versions, strict=True):
            if t._version[0] != version:
                raise version_error(self, version, t._version[0])
        wants, gates, block = self.wants, self.gates, self.block
        assert gates is not None and block is not None  # (released with inputs)
        needs = tuple([bool(wants >> i & 1) for i in range(len(inputs))])
        spec = _rnn._Spec(self.mode, 1, self.num_outputs, len(inputs) == self.num_outputs + 5, False)
        if _grad_state.grad_enabled or _rnn._tracing():  # create_graph: a differentiable backward
            zeros = lambda: inputs[1].new_zeros(inputs[1].shape)  # noqa: E731
            grads = [zeros() if g is None else g for g in grads]
            return tuple(_rnn._recomputed_grads(spec, inputs, tuple(grads), needs))
        # (a step output that no loss reads, as the last c of a loop, gets no gradient: zeros)
        dfinals = [np.zeros(block.shape[-2:], block.dtype) if g is None else g._data for g in grads]
        found = _step_grads(self.mode, gates, block, [t._data for t in inputs], dfinals, needs)
        device, dtype = inputs[0]._device, inputs[0]._dtype
        return tuple([None if g is None else make_tensor(g, device, dtype) for g in found])


def _lstm_forward(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None) -> tuple[np.ndarray, np.ndarray]:
    """One LSTM step on arrays: (the gate activations (1, B, 4, H), the block (3, 1, B, H) of h', c' and
    tanh(c')), as ``_rnn._forward_direction`` computes them for one step."""
    batch, hidden = h.shape
    gates = x @ w_ih.T
    if b_ih is not None:
        gates += b_ih + b_hh
    gates = gates.reshape(1, batch, 4, hidden)
    block = np.empty((3, 1, batch, hidden), dtype=gates.dtype)
    kernels.lstm_forward(gates, h, c, block[0], block[1], block[2], w_hh.T)
    return gates, block


def _step_grads(mode: str, gates, block, arrays: list, dfinals: list, needs: tuple) -> list:
    """The gradients (arrays, None where not needed) of one step's inputs ``arrays`` (x, *states, w_ih,
    w_hh[, b_ih, b_hh]) from those of its outputs ``dfinals`` (dh'[, dc']): the recurrence kernel's
    backward over one step, then one product per weight (``_rnn._numpy_grads`` for T = 1, without the
    copies its reverse directions and sequence outputs need)."""
    states = len(dfinals)
    x, h = arrays[0], arrays[1]
    w_ih, w_hh = arrays[1 + states], arrays[2 + states]
    dh = dfinals[0][None]
    dz = np.empty_like(gates)
    dz_hh = dz  # the pre-activations' gradient through W_hh: a GRU's n block differs (r scales it)
    if mode == "LSTM":
        dstates = kernels.lstm_backward(gates, arrays[2][None], block[2], w_hh, dh, dfinals[1][None], None, dz)
    elif mode == "GRU":
        dz_hh = np.empty_like(gates)
        dstates = (kernels.gru_backward(gates, h[None], block[1], w_hh, dh, None, None, dz, dz_hh),)
    else:
        dstates = (kernels.rnn_backward(gates, w_hh, dh, None, mode == "RNN_RELU", dz),)
    batch = h.shape[0]
    dz, dz_hh = dz.reshape(batch, -1), dz_hh.reshape(batch, -1)
    found = [dz @ w_ih if needs[0] else None, *dstates]
    found += [dz.T @ x if needs[1 + states] else None, dz_hh.T @ h if needs[2 + states] else None]
    if len(arrays) == 5 + states:  # the biases (an LSTM's and an Elman RNN's: one sum, two arrays)
        db = dz.sum(0)
        found += [db, db.copy() if dz_hh is dz else dz_hh.sum(0)]
    return [g if need else None for g, need in zip(found, needs, strict=True)]
