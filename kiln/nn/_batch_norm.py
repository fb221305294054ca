"""Batch normalization in training, with its gradient in closed form (``training_batch_norm``).

Autograd through the composite's formula (a mean, the deviations' drift, the variance, rsqrt,
the affine map) made a backward of about ten passes over the input: each mean's gradient is a
reduction of its own and a broadcast back, and the drift's correction doubles that chain. The
gradient of ``y = xhat * w + b``, ``xhat = (x - mean) * r``, ``r = 1 / sqrt(var + eps)``, over the
``M`` values of a channel, is

    dx = w r (g - sum(g) / M - xhat * sum(g xhat) / M),   dw = sum(g xhat),   db = sum(g):

two sums over ``g`` and one elementwise pass (PyTorch's ``native_batch_norm_backward`` is the same
formula). For a (32, 8, 28, 28) input the eager step, forward and backward, took 863 us against
PyTorch's 310 us. The drift's correction changes the value computed, not the function, so the
formula holds for it.

A backward that is itself differentiated (``create_graph=True``) recomputes the composite's formula
with autograd and differentiates that instead: its gradient is then differentiable again.

Below ``ARRAYS_BELOW`` bytes of input, on plain float32/64 CPU tensors outside traces and profiles,
the Function runs the same formulas on the arrays (``_forward_arrays``, ``_backward_arrays``): each
op's dispatch cost more than its pass over a few thousand values. Per-channel sums are ``einsum``
over an (N, C, S) view, a third of the cost of numpy's multi-axis ``sum`` there. fwd+bwd of a
(16, 32, 4, 4) BatchNorm2d took 230 us through the ops and 164 us through the compiled composite
(PyTorch: 42 us); the composite stays compiled above the same size (``nn._norm.batch_norm``), where
it measured faster (155 vs 178 us at (16, 32, 8, 8)).
"""

from __future__ import annotations

import numpy as np

import kiln
from kiln.frontend import dispatch
from kiln.frontend.jit import state as _jit

#: Inputs of fewer bytes than this run on the arrays; above it, as ops (or the compiled composite).
ARRAYS_BELOW = 1 << 16
_FLOATS = (kiln.float32, kiln.float64)


def moments(x: kiln.Tensor, dims: tuple[int, ...], eps: float):
    """(centered, r, mean, var): the deviations from the mean over ``dims``, ``1 / sqrt(var + eps)``,
    the mean and the biased variance (the three last keepdim)."""
    mean, drift, centered, var = _statistics(x, dims)
    return centered, kiln.rsqrt(var + eps), mean + drift, var


def _statistics(x: kiln.Tensor, dims: tuple[int, ...]):
    """(mean, drift, centered, var) over ``dims``: ``centered`` is ``(x - mean) - drift``.

    The deviations are centered twice (the corrected two-pass algorithm): the mean rounded to the
    dtype leaves deviations that sum to about n * eps * |mean| rather than 0, and the gradient
    scales that sum by 1 / sigma^3, so for a nearly constant row (sigma << |mean|) it was all
    rounding noise. Their own mean, ``drift``, is computed exactly enough (the deviations are
    exact differences there) to take that sum to rounding in the deviations' size, which both
    the value and its gradients then inherit: one more pass over data already in cache."""
    mean = x.mean(dim=dims, keepdim=True)
    deviation = x - mean
    drift = deviation.mean(dim=dims, keepdim=True)
    centered = deviation - drift
    return mean, drift, centered, (centered * centered).mean(dim=dims, keepdim=True)


