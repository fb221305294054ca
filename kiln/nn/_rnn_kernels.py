"""The recurrences of the fused RNN layers (``_rnn.py``) on numpy arrays: one direction, forward and backward.

Each kernel walks time in *kernel order* (the caller hands reversed views for a reverse direction)
and works in place on arrays the caller allocated, so a time step is one ``h @ W_hh^T`` product and a
few in-place ufuncs on (batch, hidden) blocks, with no autograd nodes and no allocation.

Shapes: ``A`` (T, B, G, H) holds the input projection plus biases on entry and the gate activations
on exit; ``hs`` (T + 1, B, H) holds the initial state in ``hs[0]`` and the state after step t in
``hs[t + 1]``; ``w_hh_t`` (H, G H) is the recurrent weight, transposed (for a GRU with the caller's
scaling, below). A backward kernel takes ``dy`` (T, B, H), the gradient of each step's output,
and the gradients of the final states; it fills ``dz`` (T, B, G, H), the gradient of each gate's
pre-activation, and returns the gradients of the initial states.

Sigmoid gates are computed as ``0.5 * tanh(z / 2) + 0.5``, so that one ``tanh`` covers several gates.
An LSTM scales whole rows of its (i, f, g, o) pre-activations before and after the ``tanh`` (1 for g):
numpy passes over whole rows cost several times less than passes over strided gate blocks. A GRU's
caller halves the r and z rows of the weights and biases instead (exact, a power of two).
"""

from __future__ import annotations

import numpy as np


# ----------------------------------------------------------------------------- Elman RNN
def rnn_forward(A, hs, w_hh_t, relu: bool) -> None:
    """``h' = act(A[t] + h W_hh^T)``; ``A`` (T, B, 1, H) ends holding the outputs."""
    step = np.empty_like(hs[0])
    for t in range(A.shape[0]):
        a = A[t, :, 0]
        np.matmul(hs[t], w_hh_t, out=step)
        a += step
        if relu:
            np.maximum(a, 0, out=a)
        else:
            np.tanh(a, out=a)
        hs[t + 1] = a


def rnn_backward(A, w_hh, dy, dh, relu: bool, dz):
    """Backward through time of ``rnn_forward`` (``A`` holding its outputs); returns the gradient of
    the initial state."""
    y = A[:, :, 0]
    slope = (y > 0).astype(y.dtype) if relu else 1 - y * y
    dh = dh + dy[-1]
    for t in range(A.shape[0] - 1, -1, -1):
        np.multiply(dh, slope[t], out=dz[t, :, 0])
        np.matmul(dz[t, :, 0], w_hh, out=dh)
        if t:
            dh += dy[t - 1]
    return dh


# ----------------------------------------------------------------------------- LSTM, gates (i, f, g, o)
def lstm_forward(A, hs, cs, tanh_c, w_hh_t) -> None:
    """``c' = f c + i g``, ``h' = o tanh(c')``; fills ``cs`` (T + 1, B, H, ``cs[0]`` given) and ``tanh_c``."""
    batch, hidden = hs.shape[1], hs.shape[2]
    step = np.empty((batch, 4 * hidden), dtype=A.dtype)
    product = np.empty_like(hs[0])
    scale = np.full((4, hidden), 0.5, dtype=A.dtype)
    scale[2] = 1  # g is a tanh
    scale, shift = scale.reshape(-1), (1 - scale).reshape(-1)
    for t in range(A.shape[0]):
        gates = A[t]
        flat = gates.reshape(batch, 4 * hidden)  # a view: each A[t] is contiguous
        np.matmul(hs[t], w_hh_t, out=step)
        flat += step
        flat *= scale
        np.tanh(flat, out=flat)
        flat *= scale
        flat += shift
        i, f, g, o = gates[:, 0], gates[:, 1], gates[:, 2], gates[:, 3]
        np.multiply(f, cs[t], out=cs[t + 1])
        np.multiply(i, g, out=product)
        cs[t + 1] += product
        np.tanh(cs[t + 1], out=tanh_c[t])
        np.multiply(o, tanh_c[t], out=hs[t + 1])


