"""``rnn_scan`` and ``rnn_scan_backward`` on numpy arrays, in place: the fast kernels.

Each recurrence walks time in *kernel order* (reversed views for a reverse direction) and writes
into the arrays it is given -- views of the packed output (``recurrence_layout.py``) here, its own
contiguous arrays in ``kiln/nn/_rnn.py``'s eager layer -- so a time step is one ``h @ W_hh^T``
product and a few in-place ufuncs on (batch, hidden) blocks, with no allocation.

Shapes, in kernel order: ``A`` (T, B, G, H) holds the input projection on entry and the gate
activations on exit; ``hs`` (T, B, H) the state after each step (the one before step 0 is ``h0``);
``w_hh_t`` (H, G H) is the recurrent weight, transposed. A backward kernel takes ``dH`` (T, B, H),
the gradient of each step's state h from everything but the recurrence (an LSTM's ``dC`` likewise),
and ``eA`` (T, B, G, H) or None: what the gate activations' own cotangent adds to each gate's
pre-activation gradient. It fills ``dz`` (T, B, G, H) and returns the gradients of the initial states.

Sigmoid gates are computed as ``0.5 * tanh(z / 2) + 0.5``, so that one ``tanh`` covers several gates:
an LSTM scales whole rows of its (i, f, g, o) pre-activations before and after the ``tanh`` (1 for g),
as numpy passes over whole rows cost several times less than passes over strided gate blocks; a GRU
halves its r and z blocks and the matching columns of ``w_hh_t`` instead (exact, a power of two).

The LSTM and GRU kernels first ask ``recurrence_native`` for native kernels of their dtype and hidden
size (the code generator's, which the frontend compiles): where those take the arrays, the whole
recurrence is one native call and the numpy loop does not run. Callers run the kernels inside
``recurrence_native.small_products``, which keeps each step's small product on one BLAS thread.

Temporaries that do not outlive a call come from ``scratch``: one array per name and thread, kept
between calls. Fresh arrays of this size (an LSTM LM's backward: several of 1 MiB) were fresh pages
on every training step, whose faults cost more than the arithmetic on them.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from .linalg import lies_padded
from .recurrence_layout import ScanLayout
from .recurrence_native import native, small_products, step_macs


def _part(a, span):
    return a[..., span[0] : span[0] + span[1]]


def _kernel_order(a, reverse: bool):
    return a[::-1] if reverse else a


def _blocks(a, layout: ScanLayout):
    """``a`` (..., G H) as a view (..., G, H)."""
    return a.reshape(*a.shape[:-1], layout.gates, layout.hidden, copy=False)


_scratch = threading.local()
# Larger temporaries are fresh arrays, not kept: a layer run once on a long sequence must not hold
# gigabytes of scratch for the rest of the process (its page faults cost little beside its arithmetic).
SCRATCH_KEEP_BYTES = 16 << 20


def scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array of ``shape`` and ``dtype`` for a temporary that does not outlive its
    caller's call: the same memory as the last ``name`` of this thread when that one fits (and
    up to ``SCRATCH_KEEP_BYTES``). Each thread has its own, so that the kernels may run on several
    at once; a caller must not hand it out, nor use one ``name`` for two arrays alive at once."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)  # np.prod costs microseconds: a cell's step calls this a dozen times
    if size * dtype.itemsize > SCRATCH_KEEP_BYTES:
        return np.empty(shape, dtype=dtype)
    arrays = _scratch.__dict__.setdefault("arrays", {})
    found = arrays.get(name)
    if found is None or found.dtype != dtype or found.size < size:
        found = arrays[name] = np.empty(size, dtype=dtype)
    return found[:size].reshape(shape)


# ----------------------------------------------------------------------------- the forward
def scan(gx, bias, h0, c0, w_hh, b_hn, *, mode: str, reverse: bool, out=None):
    """The packed output of ``rnn_scan`` (``c0`` for an LSTM, ``b_hn`` for a GRU, else None), written
    into ``out`` when given (every element of it)."""
    steps, batch, _ = gx.shape
    if steps == 1 and mode == "LSTM":  # a cell's step, one per trip of a compiled loop: the lean path
        return _lstm_scan_step(gx, bias, h0, c0, w_hh, out)
    layout = ScanLayout(mode, w_hh.shape[1])
    if out is None:
        out = np.empty((steps, batch, layout.width), dtype=gx.dtype)
    if steps == 0:
        return out
    k = lambda a: _kernel_order(a, reverse)  # noqa: E731
    gates = _blocks(_part(out, layout.gate_span), layout)
    if mode.startswith("RNN"):  # (an LSTM's and a GRU's kernels add the bias as they read gx)
        np.add(gx.reshape(gates.shape), bias.reshape(gates.shape[2:]), out=gates)
    hs = _part(out, layout.out(0))
    with small_products(step_macs(batch, w_hh)):
        packed = tuple(k(_part(out, span)) for span in (*map(layout.prev, range(layout.states)),
                                                         *map(layout.final, range(layout.states))))  # fmt: skip
        if mode == "LSTM":  # (its kernel writes the prev and final rows as it goes)
            cs = k(_part(out, layout.out(1)))
            lstm_forward(k(gates), h0, c0, k(hs), cs, k(_part(out, layout.extra)), w_hh.T, k(gx), bias, packed)
            return out
        if mode == "GRU":
            gru_forward(k(gates), h0, k(hs), k(_part(out, layout.extra)), w_hh.T, b_hn, k(gx), bias)
        else:
            rnn_forward(k(gates), h0, k(hs), w_hh.T, mode == "RNN_RELU")
    packed_rows(packed, (h0,), (k(hs),))
    return out


def rnn_forward(A, h0, hs, w_hh_t, relu: bool) -> None:
    """``h' = act(A[t] + h W_hh^T)``; ``A`` (T, B, 1, H) ends holding the outputs."""
    step = np.empty(h0.shape, dtype=A.dtype)
    for t in range(A.shape[0]):  # on ``step``, contiguous, as ``lstm_forward``
        np.matmul(h0 if t == 0 else hs[t - 1], w_hh_t, out=step)
        step += A[t, :, 0]
        if relu:
            np.maximum(step, 0, out=step)
        else:
            np.tanh(step, out=step)
        A[t, :, 0] = hs[t] = step