def _layout(x: kiln.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """The reduced dims of (N, C, *S), the per-channel shape (1, C, 1...) and the values per channel."""
    return (0, *range(2, x.ndim)), (1, x.shape[1]) + (1,) * (x.ndim - 2), x.numel() // x.shape[1]


def _affine(y: kiln.Tensor, weight, bias, shape: tuple[int, ...]) -> kiln.Tensor:
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


class _TrainingBatchNorm(kiln.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps: float):
        ctx.eps = eps
        if _on_arrays(x, weight, bias):
            y, mean, var, ctx.arrays = _forward_arrays(x, weight, bias, eps)
            ctx.save_for_backward(x, weight, bias)  # for the in-place checks and create_graph
            ctx.mark_non_differentiable(mean, var)
            return y, mean, var
        ctx.arrays = None
        dims, shape, _ = _layout(x)
        mean, drift, centered, var = _statistics(x, dims)
        r = kiln.rsqrt(var + eps)
        scale = r if weight is None else r * weight.reshape(shape)
        y = centered * scale
        if bias is not None:
            y = y + bias.reshape(shape)
        # the deviations are computed again from x (bit for bit): a compiled forward then writes
        # one full-size tensor, y, and the backward's kernels read x where they read the deviations
        ctx.save_for_backward(x, weight, bias, mean, drift, r)
        mean = mean + drift
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, g, _mean_grad, _var_grad):
        x, weight, bias, *moments = ctx.saved_tensors
        if kiln.is_grad_enabled():  # create_graph: a gradient autograd can differentiate again
            return (*_differentiable_gradients(ctx.needs_input_grad[:3], x, weight, bias, ctx.eps, g), None)
        if ctx.arrays is not None:
            if not (_jit.tracing or dispatch.profiling_ops) and _plain(g) and g.dtype == x.dtype:
                return (*_backward_arrays(ctx.needs_input_grad[:3], ctx.arrays, weight, bias, g), None)
            moments = _moments_of(x, ctx.arrays)
        mean, drift, r = moments
        dims, shape, count = _layout(x)
        centered = (x - mean) - drift
        g_sum = g.sum(dim=dims, keepdim=True)
        gc_sum = (g * centered).sum(dim=dims, keepdim=True)  # sum(g xhat) / r
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            scale = r if weight is None else r * weight.reshape(shape)
            # w r (g - sum(g)/M - xhat sum(g xhat)/M) as g a - b - centered c, a b c per channel
            gx = g * scale - g_sum * (scale / count) - centered * (scale * r * r * gc_sum / count)
        if weight is not None and ctx.needs_input_grad[1]:
            gw = (gc_sum * r).reshape(weight.shape)
        if bias is not None and ctx.needs_input_grad[2]:
            gb = g_sum.reshape(bias.shape)
        return gx, gw, gb, None


def _differentiable_gradients(needs: tuple[bool, ...], x, weight, bias, eps: float, g) -> list:
    """The gradients of the composite's formula, recomputed with autograd (create_graph)."""
    dims, shape, _ = _layout(x)
    with kiln.enable_grad():
        centered, r, _, _ = moments(x, dims, eps)
        y = _affine(centered * r, weight, bias, shape)
    wrt = [t for t, need in zip((x, weight, bias), needs, strict=True) if need and t is not None]
    found = iter(kiln.autograd.grad([y], wrt, [g], create_graph=True, allow_unused=True))
    return [next(found) if need and t is not None else None for t, need in zip((x, weight, bias), needs, strict=True)]


def training_batch_norm(x: kiln.Tensor, weight, bias, eps: float):
    """(y, mean, var) of batch normalization over the batch statistics of ``x`` (N, C, *S): ``y``
    normalized with the biased variance and mapped by ``weight`` and ``bias`` (each (C,) or None),
    differentiable with the closed-form gradient; ``mean`` and ``var`` (1, C, 1...) are not."""
    return _TrainingBatchNorm.apply(x, weight, bias, eps)


# ----------------------------------------------------------------------------- on the arrays
def _plain(t) -> bool:
    return t is None or (type(t) in (kiln.Tensor, kiln.nn.Parameter) and t.device.type == "cpu" and t.dtype in _FLOATS)


def _on_arrays(x, weight, bias) -> bool:
    """Whether the Function runs on the arrays: small plain tensors of one dtype, no trace or profile."""
    return (
        not (_jit.tracing or dispatch.profiling_ops)
        and x.element_size() * x.numel() < ARRAYS_BELOW
        and all(_plain(t) and (t is None or t.dtype == x.dtype) for t in (x, weight, bias))
    )


def _array(t) -> np.ndarray:
    return t.detach().numpy()


