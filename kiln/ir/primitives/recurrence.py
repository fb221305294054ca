"""The recurrence of one direction of one RNN layer: ``rnn_scan`` and its backward, ``rnn_scan_backward``.

``rnn_scan(gx, bias, h0[, c0], w_hh[, b_hn], mode=, reverse=)`` runs ``mode``'s cell (``LSTM``,
``GRU``, ``RNN_TANH``, ``RNN_RELU``) over the time steps of ``gx`` (T, B, G H), the input projection
``x W_ih^T``, plus ``bias`` (G H: the biases that add to it, an LSTM's and an RNN's ``b_ih + b_hh``, a
GRU's ``b_ih`` plus ``b_hh``'s r and z blocks), from the initial states ``h0`` (and an LSTM's ``c0``),
(B, H), with the recurrent weight ``w_hh`` (G H, H) and a GRU's ``b_hn`` (H), the n block of ``b_hh``
that the reset gate scales. ``reverse`` runs from the last step to the first. The frontend computes
``gx`` with one traced product over all steps, so a traced layer is a few nodes whatever T; the
bias is added as the kernel reads ``gx`` (an LSTM's and a GRU's native kernels read it where it
lies and write the gate activations into the output; numpy adds it into the output first).

A primitive has one output: ``rnn_scan``'s packs, per step, the states after and before it, the
final states, the gate activations and what the backward needs besides (``recurrence_layout.py``);
the frontend and the VJP read them back with views. Its VJP runs ``rnn_scan_backward`` (the backward
through time, giving the gradients of the gate pre-activations and of the initial states, packed)
and then ``dW_hh`` and ``db_hn`` as one product and one sum over all steps; ``gx``'s gradient is a
view of the packed ``dz``, from which the frontend's ops give ``dx``, ``dW_ih`` and the biases' (the
products read its strided rows where they lie). ``rnn_scan_backward`` takes the cotangent of the
packed output whole or one array per part of a row: the VJP passes the parts, so that a traced
program hands it the gradients the loss gave as they are and broadcast zeros for the parts nobody
read (``simplify`` resolves the slices of the autograd's zero pad), and no array of the packed width
is written for the backward.

Under ``create_graph`` the VJP runs the backward through time as kiln ops instead
(``recurrence_steps``), so the gradient is differentiable again and higher orders are exact;
``rnn_scan_backward`` is therefore only ever run with grad mode off, and is not differentiable.

Both are of kind ``RECURRENCE``: never fused, each runs as an extern with its eager kernel -- numpy's
in-place kernels (``recurrence_numpy``) on the CPU, which hand an LSTM's or a GRU's recurrence to the
native kernels that ``recurrence_native`` lends them once compiled, the step-by-step array code
(``recurrence_steps``) on another namespace (cupy).
"""

from __future__ import annotations

import numpy as np

from ..types import Dim, TensorType
from . import NOT_DIFFERENTIABLE, Kind, Primitive, Sample, register
from . import recurrence_numpy as fast
from . import recurrence_steps as steps
from .recurrence_layout import GATES, MODES, ScanLayout

#: The inputs of ``rnn_scan`` by mode.
_INPUTS = {
    "LSTM": ("gx", "bias", "h0", "c0", "w_hh"),
    "GRU": ("gx", "bias", "h0", "w_hh", "b_hn"),
    "RNN_TANH": ("gx", "bias", "h0", "w_hh"),
    "RNN_RELU": ("gx", "bias", "h0", "w_hh"),
}


def _check_mode(op: str, mode) -> None:
    if mode not in MODES:
        raise ValueError(f"{op}: mode must be one of {', '.join(MODES)}, got {mode!r}")


def _named(op: str, mode: str, types: tuple) -> dict:
    names = _INPUTS[mode]
    if len(types) != len(names):
        raise TypeError(f"{op}[mode={mode}] takes {len(names)} inputs ({', '.join(names)}), got {len(types)}")
    return dict(zip(names, types, strict=True))


def _same_kind(op: str, types: dict) -> TensorType:
    first = next(iter(types.values()))
    if any(not t.dtype.is_floating_point or t.dtype is not first.dtype or t.device != first.device
           for t in types.values()):  # fmt: skip
        listed = ", ".join(f"{n}: {u.dtype.name} on {u.device}" for n, u in types.items())
        raise TypeError(f"{op}: expected floating-point inputs of one dtype on one device, got {listed}")
    return first