@functools.lru_cache(maxsize=16)
def _lstm_scale_shift(hidden: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """An LSTM row's (i, f, g, o) scale before and after its one ``tanh``, and the shift after it (read-only,
    shared: a cell's step would spend a fifth of ``lstm_forward`` building them)."""
    scale = np.full((4, hidden), 0.5, dtype=dtype)
    scale[2] = 1  # g is a tanh
    scale, shift = scale.reshape(-1), (1 - scale).reshape(-1)
    scale.flags.writeable = shift.flags.writeable = False
    return scale, shift


#: A native recurrence reads its product's B as ``linalg.padded_rows`` lays it out: a copy of the
#: recurrent weight (or its transpose) unless it lies so already. Over fewer steps than this, a weight
#: of ``COPIED_FROM`` elements or more stays on numpy, whose product reads the weight as it lies: a
#: language model sampling one word per call (hidden 1024, one step a call) spent 80% of each call
#: copying W_hh^T, the kernel 8%.
COPY_PAYS_STEPS = 4
COPIED_FROM = 1 << 17


def _native(mode: str, dtype, hidden: int, steps: int, b: np.ndarray):
    """``native``'s kernels for a recurrence whose product's B is ``b``, or None where copying ``b``
    into the kernels' layout would cost more than they gain."""
    if steps < COPY_PAYS_STEPS and b.size >= COPIED_FROM and not lies_padded(b):
        return None
    return native(mode, dtype, hidden, steps)


def lstm_forward(A, h0, c0, hs, cs, tanh_c, w_hh_t, gx=None, bias=None, packed=None) -> None:
    """``c' = f c + i g``, ``h' = o tanh(c')``, gates (i, f, g, o); fills ``hs``, ``cs`` and ``tanh_c``
    (in one native call where ``recurrence_native`` has the kernels). ``A`` holds the pre-activations on
    entry, or ``gx + bias`` are them (``gx`` (T, B, 4H) and ``bias`` (4H), the native kernel reading
    ``gx`` where it lies); ``A`` holds the gate activations on exit. ``packed``: rnn_scan's (prev h,
    prev c, final h, final c) views, filled too (``packed_rows``)."""
    batch, hidden = h0.shape
    kernels = _native("LSTM", A.dtype, hidden, A.shape[0], w_hh_t)
    if kernels is not None and kernels.forward(A, h0, c0, hs, cs, tanh_c, w_hh_t, gx, bias, packed):
        return
    if gx is not None:
        np.add(gx.reshape(A.shape), bias.reshape(4, hidden), out=A)
    _lstm_steps(A, h0, c0, hs, cs, tanh_c, w_hh_t)
    if packed is not None:
        packed_rows(packed, (h0, c0), (hs, cs))


def packed_rows(packed: tuple, first: tuple, after: tuple) -> None:
    """Fill rnn_scan's ``packed`` views (kernel order), the states before each step (prev, for each
    state) and the final states (in the last step's row, zeros before it), from the ``first`` states
    and those ``after`` each step."""
    count = len(first)
    for before, final, initial, states in zip(packed[:count], packed[count:], first, after, strict=True):
        before[0], before[1:] = initial, states[:-1]
        final[:-1], final[-1] = 0, states[-1]


def _lstm_steps(A, h0, c0, hs, cs, tanh_c, w_hh_t) -> None:
    """``lstm_forward``'s numpy loop over the steps."""
    batch, hidden = h0.shape
    step = np.empty((batch, 4 * hidden), dtype=A.dtype)
    product = np.empty((batch, hidden), dtype=A.dtype)
    scale, shift = _lstm_scale_shift(hidden, A.dtype)
    # The gate math runs on ``step``, contiguous, and is copied into A[t] once: A's rows are strided in
    # rnn_scan's packed output, where each whole-row pass costs about twice as much.
    i, f, g, o = (step.reshape(batch, 4, hidden)[:, k] for k in range(4))
    for t in range(A.shape[0]):
        flat = A[t].reshape(batch, 4 * hidden, copy=False)
        h, c = (h0, c0) if t == 0 else (hs[t - 1], cs[t - 1])
        np.matmul(h, w_hh_t, out=step)
        step += flat
        step *= scale
        np.tanh(step, out=step)
        step *= scale
        step += shift
        flat[...] = step
        np.multiply(f, c, out=cs[t])
        np.multiply(i, g, out=product)
        cs[t] += product
        np.tanh(cs[t], out=tanh_c[t])
        np.multiply(o, tanh_c[t], out=hs[t])


def gru_forward(A, h0, hs, hn, w_hh_t, b_hn, gx=None, bias=None) -> None:
    """``n = tanh(A_n + r (h W_hn^T + b_hn))``, ``h' = n + z (h - n)``, gates (r, z, n); fills ``hs``
    and ``hn`` with ``h W_hn^T + b_hn`` (in one native call where ``recurrence_native`` has the kernels).
    ``gx`` and ``bias`` as ``lstm_forward``'s."""
    batch, hidden = h0.shape
    kernels = _native("GRU", A.dtype, hidden, A.shape[0], w_hh_t)
    if kernels is not None and kernels.forward(A, h0, hs, hn, w_hh_t, b_hn, gx, bias):
        return
    if gx is not None:
        np.add(gx.reshape(A.shape), bias.reshape(3, hidden), out=A)
    halves = np.ones(3 * hidden, dtype=A.dtype)
    halves[: 2 * hidden] = 0.5
    w_hh_t = w_hh_t * halves
    A[:, :, :2] *= 0.5
    step = np.empty((batch, 3, hidden), dtype=A.dtype)
    scratch = np.empty((batch, hidden), dtype=A.dtype)
    for t in range(A.shape[0]):
        gates, h = A[t], (h0 if t == 0 else hs[t - 1])
        np.matmul(h, w_hh_t, out=step.reshape(batch, 3 * hidden))
        rz = gates[:, :2]
        rz += step[:, :2]
        np.tanh(rz, out=rz)
        rz *= 0.5
        rz += 0.5
        r, z, n = gates[:, 0], gates[:, 1], gates[:, 2]
        np.add(step[:, 2], b_hn, out=hn[t])
        np.multiply(r, hn[t], out=scratch)
        n += scratch
        np.tanh(n, out=n)
        np.subtract(h, n, out=scratch)
        scratch *= z
        np.add(n, scratch, out=hs[t])


# ----------------------------------------------------------------------------- the backward
class _Cotangent:
    """The cotangent of ``rnn_scan``'s packed output -- one array (T, B, width), or one per part of a
    row (``ScanLayout.parts``) -- read a part at a time in kernel order. A part given as a broadcast
    zero (what a layer's backward, ``nn/_rnn_scan.py``, and a compiled program pass for the parts no
    one reads) is known to be zero without reading it."""

    def __init__(self, layout: ScanLayout, arrays: tuple, reverse: bool) -> None:
        if len(arrays) == 1:
            self._parts = {span: _part(arrays[0], span) for span in layout.parts}
        else:
            self._parts = dict(zip(layout.parts, arrays, strict=True))
        self.reverse = reverse

    def __call__(self, span):
        return _kernel_order(self._parts[span], self.reverse)

    def zero(self, span) -> bool:
        """Whether the part is a broadcast zero (a part that merely holds zeros answers False)."""
        a = self._parts[span]
        return a.size == 0 or (not any(a.strides) and not a.flat[0])


def _packed_cotangent(arrays: tuple):
    """``rnn_scan_backward``'s cotangent as one packed array (its parts joined along the last axis)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=-1)


def scan_backward(packed, w_hh, *g, mode: str, reverse: bool, out=None):
    """The packed output of ``rnn_scan_backward``: ``g`` is the cotangent of ``packed``, every part of it
    (packed, or a part at a time: ``_Cotangent``); written into ``out`` when given (every element of it)."""
    steps, batch, _ = packed.shape
    layout = ScanLayout(mode, w_hh.shape[1])
    if steps == 1 and mode == "LSTM":  # a cell's step's backward: the lean path
        return _lstm_backward_step(packed, w_hh, _packed_cotangent(g), out)
    if out is None:
        out = np.empty((steps, batch, layout.grad_width), dtype=packed.dtype)
    if steps == 0:
        return out
    k = lambda a: _kernel_order(a, reverse)  # noqa: E731
    saved = lambda span: k(_part(packed, span))  # noqa: E731
    cot = _Cotangent(layout, g, reverse)
    A = _blocks(saved(layout.gate_span), layout)
    eA = None
    if not cot.zero(layout.gate_span):
        tangents = _blocks(cot(layout.gate_span), layout)
        eA = _through_activations(mode, A, tangents) if tangents.any() else None
    dH = _state_cotangent(layout, cot, 0)
    dC = _state_cotangent(layout, cot, 1) if mode == "LSTM" else None
    dz = _blocks(k(_part(out, layout.dz)), layout)
    extra = None if layout.extra is None or cot.zero(layout.extra) else cot(layout.extra)
    with small_products(step_macs(batch, w_hh)):
        if mode == "LSTM":
            tanh_c = saved(layout.extra)
            if extra is not None and extra.any():  # (not in place: dC may be the caller's cotangent)
                dC = dC + extra * (1 - tanh_c * tanh_c)
            initial = lstm_backward(A, saved(layout.prev(1)), tanh_c, w_hh, dH, dC, eA, dz)
        elif mode == "GRU":
            dz_hh = _blocks(k(_part(out, layout.dz_hh)), layout)
            hn = saved(layout.extra)
            g_hn = extra if extra is not None and extra.any() else None
            initial = (gru_backward(A, saved(layout.prev(0)), hn, w_hh, dH, eA, g_hn, dz, dz_hh),)
        else:
            initial = (rnn_backward(A, w_hh, dH, eA, mode == "RNN_RELU", dz),)
    for s, grad in enumerate(initial):
        row = k(_part(out, layout.initial(s)))
        prev = layout.prev(s)
        row[0], row[1:] = (grad if cot.zero(prev) else grad + cot(prev)[0]), 0
    return out


@functools.lru_cache(maxsize=32)
def _lstm_slices(hidden: int) -> tuple[slice, ...]:
    """The packed LSTM layout's parts as slices of the last axis: the forward's h, final h, final c, c,
    prev h, prev c, gates and tanh(c), then the backward's dz and initial h and c."""
    layout = ScanLayout("LSTM", hidden)
    spans = (layout.out(0), layout.final(0), layout.final(1), layout.out(1), layout.prev(0), layout.prev(1),
             layout.gate_span, layout.extra, layout.dz, layout.initial(0), layout.initial(1))  # fmt: skip
    return tuple(slice(start, start + size) for start, size in spans)  # type: ignore[misc]  # an LSTM has extra


# A compiled loop over an ``nn.LSTMCell`` runs ``rnn_scan`` and ``rnn_scan_backward`` over one step per trip.
# ``scan``/``scan_backward``'s general path (direction views, spans, state cotangents summed over time) cost
# as much again as the step's arithmetic there; for one step, where direction and time shifts vanish, these
# compute the same values with the same operations (so the same rounding) as the general path.
# Where ``recurrence_native`` has them ("LSTM_STEP"), one native function does either step's whole work.
def _lstm_scan_step(gx, bias, h0, c0, w_hh, out):
    """``scan`` of one LSTM step, into ``out`` (1, B, width) when given."""
    batch, hidden = h0.shape
    h, final_h, final_c, c, prev_h, prev_c, gate_span, tanh_c = _lstm_slices(hidden)[:8]
    if out is None:
        out = np.empty((1, batch, tanh_c.stop), dtype=gx.dtype)
    kernels = native("LSTM_STEP", gx.dtype, hidden, 1)
    if kernels is not None and kernels.forward(gx, bias, h0, c0, w_hh, out):
        return out
    row = out[0]
    gates = row[:, gate_span]
    np.add(gx[0], bias, out=gates)
    with small_products(step_macs(batch, w_hh)):
        lstm_forward(gates.reshape(1, batch, 4, hidden, copy=False), h0, c0, row[None, :, h], row[None, :, c],
                     row[None, :, tanh_c], w_hh.T)  # fmt: skip
    row[:, prev_h], row[:, prev_c] = h0, c0
    row[:, final_h], row[:, final_c] = row[:, h], row[:, c]
    return out


def _lstm_backward_step(packed, w_hh, g, out):
    """``scan_backward`` of one LSTM step, into ``out`` (1, B, grad_width) when given."""
    _, batch, _ = packed.shape
    hidden = w_hh.shape[1]
    h, final_h, final_c, c, prev_h, prev_c, gate_span, tanh_span, dz_span, initial_h, initial_c = _lstm_slices(hidden)
    if out is None:
        out = np.empty((1, batch, initial_c.stop), dtype=packed.dtype)
    kernels = native("LSTM_STEP", packed.dtype, hidden, 1)
    if kernels is not None and kernels.backward(packed, w_hh, g, out) is not None:
        return out
    saved, cot, row = packed[0], g[0], out[0]
    A = saved[:, gate_span].reshape(1, batch, 4, hidden, copy=False)
    tangents = cot[:, gate_span]
    eA = _through_activations("LSTM", A, tangents.reshape(A.shape, copy=False)) if tangents.any() else None
    dH = np.add(cot[:, h], cot[:, final_h])[None]
    dC = np.add(cot[:, c], cot[:, final_c])[None]
    tanh_c, g_tanh_c = saved[None, :, tanh_span], cot[None, :, tanh_span]
    if g_tanh_c.any():
        dC += g_tanh_c * (1 - tanh_c * tanh_c)
    dz = row[:, dz_span].reshape(A.shape, copy=False)
    with small_products(step_macs(batch, w_hh)):
        dh, dc = lstm_backward(A, saved[None, :, prev_c], tanh_c, w_hh, dH, dC, eA, dz)
    np.add(dh, cot[:, prev_h], out=row[:, initial_h])
    np.add(dc, cot[:, prev_c], out=row[:, initial_c])
    return out


def _state_cotangent(layout: ScanLayout, cot: _Cotangent, s: int):
    """The gradient of state ``s`` after each step (kernel order) from the output's cotangent alone:
    its ``out`` part, the next step's ``prev`` part and, after the last step, its ``final`` part.
    Read only by the kernels: where ``out`` is the only part given, ``out`` itself when its rows lie
    plainly (a compiled LSTM LM's h gradient: no copy), zeros when no part is."""
    out, prev, final = layout.out(s), layout.prev(s), layout.final(s)
    if cot.zero(prev) and cot.zero(final):
        if cot.zero(out):
            zeros = scratch(f"rnn_scan.zero_state{s}", cot(out).shape, cot(out).dtype)
            zeros.fill(0)
            return zeros
        d = cot(out)
        item = d.itemsize
        if d.strides[-1] == item and d.strides[1] >= d.shape[-1] * item and d.strides[0] % item == 0:
            return d
    d = cot(out).copy()
    if not cot.zero(prev):
        d[:-1] += cot(prev)[1:]
    if not cot.zero(final):
        d[-1] += cot(final)[-1]
    return d


def _through_activations(mode: str, A, tangents):
    """The gate activations' cotangent times each activation's derivative (tanh for an LSTM's g, a
    GRU's n and an Elman RNN, relu for RNN_RELU, else sigmoid)."""
    slope = A * (1 - A)
    tanh_block = {"LSTM": 2, "GRU": 2}.get(mode, 0)
    a = A[:, :, tanh_block]
    slope[:, :, tanh_block] = (a > 0) if mode == "RNN_RELU" else 1 - a * a
    return tangents * slope


def rnn_backward(A, w_hh, dH, eA, relu: bool, dz):
    """Backward through time of ``rnn_forward`` (``A`` holding its outputs); returns dh0."""
    y = A[:, :, 0]
    slope = (y > 0).astype(y.dtype) if relu else 1 - y * y
    dh = dH[-1].copy()
    for t in range(A.shape[0] - 1, -1, -1):
        np.multiply(dh, slope[t], out=dz[t, :, 0])
        if eA is not None:
            dz[t] += eA[t]
        np.matmul(dz[t, :, 0], w_hh, out=dh)
        if t:
            dh += dH[t - 1]
    return dh


def lstm_backward(A, c_prev, tanh_c, w_hh, dH, dC, eA, dz):
    """Backward through time of ``lstm_forward``; returns (dh0, dc0) (in one native call where
    ``recurrence_native`` has the kernels)."""
    steps, batch, _, hidden = A.shape
    kernels = _native("LSTM", A.dtype, hidden, A.shape[0], w_hh)
    initial = None if kernels is None else kernels.backward(A, c_prev, tanh_c, w_hh, dH, dC, eA, dz)
    if initial is not None:
        return initial
    i, f, g, o = A[:, :, 0], A[:, :, 1], A[:, :, 2], A[:, :, 3]
    # What each step multiplies the incoming gradients by, for all steps at once:
    # dz_o = dh * by_h, dc += dh * to_c, dz_(i, f, g) = dc * by_c.
    # (Each product is written as ``a * b`` was, operands swapped at most: the same rounding.)
    slope = scratch("lstm.slope", A.shape, A.dtype)  # sigmoid' of i, f and o (the g block is unused)
    np.subtract(1, A, out=slope)
    slope *= A
    by_h = scratch("lstm.by_h", tanh_c.shape, A.dtype)
    np.multiply(tanh_c, slope[:, :, 3], out=by_h)
    to_c = scratch("lstm.to_c", tanh_c.shape, A.dtype)
    np.multiply(tanh_c, tanh_c, out=to_c)
    np.subtract(1, to_c, out=to_c)
    to_c *= o
    by_c = scratch("lstm.by_c", (steps, batch, 3, hidden), A.dtype)
    np.multiply(g, slope[:, :, 0], out=by_c[:, :, 0])
    np.multiply(c_prev, slope[:, :, 1], out=by_c[:, :, 1])
    by_g = by_c[:, :, 2]
    np.multiply(g, g, out=by_g)
    np.subtract(1, by_g, out=by_g)
    by_g *= i
    dh, dc = dH[-1].copy(), dC[-1].copy()
    product = np.empty_like(dc)
    for t in range(steps - 1, -1, -1):
        np.multiply(dh, by_h[t], out=dz[t, :, 3])
        np.multiply(dh, to_c[t], out=product)
        dc += product
        np.multiply(dc[:, None, :], by_c[t], out=dz[t, :, :3])
        if eA is not None:
            dz[t] += eA[t]
        dc *= f[t]
        np.matmul(dz[t].reshape(batch, 4 * hidden, copy=False), w_hh, out=dh)
        if t:
            dh += dH[t - 1]
            dc += dC[t - 1]
    return dh, dc


def gru_backward(A, h_prev, hn, w_hh, dH, eA, g_hn, dz, dz_hh):
    """Backward through time of ``gru_forward``: fills ``dz`` and ``dz_hh`` (they differ in the n
    block, which r scales); ``g_hn``: the cotangent of ``hn`` or None. Returns dh0 (in one native call
    where ``recurrence_native`` has the kernels)."""
    steps, batch, _, hidden = A.shape
    kernels = _native("GRU", A.dtype, hidden, A.shape[0], w_hh)
    dh = None if kernels is None else kernels.backward(A, h_prev, hn, w_hh, dH, eA, g_hn, dz, dz_hh)
    if dh is not None:
        return dh
    r, z, n = A[:, :, 0], A[:, :, 1], A[:, :, 2]
    by_n = (1 - z) * (1 - n * n)  # dz_n = dh * by_n
    by_z = (h_prev - n) * z * (1 - z)  # dz_z = dh * by_z
    by_r = hn * r * (1 - r)  # dz_r = dz_n * by_r
    dz_n = dz[:, :, 2]
    dh = dH[-1].copy()
    recurrent = np.empty_like(dh)
    for t in range(steps - 1, -1, -1):
        np.multiply(dh, by_n[t], out=dz_n[t])
        np.multiply(dh, by_z[t], out=dz_hh[t, :, 1])
        if eA is not None:
            dz_n[t] += eA[t, :, 2]
            dz_hh[t, :, 1] += eA[t, :, 1]
        np.multiply(dz_n[t], by_r[t], out=dz_hh[t, :, 0])
        if eA is not None:
            dz_hh[t, :, 0] += eA[t, :, 0]
        np.multiply(dz_n[t], r[t], out=dz_hh[t, :, 2])
        if g_hn is not None:
            dz_hh[t, :, 2] += g_hn[t]
        np.matmul(dz_hh[t].reshape(batch, 3 * hidden, copy=False), w_hh, out=recurrent)
        dh *= z[t]
        dh += recurrent
        if t:
            dh += dH[t - 1]
    dz[:, :, :2] = dz_hh[:, :, :2]
    return dh
