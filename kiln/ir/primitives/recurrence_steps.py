"""``rnn_scan`` and ``rnn_scan_backward`` step by step, in plain array code that any array library runs.

Written once against ``ArrayOps`` (a few functions) plus what numpy arrays, cupy arrays, torch
tensors and kiln tensors all share: ``+ - *``, ``@``, indexing and ``transpose``. It serves as

- the kernels on an array namespace other than numpy's (``xp_ops``: cupy on CUDA);
- the PyTorch reference of both primitives (``torch_ops``);
- ``rnn_scan``'s VJP under ``create_graph`` (``kiln_ops``): kiln ops recording autograd nodes, so that
  the gradient is itself differentiable (higher-order gradients, ``kiln.func`` transforms).

The layout of the packed arrays is ``recurrence_layout.py``'s; time runs over rows in natural order,
forward or backward as the direction says, and each step builds its row whole, so no array is
written in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .recurrence_layout import ScanLayout


@dataclass(frozen=True)
class ArrayOps:
    """The functions the steps need whose spelling differs between array libraries."""

    tanh: Callable[[Any], Any]
    sigmoid: Callable[[Any], Any]
    relu: Callable[[Any], Any]
    positive: Callable[[Any], Any]  # 1 where > 0, else 0, in the input's dtype
    stack: Callable[[list], Any]  # along a new dim 0
    cat: Callable[[list], Any]  # along the last dim
    zeros_like: Callable[[Any], Any]


def xp_ops(xp) -> ArrayOps:
    """numpy or cupy."""
    return ArrayOps(xp.tanh, lambda a: 1 / (1 + xp.exp(-a)), lambda a: xp.maximum(a, 0),
                    lambda a: (a > 0).astype(a.dtype), lambda rows: xp.stack(rows, 0),
                    lambda parts: xp.concatenate(parts, -1), xp.zeros_like)  # fmt: skip


def torch_ops(torch) -> ArrayOps:
    return ArrayOps(torch.tanh, torch.sigmoid, torch.relu, lambda a: (a > 0).to(a.dtype),
                    lambda rows: torch.stack(rows, 0), lambda parts: torch.cat(parts, -1), torch.zeros_like)  # fmt: skip


def kiln_ops(ops) -> ArrayOps:
    """The ``ops`` namespace that VJP rules receive."""
    return ArrayOps(ops.tanh, ops.sigmoid, ops.relu, lambda a: ops.where(ops.gt(a, 0), 1.0, 0.0).to(a.dtype),
                    lambda rows: ops.stack(rows, 0), lambda parts: ops.cat(parts, -1), ops.zeros_like)  # fmt: skip


def _part(row, span):
    return row[:, span[0] : span[0] + span[1]]


def _order(steps: int, reverse: bool) -> list[int]:
    """The rows in the order the direction visits them."""
    return list(range(steps - 1, -1, -1)) if reverse else list(range(steps))


# ----------------------------------------------------------------------------- the forward
def scan(ns: ArrayOps, gx, bias, h0, c0, w_hh, b_hn, *, mode: str, reverse: bool):
    """``rnn_scan``'s packed output (T >= 1)."""
    layout = ScanLayout(mode, w_hh.shape[1])
    order = _order(gx.shape[0], reverse)
    step = _FORWARD[mode]
    w_t = w_hh.transpose(1, 0)
    state = (h0, c0)[: layout.states]
    rows: list = [None] * len(order)
    for t in order:
        gates, extra, new = step(ns, gx[t] + bias, state, w_t, b_hn, layout)
        rows[t] = (new, state, gates, extra)
        state = new
    last = order[-1]
    packed = []
    for t, (new, prev, gates, extra) in enumerate(rows):
        final = new if t == last else [ns.zeros_like(s) for s in new]
        parts = [(layout.gate_span, gates)] + ([] if layout.extra is None else [(layout.extra, extra)])
        for s in range(layout.states):
            parts += [(layout.out(s), new[s]), (layout.final(s), final[s]), (layout.prev(s), prev[s])]
        packed.append(ns.cat([part for _, part in sorted(parts, key=lambda span_part: span_part[0][0])]))
    return ns.stack(packed)


def _lstm_step(ns, gx, state, w_t, b_hn, layout):
    h, c = state
    hidden = layout.hidden
    z = gx + h @ w_t
    i, f, o = (ns.sigmoid(z[:, k * hidden : (k + 1) * hidden]) for k in (0, 1, 3))
    g = ns.tanh(z[:, 2 * hidden : 3 * hidden])
    c = f * c + i * g
    tanh_c = ns.tanh(c)
    return ns.cat([i, f, g, o]), tanh_c, (o * tanh_c, c)