def _expect(op: str, name: str, t: TensorType, shape: tuple[Dim, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise RuntimeError(f"{op}: expected {name} of shape {list(shape)}, got {list(t.shape)}")


# ----------------------------------------------------------------------------- rnn_scan
def _scan_infer(*types: TensorType, mode: str, reverse: bool) -> TensorType:
    _check_mode("rnn_scan", mode)
    named = _named("rnn_scan", mode, types)
    first = _same_kind("rnn_scan", named)
    w_hh, gx = named["w_hh"], named["gx"]
    if w_hh.ndim != 2 or not isinstance(w_hh.shape[1], int) or w_hh.shape[0] != GATES[mode] * w_hh.shape[1]:
        raise RuntimeError(f"rnn_scan[mode={mode}]: expected w_hh of shape [{GATES[mode]} * hidden, hidden], "
                           f"got {list(w_hh.shape)}")  # fmt: skip
    hidden = w_hh.shape[1]
    if gx.ndim != 3:
        raise RuntimeError(
            f"rnn_scan: expected gx of shape [steps, batch, {GATES[mode] * hidden}], got {list(gx.shape)}"
        )
    steps_, batch = gx.shape[0], gx.shape[1]
    _expect("rnn_scan", "gx", gx, (steps_, batch, GATES[mode] * hidden))
    for name in ("h0", "c0"):
        if name in named:
            _expect("rnn_scan", name, named[name], (batch, hidden))
    _expect("rnn_scan", "bias", named["bias"], (GATES[mode] * hidden,))
    if "b_hn" in named:
        _expect("rnn_scan", "b_hn", named["b_hn"], (hidden,))
    return TensorType((steps_, batch, ScanLayout(mode, hidden).width), first.dtype, first.device)


def _scan_eager(xp, *arrays, mode: str, reverse: bool):
    a = dict(zip(_INPUTS[mode], arrays, strict=True))
    args = (a["gx"], a["bias"], a["h0"], a.get("c0"), a["w_hh"], a.get("b_hn"))
    if xp is np:
        return fast.scan(*args, mode=mode, reverse=reverse)
    if a["gx"].shape[0] == 0:
        return xp.zeros((0, a["gx"].shape[1], ScanLayout(mode, a["w_hh"].shape[1]).width), dtype=a["gx"].dtype)
    return steps.scan(steps.xp_ops(xp), *args, mode=mode, reverse=reverse)


def _scan_into(xp, *arrays, mode: str, reverse: bool, out):
    """``_scan_eager`` into ``out``: a compiled program's arena, which its calls reuse (a fresh 3 MiB
    output per call cost an LSTM LM step its page faults)."""
    if xp is np:
        a = dict(zip(_INPUTS[mode], arrays, strict=True))
        fast.scan(a["gx"], a["bias"], a["h0"], a.get("c0"), a["w_hh"], a.get("b_hn"), mode=mode, reverse=reverse,
                  out=out)  # fmt: skip
    else:
        xp.copyto(out, _scan_eager(xp, *arrays, mode=mode, reverse=reverse))
    return out


def _scan_vjp(ops, c, g):
    mode, reverse = c.attrs["mode"], c.attrs["reverse"]
    w_hh, packed = c.inputs[_INPUTS[mode].index("w_hh")], c.output
    if ops.is_grad_enabled():  # create_graph: a backward that autograd can differentiate again
        back = steps.scan_backward(steps.kiln_ops(ops), packed, w_hh, g, mode=mode, reverse=reverse)
    else:
        parts = _cotangent_parts(ops, g, ScanLayout(mode, w_hh.shape[1]))
        back = ops.apply(P_SCAN_BACKWARD, packed, w_hh, *parts, mode=mode, reverse=reverse)
    return scan_gradients(ops, mode, packed, w_hh, back, c.needs_input_grad)


def scan_gradients(ops, mode: str, packed, w_hh, back, needs: tuple) -> tuple:
    """The gradients of ``rnn_scan``'s inputs (``_INPUTS[mode]``'s order; None where ``needs`` says
    none is needed) from its output ``packed`` and ``back``, ``rnn_scan_backward``'s output."""
    layout = ScanLayout(mode, w_hh.shape[1])
    # views: the products of the frontend's projection (dx, dW_ih) and dW_hh's read dz's rows where they lie
    dz = ops.narrow(back, -1, *layout.dz)
    dz_hh = ops.narrow(back, -1, *layout.dz_hh) if mode == "GRU" else dz
    grads = {"gx": dz, "bias": ops.sum(dz, (0, 1)) if needs[1] else None}
    for s, name in enumerate(("h0", "c0")[: layout.states]):
        grads[name] = ops.sum(ops.narrow(back, -1, *layout.initial(s)), 0)
    # dW_hh = sum over steps and batch of dz_hh^T h_prev: one product with both folded into its rows
    rows = packed.shape[0] * packed.shape[1]
    h_prev = ops.reshape(ops.narrow(packed, -1, *layout.prev(0)), (rows, layout.hidden))
    grads["w_hh"] = ops.matmul(ops.transpose(ops.reshape(dz_hh, (rows, layout.gates * layout.hidden)), 0, 1), h_prev)
    if mode == "GRU":
        grads["b_hn"] = ops.sum(ops.narrow(dz_hh, -1, 2 * layout.hidden, layout.hidden), (0, 1))
    return tuple(grads[name] if need else None for name, need in zip(_INPUTS[mode], needs, strict=True))


def _cotangent_parts(ops, g, layout: ScanLayout) -> tuple:
    """``g`` a part of a row at a time (``ScanLayout.parts``). Traced, the cotangent of a packed output
    read by views is a zero pad of the parts read: ``simplify`` turns each slice of it into that part
    itself or a broadcast zero, which the kernel skips. (The layers read theirs through
    ``nn/_rnn_scan.py``, whose backward gives the parts themselves, with no pad at all.)"""
    return tuple(ops.narrow(g, -1, start, size) for start, size in layout.parts)


def _scan_reference(torch, *tensors, mode: str, reverse: bool):
    a = dict(zip(_INPUTS[mode], tensors, strict=True))
    args = (a["gx"], a["bias"], a["h0"], a.get("c0"), a["w_hh"], a.get("b_hn"))
    return steps.scan(steps.torch_ops(torch), *args, mode=mode, reverse=reverse)


def _scan_args(rng, mode: str, steps_: int, batch: int, hidden: int) -> tuple:
    """Arguments of ``rnn_scan`` in ``_INPUTS[mode]``'s order, small enough that no gate saturates."""
    gates = GATES[mode] * hidden
    shapes = {"gx": (steps_, batch, gates), "bias": (gates,), "h0": (batch, hidden), "c0": (batch, hidden),
              "w_hh": (gates, hidden), "b_hn": (hidden,)}  # fmt: skip
    return tuple(rng.normal(size=shapes[name]) * 0.6 for name in _INPUTS[mode])


def _scan_samples(rng):
    samples = [Sample(_scan_args(rng, mode, 3, 2, 2), {"mode": mode, "reverse": reverse})
               for mode in MODES for reverse in (False, True)]  # fmt: skip
    samples.append(Sample(_scan_args(rng, "LSTM", 1, 3, 3), {"mode": "LSTM", "reverse": False}))
    return samples


P_SCAN = register(Primitive(
    "rnn_scan", Kind.RECURRENCE, _scan_infer, _scan_eager, _scan_vjp, save_inputs=True, save_output=True,
    reference=_scan_reference, samples=_scan_samples, eager_into=_scan_into,
    doc="one direction of an RNN layer over the steps of its input projection, packed (recurrence_layout.py)",
))  # fmt: skip


# ----------------------------------------------------------------------------- rnn_scan_backward
def _backward_infer(packed: TensorType, w_hh: TensorType, *g: TensorType, mode: str, reverse: bool) -> TensorType:
    _check_mode("rnn_scan_backward", mode)
    first = _same_kind("rnn_scan_backward", {"packed": packed, "w_hh": w_hh, **{f"g{k}": t for k, t in enumerate(g)}})
    if w_hh.ndim != 2 or not isinstance(w_hh.shape[1], int) or w_hh.shape[0] != GATES[mode] * w_hh.shape[1]:
        raise RuntimeError(f"rnn_scan_backward[mode={mode}]: expected w_hh of shape [{GATES[mode]} * hidden, "
                           f"hidden], got {list(w_hh.shape)}")  # fmt: skip
    layout = ScanLayout(mode, w_hh.shape[1])
    if packed.ndim != 3:
        raise RuntimeError(f"rnn_scan_backward: expected the packed states of shape [steps, batch, {layout.width}], "
                           f"got {list(packed.shape)}")  # fmt: skip
    _expect("rnn_scan_backward", "packed", packed, (packed.shape[0], packed.shape[1], layout.width))
    if len(g) == 1:
        _expect("rnn_scan_backward", "g", g[0], packed.shape)
    elif len(g) == len(layout.parts):
        for k, (_, size) in enumerate(layout.parts):
            _expect("rnn_scan_backward", f"g's part {k}", g[k], (packed.shape[0], packed.shape[1], size))
    else:
        raise TypeError(f"rnn_scan_backward[mode={mode}]: expected the cotangent whole or in {len(layout.parts)} "
                        f"parts, got {len(g)} arrays")  # fmt: skip
    return TensorType((packed.shape[0], packed.shape[1], layout.grad_width), first.dtype, first.device)


def _joined(xp, g: tuple):
    return g[0] if len(g) == 1 else xp.concatenate(g, axis=-1)


def _backward_eager(xp, packed, w_hh, *g, mode: str, reverse: bool):
    if xp is np:
        return fast.scan_backward(packed, w_hh, *g, mode=mode, reverse=reverse)
    if packed.shape[0] == 0:
        return xp.zeros((0, packed.shape[1], ScanLayout(mode, w_hh.shape[1]).grad_width), dtype=packed.dtype)
    return steps.scan_backward(steps.xp_ops(xp), packed, w_hh, _joined(xp, g), mode=mode, reverse=reverse)


def _backward_into(xp, packed, w_hh, *g, mode: str, reverse: bool, out):
    """``_backward_eager`` into ``out`` (a compiled program's arena)."""
    if xp is np:
        fast.scan_backward(packed, w_hh, *g, mode=mode, reverse=reverse, out=out)
    else:
        xp.copyto(out, _backward_eager(xp, packed, w_hh, *g, mode=mode, reverse=reverse))
    return out


def _backward_reference(torch, packed, w_hh, *g, mode: str, reverse: bool):
    joined = g[0] if len(g) == 1 else torch.cat(g, dim=-1)
    return steps.scan_backward(steps.torch_ops(torch), packed, w_hh, joined, mode=mode, reverse=reverse)


def _backward_samples(rng):
    """Packed states from the forward kernel (any other array is no forward's output) and a cotangent
    on every part of them."""
    samples = []
    for mode in MODES:
        for reverse in (False, True):
            args = _scan_args(rng, mode, 3, 2, 2)
            packed = _scan_eager(np, *args, mode=mode, reverse=reverse)
            w_hh = args[_INPUTS[mode].index("w_hh")]
            g = rng.normal(size=packed.shape)
            attrs = {"mode": mode, "reverse": reverse}
            samples.append(Sample((packed, w_hh, g), attrs))
            # a part at a time, one of them a broadcast zero (a compiled program's unread parts)
            parts = [g[..., start : start + size] for start, size in ScanLayout(mode, 2).parts]
            parts[-1] = np.broadcast_to(np.zeros((), g.dtype), parts[-1].shape)
            samples.append(Sample((packed, w_hh, *parts), attrs))
    return samples


P_SCAN_BACKWARD = register(Primitive(
    "rnn_scan_backward", Kind.RECURRENCE, _backward_infer, _backward_eager, NOT_DIFFERENTIABLE,
    reference=_backward_reference, samples=_backward_samples, eager_into=_backward_into,
    doc="rnn_scan's backward through time: the gate pre-activations' and initial states' gradients, packed "
        "(recurrence_layout.py); run with grad mode off only (rnn_scan's VJP differentiates kiln ops otherwise)",
))  # fmt: skip
