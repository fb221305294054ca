"""One direction of one layer of ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (or one step of a cell) as the
``rnn_scan`` primitive (``kiln/ir/primitives/recurrence.py``), eagerly and traced alike.

As PyTorch's native RNN kernels do: the input projection of all time steps is one matmul (biases
added once), the recurrence runs as one node (numpy's in-place kernels on the CPU), and its
backward runs through time in one node too, then computes ``dW_hh`` as one product over all steps
(``dW_ih`` and ``dx`` are the projection's own gradients, one product each). A traced layer is a few
nodes whatever the sequence's length, so its compile time does not grow with it.

``fusable`` says when a module may take this path: float32/float64 inputs of one dtype and device,
at least one step and one sequence, outside autocast (which lowers each product's inputs to
bfloat16: the per-step ops do that) and outside ``kiln.onnx.export``'s trace (which writes the
per-step ops, or ONNX's own LSTM and GRU operators, for ONNX has no ``rnn_scan``). Under
``create_graph`` the primitive's VJP differentiates kiln ops, so higher-order gradients stay exact.

Measured (compile_cost's 2-layer LSTM LM step, V=500, H=128, B=16, T=35, SGD + clipping, one
thread, on a busy shared 2-core machine): a traced step is 284 nodes at T=35 and at T=350 (the
per-step ops: 5,062 and 48,532); a cold compile took 0.4-2.5 s (per-step ops: 8.8 s) and its
passes and code generation the same time at T=350 (1.2-1.4 s), what grows being the traced first
call's own run of the step. Per step (CPU time), against the fused layer and per-step traces this
replaced: eager 22-24 ms (was 16-20 ms), compiled 20-21 ms (was 13-17 ms): numpy's step kernels,
the packed output's copies and its gradient's padding cost more than the per-step kernels that
LLVM fused; a compiled step kernel for the recurrence is what would win that back.
"""

from __future__ import annotations

import kiln
from kiln.frontend import autocast
from kiln.frontend.dispatch import apply
from kiln.frontend.jit import state as _jit
from kiln.ir.primitives import P
from kiln.ir.primitives.recurrence_layout import ScanLayout

from . import functional as F

__all__ = ["fusable", "fused_layer", "scan_direction"]

_SCAN = P["rnn_scan"]


def fusable(x, tensors) -> bool:
    """Whether a layer over ``x`` (T, B, in) with these weights and states may run as ``rnn_scan``
    (see the module docs)."""
    if autocast.state.any or _jit.per_step_recurrences.get():
        return False
    dtype, device = x.dtype, x.device
    if x.shape[0] == 0 or x.shape[1] == 0 or dtype not in (kiln.float32, kiln.float64):
        return False
    return all(t.dtype == dtype and t.device == device for t in tensors if t is not None)


def fused_layer(mode: str, x, states: list[tuple], weights: list[tuple]):
    """One layer: ``x`` (T, B, in); per direction its state tuple ((h,) or (h, c), each (B, H)) and
    weights (w_ih, w_hh, b_ih, b_hh; biases may be None). Returns the output (T, B, D H) and the
    final state tuple of each direction."""
    runs = [scan_direction(mode, x, state, w, reverse=d == 1)
            for d, (state, w) in enumerate(zip(states, weights, strict=True))]  # fmt: skip
    out = runs[0][0] if len(runs) == 1 else kiln.cat([out for out, _ in runs], dim=-1)
    return out, [state for _, state in runs]


def scan_direction(mode: str, x, state: tuple, weights: tuple, reverse: bool):
    """One direction: (its output (T, B, H), its final state tuple)."""
    w_ih, w_hh, b_ih, b_hh = weights
    hidden = w_hh.shape[1]
    gates = w_hh.shape[0]
    zeros = lambda n: kiln.zeros(n, dtype=x.dtype, device=x.device)  # noqa: E731
    if b_ih is None:
        bias, b_hn = zeros(gates), zeros(hidden)
    elif mode == "GRU":  # b_hh's n block is added after the reset gate, inside the recurrence
        bias, b_hn = b_ih + F.pad(b_hh[: 2 * hidden], (0, hidden)), b_hh[2 * hidden :]
    else:
        bias, b_hn = b_ih + b_hh, None
    gx = kiln.matmul(x, w_ih.transpose(0, 1))
    extra = [b_hn] if mode == "GRU" else []
    packed = apply(_SCAN, gx, bias, *state, w_hh, *extra, mode=mode, reverse=reverse)
    layout = ScanLayout(mode, hidden)
    # new memory, not a view of what the backward reads: changing it in place leaves the gradient alone
    out = packed.narrow(-1, *layout.out(0)).contiguous()
    # each a view of its own: a final state that no loss reads pads no gradient to the packed width
    final = tuple(packed.narrow(-1, *layout.final(s)).sum(0) for s in range(layout.states))
    return out, final