def lstm_backward(A, cs, tanh_c, w_hh, dy, dh, dc, dz):
    """Backward through time of ``lstm_forward``; returns the gradients of ``hs[0]`` and ``cs[0]``."""
    steps, batch, _, hidden = A.shape
    i, f, g, o = A[:, :, 0], A[:, :, 1], A[:, :, 2], A[:, :, 3]
    # What each step multiplies the incoming gradients by, for all steps at once:
    # dz_o = dh * by_h, dc += dh * to_c, dz_(i, f, g) = dc * by_c.
    slope = A * (1 - A)  # sigmoid' of i, f and o (the g block is unused)
    by_h = tanh_c * slope[:, :, 3]
    to_c = o * (1 - tanh_c * tanh_c)
    by_c = np.empty((steps, batch, 3, hidden), dtype=A.dtype)
    np.multiply(g, slope[:, :, 0], out=by_c[:, :, 0])
    np.multiply(cs[:-1], slope[:, :, 1], out=by_c[:, :, 1])
    np.multiply(i, 1 - g * g, out=by_c[:, :, 2])
    dh = dh + dy[-1]
    dc = dc.copy()
    product = np.empty_like(dc)
    for t in range(steps - 1, -1, -1):
        np.multiply(dh, by_h[t], out=dz[t, :, 3])
        np.multiply(dh, to_c[t], out=product)
        dc += product
        np.multiply(dc[:, None, :], by_c[t], out=dz[t, :, :3])
        dc *= f[t]
        np.matmul(dz[t].reshape(batch, 4 * hidden), w_hh, out=dh)
        if t:
            dh += dy[t - 1]
    return dh, dc


# ----------------------------------------------------------------------------- GRU, gates (r, z, n)
def gru_forward(A, hs, hn, w_hh_t, b_hn) -> None:
    """``n = tanh(A_n + r (h W_hn^T + b_hn))``, ``h' = n + z (h - n)``; fills ``hn`` (T, B, H) with
    ``h W_hn^T + b_hn``. ``A``'s r and z blocks already hold ``b_hr`` and ``b_hz``."""
    batch, hidden = hs.shape[1], hs.shape[2]
    step = np.empty((batch, 3, hidden), dtype=A.dtype)
    scratch = np.empty_like(hs[0])
    for t in range(A.shape[0]):
        gates, h = A[t], hs[t]
        np.matmul(h, w_hh_t, out=step.reshape(batch, 3 * hidden))
        rz = gates[:, :2]
        rz += step[:, :2]
        np.tanh(rz, out=rz)
        rz *= 0.5
        rz += 0.5
        r, z, n = gates[:, 0], gates[:, 1], gates[:, 2]
        if b_hn is None:
            hn[t] = step[:, 2]
        else:
            np.add(step[:, 2], b_hn, out=hn[t])
        np.multiply(r, hn[t], out=scratch)
        n += scratch
        np.tanh(n, out=n)
        np.subtract(h, n, out=scratch)
        scratch *= z
        np.add(n, scratch, out=hs[t + 1])


def gru_backward(A, hs, hn, w_hh, dy, dh, dz, dz_hh):
    """Backward through time of ``gru_forward``: ``dz`` gets the gradient of the input projection's
    pre-activations, ``dz_hh`` that of ``h W_hh^T + b_hh`` (they differ in the n block, which r scales).
    Returns the gradient of ``hs[0]``."""
    steps, batch, _, hidden = A.shape
    r, z, n = A[:, :, 0], A[:, :, 1], A[:, :, 2]
    by_n = (1 - z) * (1 - n * n)  # dz_n = dh * by_n
    by_z = (hs[:-1] - n) * z * (1 - z)  # dz_z = dh * by_z
    by_r = hn * r * (1 - r)  # dz_r = dz_n * by_r
    dz_n = dz[:, :, 2]
    dh = dh + dy[-1]
    recurrent = np.empty_like(dh)
    for t in range(steps - 1, -1, -1):
        np.multiply(dh, by_n[t], out=dz_n[t])
        np.multiply(dh, by_z[t], out=dz_hh[t, :, 1])
        np.multiply(dz_n[t], by_r[t], out=dz_hh[t, :, 0])
        np.multiply(dz_n[t], r[t], out=dz_hh[t, :, 2])
        np.matmul(dz_hh[t].reshape(batch, 3 * hidden), w_hh, out=recurrent)
        dh *= z[t]
        dh += recurrent
        if t:
            dh += dy[t - 1]
    dz[:, :, :2] = dz_hh[:, :, :2]
    return dh