def _gru_step(ns, gx, state, w_t, b_hn, layout):
    (h,) = state
    hidden = layout.hidden
    zh = h @ w_t
    r = ns.sigmoid(gx[:, :hidden] + zh[:, :hidden])
    z = ns.sigmoid(gx[:, hidden : 2 * hidden] + zh[:, hidden : 2 * hidden])
    hn = zh[:, 2 * hidden :] + b_hn
    n = ns.tanh(gx[:, 2 * hidden :] + r * hn)
    return ns.cat([r, z, n]), hn, (n + z * (h - n),)


def _rnn_step(ns, gx, state, w_t, b_hn, layout):
    (h,) = state
    act = ns.relu if layout.mode == "RNN_RELU" else ns.tanh
    y = act(gx + h @ w_t)
    return y, None, (y,)


_FORWARD = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN_TANH": _rnn_step, "RNN_RELU": _rnn_step}


# ----------------------------------------------------------------------------- the backward
def scan_backward(ns: ArrayOps, packed, w_hh, g, *, mode: str, reverse: bool):
    """``rnn_scan_backward``'s packed output (T >= 1): ``g`` is the cotangent of ``packed``."""
    layout = ScanLayout(mode, w_hh.shape[1])
    order = _order(packed.shape[0], reverse)
    step = _BACKWARD[mode]
    carry: tuple | None = None  # the gradients of the states after the step, from the steps after it
    rows: list = [None] * len(order)
    for k in range(len(order) - 1, -1, -1):
        t = order[k]
        row, cot = packed[t], g[t]
        d_state = []
        for s in range(layout.states):
            d = _part(cot, layout.out(s))
            # the state after this step is the next step's ``prev`` -- or, after the last, ``final``
            d = d + (_part(cot, layout.final(s)) if k == len(order) - 1 else _part(g[order[k + 1]], layout.prev(s)))
            d_state.append(d if carry is None else d + carry[s])
        dz, dz_hh, carry = step(ns, row, cot, d_state, w_hh, layout)
        rows[t] = [dz, *([dz_hh] if layout.mode == "GRU" else [])]
    first = order[0]
    assert carry is not None, "rnn_scan_backward over no steps"
    initial = [carry[s] + _part(g[first], layout.prev(s)) for s in range(layout.states)]
    for t, parts in enumerate(rows):
        parts += initial if t == first else [ns.zeros_like(s) for s in initial]
    return ns.stack([ns.cat(parts) for parts in rows])


def _lstm_back(ns, row, cot, d_state, w_hh, layout):
    hidden = layout.hidden
    gates, d_gates = _part(row, layout.gate_span), _part(cot, layout.gate_span)
    i, f, g, o = (gates[:, k * hidden : (k + 1) * hidden] for k in range(4))
    di, df, dg, do = (d_gates[:, k * hidden : (k + 1) * hidden] for k in range(4))
    tanh_c, c_prev = _part(row, layout.extra), _part(row, layout.prev(1))
    dh, dc = d_state
    do = do + dh * tanh_c
    dc = dc + (dh * o + _part(cot, layout.extra)) * (1 - tanh_c * tanh_c)
    dz = ns.cat([(di + dc * g) * i * (1 - i), (df + dc * c_prev) * f * (1 - f), (dg + dc * i) * (1 - g * g),
                 do * o * (1 - o)])  # fmt: skip
    return dz, dz, (dz @ w_hh, dc * f)


def _gru_back(ns, row, cot, d_state, w_hh, layout):
    hidden = layout.hidden
    gates, d_gates = _part(row, layout.gate_span), _part(cot, layout.gate_span)
    r, z, n = (gates[:, k * hidden : (k + 1) * hidden] for k in range(3))
    dr, dz_act, dn = (d_gates[:, k * hidden : (k + 1) * hidden] for k in range(3))
    hn, h_prev = _part(row, layout.extra), _part(row, layout.prev(0))
    (dh,) = d_state
    dz_n = (dn + dh * (1 - z)) * (1 - n * n)
    dz_r = (dr + dz_n * hn) * r * (1 - r)
    dz_z = (dz_act + dh * (h_prev - n)) * z * (1 - z)
    dz_hh = ns.cat([dz_r, dz_z, dz_n * r + _part(cot, layout.extra)])
    return ns.cat([dz_r, dz_z, dz_n]), dz_hh, (dh * z + dz_hh @ w_hh,)


def _rnn_back(ns, row, cot, d_state, w_hh, layout):
    y = _part(row, layout.gate_span)
    slope = ns.positive(y) if layout.mode == "RNN_RELU" else 1 - y * y
    dz = (d_state[0] + _part(cot, layout.gate_span)) * slope
    return dz, dz, (dz @ w_hh,)


_BACKWARD = {"LSTM": _lstm_back, "GRU": _gru_back, "RNN_TANH": _rnn_back, "RNN_RELU": _rnn_back}
