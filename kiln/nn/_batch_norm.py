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
"""

from __future__ import annotations

import kiln


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
        ctx.eps = eps
        mean = mean + drift
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, g, _mean_grad, _var_grad):
        x, weight, bias, mean, drift, r = ctx.saved_tensors
        if kiln.is_grad_enabled():  # create_graph: a gradient autograd can differentiate again
            return (*_differentiable_gradients(ctx.needs_input_grad[:3], x, weight, bias, ctx.eps, g), None)
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