def update_running_statistics(running_mean, running_var, mean, var, momentum, count: int) -> None:
    """``r = (1 - momentum) * r + momentum * stat`` for the mean and the unbiased variance, in place
    without gradient: on the arrays for small plain buffers outside traces and profiles (the same
    products and sums as the ops, about a fifth of their 27 us at C=32), else as ops."""
    c = running_mean.shape[0]
    if not (_on_arrays(mean, running_mean, running_var) and type(momentum) in (float, int) and _writable(running_mean)
            and _writable(running_var) and not (mean.requires_grad or var.requires_grad)):  # fmt: skip
        with kiln.no_grad():
            running_mean.mul_(1 - momentum).add_(mean.reshape(c) * momentum)
            running_var.mul_(1 - momentum).add_(var.reshape(c) * (momentum * count / (count - 1)))
        return
    for t, stat, factor in ((running_mean, mean, momentum), (running_var, var, momentum * count / (count - 1))):
        a = _array(t)
        a *= 1 - momentum
        a += _array(stat).reshape(c) * factor
        t._version[0] += 1  # an in-place change, as mul_ and add_ count it (saved copies then raise)


def _writable(t) -> bool:
    """A buffer numpy may write in place: a plain tensor of its own contiguous memory, no gradient."""
    if t.requires_grad or t._inference or t._base is not None:  # (an inference tensor's in-place error: the ops')
        return False
    flags = _array(t).flags
    return flags.c_contiguous and flags.writeable


def _channel_sums(a: np.ndarray) -> np.ndarray:
    """Per-channel sums of an (N, C, S) array."""
    return np.einsum("ncs->c", a)


def _forward_arrays(x, weight, bias, eps: float):
    """(y, mean, var, arrays) of the forward's formulas on the arrays; ``arrays`` (the deviations,
    (N, C, S), then ``r``, ``drift`` and the first mean, (C,)) are what the backward reads."""
    a = _array(x)
    n, c, count = a.shape[0], a.shape[1], a.size // (a.shape[0] * a.shape[1])
    a = a.reshape(n, c, count)
    mean = _channel_sums(a) / (n * count)
    centered = a - mean[:, None]
    drift = _channel_sums(centered) / (n * count)
    centered -= drift[:, None]
    var = _channel_sums(centered * centered) / (n * count)
    r = 1 / np.sqrt(var + a.dtype.type(eps))
    scale = r if weight is None else r * _array(weight)
    y = centered * scale[:, None]
    if bias is not None:
        y += _array(bias)[:, None]
    shape = (1, c) + (1,) * (x.ndim - 2)
    stats = (kiln.from_numpy((mean + drift).reshape(shape)), kiln.from_numpy(var.reshape(shape)))
    return kiln.from_numpy(y.reshape(x.shape)), *stats, (centered, r, drift, mean)


def _backward_arrays(needs: tuple[bool, ...], arrays: tuple, weight, bias, g) -> list:
    """The closed-form gradients (see the module docstring) on the arrays."""
    centered, r = arrays[:2]
    count = centered.shape[0] * centered.shape[2]
    g3 = _array(g).reshape(centered.shape)
    g_sum = _channel_sums(g3)
    gc_sum = _channel_sums(g3 * centered)  # sum(g xhat) / r
    gx = gw = gb = None
    if needs[0]:
        scale = r if weight is None else r * _array(weight)
        gx = g3 * scale[:, None]
        gx -= (g_sum * (scale / count))[:, None]
        gx -= centered * (scale * r * r * gc_sum / count)[:, None]
        gx = kiln.from_numpy(gx.reshape(g.shape))
    if weight is not None and needs[1]:
        gw = kiln.from_numpy(gc_sum * r)
    if bias is not None and needs[2]:
        gb = kiln.from_numpy(g_sum)
    return [gx, gw, gb]


def _moments_of(x, arrays: tuple) -> list:
    """(mean, drift, r) as the ops' backward reads them, from the arrays' forward (for a trace or a
    profile running the backward of a forward that ran on the arrays)."""
    shape = (1, arrays[0].shape[1]) + (1,) * (x.ndim - 2)
    return [kiln.from_numpy(a.reshape(shape)) for a in (arrays[3], arrays[2], arrays[1])]
