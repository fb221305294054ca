"""``rnn_scan`` (one direction of one recurrent layer, ``ir/primitives/recurrence.py``) as ONNX's LSTM, GRU or RNN.

A program from ``kiln.export`` runs its recurrences as ``rnn_scan`` whether or not the trace recorded
the layer as a composite region (an ``nn.LSTMCell`` looped in Python makes one per step and no
region). ``rnn_scan`` is given the input projection ``gx = x W_ih^T`` already: the ONNX operator reads it
as its input with an identity ``W``, the gate blocks reordered to ONNX's order. Its packed output
(``recurrence_layout.ScanLayout``) is rebuilt for what ONNX's operator gives: each step's h and the final
states (in the last step's row, zeros elsewhere); a program that reads anything else of it (an LSTM's c
at every step, the gates: a backward pass) is refused, naming the op.
"""

from __future__ import annotations

import numpy as np

from ..ir.primitives.recurrence_layout import ScanLayout
from ._builder import OnnxExportError

# mode -> (ONNX operator, PyTorch's gate blocks in ONNX's order, attributes): LSTM (i, f, g, o) -> (i, o, f, c);
# GRU (r, z, n) -> (z, r, h), its reset gate applied after the recurrent product as kiln's is.
_OPERATORS = {
    "LSTM": ("LSTM", (0, 3, 1, 2), {}),
    "GRU": ("GRU", (1, 0, 2), {"linear_before_reset": 1}),
    "RNN_TANH": ("RNN", (0,), {"activations": ["Tanh"]}),
    "RNN_RELU": ("RNN", (0,), {"activations": ["Relu"]}),
}


def rnn_scan(b, node, gx, bias, *rest):
    mode, reverse = node.attrs["mode"], node.attrs["reverse"]
    hidden = node.inputs[_W_HH[mode]].type.shape[1]
    layout = ScanLayout(mode, hidden)
    _check_readers(b, node, layout)
    op_type, order, extra = _OPERATORS[mode]
    gh = layout.gates * hidden
    dtype = np.dtype(node.output.type.dtype.np)
    states = list(rest[: layout.states])
    w_hh = rest[layout.states]
    first = b.ints([0])
    x = _reordered(b, gx, hidden, order, axis=2)
    w = b.const(np.eye(gh, dtype=dtype)[None], "rnn_identity")  # gx is x W_ih^T already
    r = b.op("Unsqueeze", [_reordered(b, w_hh, hidden, order, axis=0), first])
    if mode == "GRU":  # b_hn, scaled by the reset gate: ONNX's Rb of the h block (the last in its order)
        recurrent = b.op("Concat", [b.const(np.zeros(2 * hidden, dtype), "rnn_zero_bias"), rest[-1]], axis=0)
    else:
        recurrent = b.const(np.zeros(gh, dtype), "rnn_zero_bias")
    biases = b.op("Unsqueeze", [b.op("Concat", [_reordered(b, bias, hidden, order, axis=0), recurrent], axis=0), first])
    initial = [b.op("Unsqueeze", [s, first]) for s in states]
    outs = b.op(op_type, [x, w, r, biases, "", *initial], outputs=1 + layout.states, hint=op_type.lower(),
                hidden_size=hidden, direction="reverse" if reverse else "forward", **extra)  # fmt: skip
    steps = b.op("Squeeze", [outs[0], b.ints([1])])  # (T, B, H)
    last = _last_row(b, gx, reverse)
    zero = b.scalar(0, dtype)
    finals = [b.op("Where", [last, final, zero]) for final in outs[1:]]  # (T, B, H): the final states' row
    filled = (1 + layout.states) * hidden
    rows = b.op("Shape", [steps], start=0, end=2)
    unused = b.op("Expand", [zero, b.op("Concat", [rows, b.ints([layout.width - filled])], axis=0)])
    return b.op("Concat", [steps, *finals, unused], hint="rnn_scan", axis=2)


# the position of w_hh among rnn_scan's inputs, by mode
_W_HH = {"LSTM": 4, "GRU": 3, "RNN_TANH": 3, "RNN_RELU": 3}


def _reordered(b, name: str, hidden: int, order, axis: int) -> str:
    if order == (0,):
        return name
    axes = b.ints([axis])
    blocks = [b.op("Slice", [name, b.ints([k * hidden]), b.ints([(k + 1) * hidden]), axes]) for k in order]
    return b.op("Concat", blocks, axis=axis)


def _last_row(b, gx: str, reverse: bool) -> str:
    """A (T, 1, 1) mask of the direction's last step: t = T - 1 forward, 0 in reverse (from a cumulative
    sum of ones, which kiln.onnx.load reads too)."""
    steps = b.op("Shape", [gx], start=0, end=1)
    position = b.op("CumSum", [b.op("Expand", [b.ints([1]), steps]), b.scalar(0, np.int64)])  # 1..T
    return b.op("Unsqueeze", [b.op("Equal", [position, b.ints([1]) if reverse else steps]), b.ints([1, 2])])


def _check_readers(b, node, layout: ScanLayout) -> None:
    """Every reader of the packed output slices h or the final states, all ONNX's operator gives."""
    end = (1 + layout.states) * layout.hidden
    if node.output in b.graph.outputs:
        raise OnnxExportError(b.context(
            f"a {layout.mode} recurrence (rnn_scan) whose whole packed result is an output: ONNX's {layout.mode} "
            f"gives each step's h and the final states (the first {end} of {layout.width} columns) only"))  # fmt: skip
    for reader in b.graph.nodes:
        if node.output not in reader.inputs:
            continue
        a = reader.attrs
        ok = reader.op == "slice" and a["starts"][-1] >= 0 and isinstance(a["stops"][-1], int) and a["stops"][-1] <= end
        if not ok:
            what = f"{reader.op}" + (f" of [{a['starts'][-1]}:{a['stops'][-1]}]" if reader.op == "slice" else "")
            raise OnnxExportError(b.context(
                f"a {layout.mode} recurrence (rnn_scan) whose packed result is read by {what}: ONNX's {layout.mode} "
                f"gives each step's h and the final states (the first {end} of {layout.width} columns) only, not "
                "the cell state at every step or the gates (a backward pass); export the forward call"))  # fmt: skip


__all__ = ["rnn_scan"]
