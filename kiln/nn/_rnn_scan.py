"""One direction of a traced RNN layer: the ``rnn_scan`` primitive, read by the layer as its output and
final states through one autograd node whose backward hands ``rnn_scan_backward`` their gradients as
they are.

Read by views of the packed output (``packed.narrow(...)``), the layer's gradient reached ``rnn_scan``'s
VJP as one cotangent of the packed width, which autograd assembled by zero pads: a traced call wrote
it for real (two LSTM layers of an LM at T=350: 16 MB of fresh memory, 40-110 ms of page faults on
the shared VM, in the first call that the compile waits for), and the compiled program only lost it
to ``simplify``. Here the backward gives each part of a row its own array (``ScanLayout.parts``): h's
gradient, a final state's broadcast over time (a sum's gradient: the kernel reads its last row), and
a broadcast zero for every part nobody read -- views eagerly, ``expand`` nodes traced.

Under ``create_graph`` (grad mode on while the backward runs) it recomputes the layer through the
primitive and differentiates that (``rnn_scan``'s VJP is exact to any order), as
``_rnn._recomputed_grads`` does for the eager layer.
"""

from __future__ import annotations

import kiln
from kiln.frontend import ops
from kiln.frontend.dispatch import apply
from kiln.ir.primitives import P
from kiln.ir.primitives.recurrence import scan_gradients
from kiln.ir.primitives.recurrence_layout import ScanLayout

__all__ = ["scan_direction"]

_SCAN, _SCAN_BACKWARD = P["rnn_scan"], P["rnn_scan_backward"]


def scan_direction(mode: str, x, state: tuple, weights: tuple, reverse: bool):
    """One direction over ``x`` (T, B, in) as the ``rnn_scan`` primitive: (its output (T, B, H), its final
    state tuple)."""
    w_ih, w_hh, b_ih, b_hh = weights
    hidden, gates = w_hh.shape[1], w_hh.shape[0]
    zeros = lambda n: kiln.zeros(n, dtype=x.dtype, device=x.device)  # noqa: E731
    if b_ih is None:
        bias, b_hn = zeros(gates), zeros(hidden)
    elif mode == "GRU":  # b_hh's n block is added after the reset gate, inside the recurrence
        bias, b_hn = b_ih + kiln.nn.functional.pad(b_hh[: 2 * hidden], (0, hidden)), b_hh[2 * hidden :]
    else:
        bias, b_hn = b_ih + b_hh, None
    # One product over the rows of all steps, 2-d: its gradient's products then read rnn_scan_backward's
    # dz where it lies (rows strided by the packed gradient's width), which the 3-d product copied first.
    gx = kiln.matmul(x.reshape(-1, x.shape[-1]), w_ih.transpose(0, 1)).reshape(x.shape[0], x.shape[1], gates)
    extra = [b_hn] if mode == "GRU" else []
    out, *final = _ScannedDirection.apply(ScanLayout(mode, hidden), reverse, gx, bias, *state, w_hh, *extra)
    return out, tuple(final)


def _read(layout: ScanLayout, packed) -> tuple:
    """(the output h, *the final states) of ``rnn_scan``'s packed output: new memory, not views of what
    the backward reads (changing them in place leaves the gradient alone)."""
    out = packed.narrow(-1, *layout.out(0)).contiguous()
    return (out, *(packed.narrow(-1, *layout.final(s)).sum(0) for s in range(layout.states)))


class _ScannedDirection(kiln.autograd.Function):
    """``apply(layout, reverse, *inputs)`` (``rnn_scan``'s) -> (output, *final states)."""

    kiln_only = True  # calls no user code: a traced call runs it unwatched (``jit.hazards``)

    @staticmethod
    def forward(ctx, layout: ScanLayout, reverse: bool, *inputs):
        packed = apply(_SCAN, *inputs, mode=layout.mode, reverse=reverse)
        ctx.save_for_backward(*inputs, packed)
        ctx.layout, ctx.reverse = layout, reverse
        return _read(layout, packed)

    @staticmethod
    def backward(ctx, *grads):
        *inputs, packed = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        layout, reverse = ctx.layout, ctx.reverse
        if kiln.is_grad_enabled():  # create_graph: a backward that autograd can differentiate again
            return (None, None, *_recomputed(layout, reverse, inputs, grads, needs))
        w_hh = inputs[-2] if layout.mode == "GRU" else inputs[-1]
        parts = _cotangent_parts(layout, packed, grads)
        back = apply(_SCAN_BACKWARD, packed, w_hh, *parts, mode=layout.mode, reverse=reverse)
        return (None, None, *scan_gradients(ops, layout.mode, packed, w_hh, back, needs))


def _cotangent_parts(layout: ScanLayout, packed, grads: tuple) -> tuple:
    """The cotangent of ``packed`` a part of a row at a time (``ScanLayout.parts``): the output's and
    the final states' gradients (broadcast over time: the kernel reads a final's in its last row),
    a broadcast zero for the others."""
    steps, batch = packed.shape[0], packed.shape[1]
    given = {}
    if grads[0] is not None:
        given[layout.out(0)] = grads[0]
    for s, g in enumerate(grads[1:]):
        if g is not None:
            given[layout.final(s)] = g.unsqueeze(0).expand(steps, batch, layout.hidden)
    zero = kiln.zeros((), dtype=packed.dtype, device=packed.device)
    return tuple(given.get(span, zero.expand(steps, batch, span[1])) for span in layout.parts)


def _recomputed(layout: ScanLayout, reverse: bool, inputs: list, grads: tuple, needs: tuple) -> list:
    """The inputs' gradients through the primitive recomputed with grad on, differentiable again. Each
    input that needs a gradient enters through a new view of itself (the layer's own partial gradients,
    as ``_rnn._recomputed_grads``)."""
    with kiln.enable_grad():
        entries = [t.view_as(t) if need else t for t, need in zip(inputs, needs, strict=True)]
        outputs = _read(layout, apply(_SCAN, *entries, mode=layout.mode, reverse=reverse))
        given = [(out, g) for out, g in zip(outputs, grads, strict=True) if g is not None]
        wanted = [e for e, need in zip(entries, needs, strict=True) if need]
        found = iter(kiln.autograd.grad([o for o, _ in given], wanted, [g for _, g in given], create_graph=True,
                                        allow_unused=True))  # fmt: skip
    return [next(found) if need else None for need in needs]
