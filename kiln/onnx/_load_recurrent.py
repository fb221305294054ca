"""ONNX's LSTM and GRU operators run with kiln ops (``kiln.onnx.load``): one direction, layout 0
(time, batch, features), the default activations; what kiln exports."""

from __future__ import annotations

import kiln


def lstm(a, x, w, r, bias=None, sequence_lens=None, h0=None, c0=None, peepholes=None):
    """ONNX's LSTM with its default activations, one direction, layout 0 (time, batch, features)."""
    direction = a.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    unsupported = {"activations", "clip", "input_forget", "layout"} & {k for k, v in a.items() if v}
    if direction == "bidirectional" or unsupported or sequence_lens is not None or peepholes is not None:
        raise NotImplementedError(
            f"LSTM with direction={direction!r}, {sorted(unsupported)}, sequence_lens or peepholes"
        )
    hidden = a["hidden_size"]
    steps, batch = x.shape[0], x.shape[1]
    h = h0[0] if h0 is not None else kiln.zeros(batch, hidden, dtype=x.dtype)
    c = c0[0] if c0 is not None else kiln.zeros(batch, hidden, dtype=x.dtype)
    gates_x = kiln.matmul(x, w[0].transpose(0, 1))
    if bias is not None:
        gates_x = gates_x + bias[0, : 4 * hidden] + bias[0, 4 * hidden :]
    outs = [None] * steps
    for t in range(steps - 1, -1, -1) if direction == "reverse" else range(steps):
        i, o, f, g = kiln.chunk(gates_x[t] + kiln.matmul(h, r[0].transpose(0, 1)), 4, dim=-1)
        c = kiln.sigmoid(f) * c + kiln.sigmoid(i) * kiln.tanh(g)
        h = kiln.sigmoid(o) * kiln.tanh(c)
        outs[t] = h
    return kiln.stack(outs, dim=0).unsqueeze(1), h.unsqueeze(0), c.unsqueeze(0)


def gru(a, x, w, r, bias=None, sequence_lens=None, h0=None):
    """ONNX's GRU with its default activations, one direction, layout 0, linear_before_reset=1."""
    direction = a.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    unsupported = {"activations", "clip", "layout"} & {k for k, v in a.items() if v}
    if direction == "bidirectional" or unsupported or sequence_lens is not None or not a.get("linear_before_reset"):
        raise NotImplementedError(f"GRU with direction={direction!r}, {sorted(unsupported)}, sequence_lens or "
                                  "linear_before_reset=0")  # fmt: skip
    hidden = a["hidden_size"]
    steps, batch = x.shape[0], x.shape[1]
    h = h0[0] if h0 is not None else kiln.zeros(batch, hidden, dtype=x.dtype)
    gates_x = kiln.matmul(x, w[0].transpose(0, 1))
    if bias is not None:
        gates_x = gates_x + bias[0, : 3 * hidden]
    outs = [None] * steps
    for t in range(steps - 1, -1, -1) if direction == "reverse" else range(steps):
        gates_h = kiln.matmul(h, r[0].transpose(0, 1))
        if bias is not None:
            gates_h = gates_h + bias[0, 3 * hidden :]
        xz, xr, xh = kiln.chunk(gates_x[t], 3, dim=-1)
        hz, hr, hh = kiln.chunk(gates_h, 3, dim=-1)
        z, reset = kiln.sigmoid(xz + hz), kiln.sigmoid(xr + hr)
        h = (1 - z) * kiln.tanh(xh + reset * hh) + z * h
        outs[t] = h
    return kiln.stack(outs, dim=0).unsqueeze(1), h.unsqueeze(0)
