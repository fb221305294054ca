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

Wherever the compiled composite does not run -- below ``ARRAYS_BELOW`` bytes of input, and above it
while its program compiles or with eager kernels off -- on plain float32/64 CPU tensors outside
traces and profiles, the same formulas run on the arrays as one autograd node
(``batch_norm_on_arrays``, ``BatchNormBackward``), the running statistics updated on the arrays
too: each op's dispatch cost more than its pass over a few thousand values, and an autograd
``Function`` with the statistics as outputs cost ~40 us a call more (its context, and the zero
gradients the engine made for them). Larger inputs gain from the fewer passes: fwd+bwd of a
BatchNorm2d on numpy alone (eager kernels off, 2 threads), ops against arrays, (32, 16, 14, 14)
466 / 242 us, (32, 8, 28, 28) 2283 / 1021, (32, 64, 32, 32) 25.2 / 15.8 ms.
Per-channel sums are ``einsum`` over an (N, C, S) view, a third of the cost of numpy's multi-axis
``sum`` there. fwd+bwd of a BatchNorm2d, 1 thread, against the compiled composite and PyTorch:
(16, 16, 8, 8) 104 / 146 / 69 us, (16, 32, 8, 8) 135 / 170 / 102, (32, 32, 8, 8) 200 / 211 / 171,
(16, 64, 16, 16) 704 / 560 / 1003: the composite stays compiled from 256 KiB (``nn._norm.batch_norm``).
"""

from __future__ import annotations

import numpy as np

import kiln
from kiln.frontend import dispatch
from kiln.frontend.autograd import grad_mode
from kiln.frontend.autograd.graph import LazyEdgesNode, pending_edge, save_tensors, unpack_tensors
from kiln.frontend.jit import state as _jit
from kiln.frontend.ops._util import plain_arrays
from kiln.frontend.tensor import make_tensor

#: Inputs of fewer bytes than this run on the arrays, never compiled; larger ones run the compiled
#: composite once it is ready (on the arrays until then).
ARRAYS_BELOW = 1 << 18


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


def affine(y: kiln.Tensor, weight, bias, shape: tuple[int, ...]) -> kiln.Tensor:
    """``y * weight + bias``, each broadcast to ``shape`` (either may be None)."""
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


class _TrainingBatchNorm(kiln.autograd.Function):
    kiln_only = True  # calls no user code: a traced call runs it unwatched (``jit.hazards``)

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float):
        ctx.eps = eps
        dims, shape, _ = _layout(x)
        mean, drift, centered, var = _statistics(x, dims)
        r = kiln.rsqrt(var + eps)
        scale = r if weight is None else r * weight.reshape(shape)
        y = centered * scale
        if bias is not None:
            y = y + bias.reshape(shape)
        # the deviations are computed again from x (bit for bit): a compiled forward then writes
        # one full-size tensor, y, and the backward's kernels read x where they read the deviations.
        # The bias's value enters no gradient, so it is not saved (as in PyTorch, a bias changed in
        # place before the backward is no error): only its shape is kept.
        ctx.save_for_backward(x, weight, mean, drift, r)
        ctx.bias_shape = None if bias is None else tuple(bias.shape)
        mean = mean + drift
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, g, _mean_grad, _var_grad):
        x, weight, *moments = ctx.saved_tensors
        needs, bias_shape = ctx.needs_input_grad[:3], ctx.bias_shape
        if kiln.is_grad_enabled():  # create_graph: a gradient autograd can differentiate again
            return (*_differentiable_gradients(needs, x, weight, bias_shape, ctx.eps, g), None)
        return (*_closed_form(needs, x, weight, bias_shape, moments, g), None)


def _closed_form(needs: tuple[bool, ...], x, weight, bias_shape, moments, g) -> list:
    """The closed-form gradients (see the module docstring) with ops, from the forward's ``moments``
    (the mean, the drift and r, keepdim) and ``x``; ``bias_shape`` None where there is no bias."""
    mean, drift, r = moments
    dims, shape, count = _layout(x)
    centered = (x - mean) - drift
    g_sum = g.sum(dim=dims, keepdim=True)
    gc_sum = (g * centered).sum(dim=dims, keepdim=True)  # sum(g xhat) / r
    gx = gw = gb = None
    if needs[0]:
        scale = r if weight is None else r * weight.reshape(shape)
        # w r (g - sum(g)/M - xhat sum(g xhat)/M) as g a - b - centered c, a b c per channel
        gx = g * scale - g_sum * (scale / count) - centered * (scale * r * r * gc_sum / count)
    if weight is not None and needs[1]:
        gw = (gc_sum * r).reshape(weight.shape)
    if bias_shape is not None and needs[2]:
        gb = g_sum.reshape(bias_shape)
    return [gx, gw, gb]


def _differentiable_gradients(needs: tuple[bool, ...], x, weight, bias_shape, eps: float, g) -> list:
    """The gradients of the composite's formula, recomputed with autograd (create_graph); the bias's,
    the sum of ``g`` per channel, needs no recomputation (nor the bias's value)."""
    dims, shape, _ = _layout(x)
    with kiln.enable_grad():
        centered, r, _, _ = moments(x, dims, eps)
        y = affine(centered * r, weight, None, shape)
    inputs = (x, weight)
    wrt = [t for t, need in zip(inputs, needs[:2], strict=True) if need and t is not None]
    found = iter(kiln.autograd.grad([y], wrt, [g], create_graph=kiln.is_grad_enabled(), allow_unused=True))
    grads = [next(found) if need and t is not None else None for t, need in zip(inputs, needs[:2], strict=True)]
    gb = g.sum(dim=dims).reshape(bias_shape) if bias_shape is not None and needs[2] else None
    return [*grads, gb]


def training_batch_norm(x: kiln.Tensor, weight, bias, eps: float):
    """(y, mean, var) of batch normalization over the batch statistics of ``x`` (N, C, *S): ``y``
    normalized with the biased variance and mapped by ``weight`` and ``bias`` (each (C,) or None),
    differentiable with the closed-form gradient; ``mean`` and ``var`` (1, C, 1...) are not."""
    return _TrainingBatchNorm.apply(x, weight, bias, eps)


# ----------------------------------------------------------------------------- on the arrays
def _on_arrays(x, weight, bias, *state) -> bool:
    """Whether training batch norm runs on the arrays: plain tensors of one dtype (the running
    statistics too, where given), no trace or profile (the compiled composite, where it runs, has
    already taken the call: see the module docstring)."""
    return plain_arrays(x, weight, bias, *state)


def batch_norm_on_arrays(x, weight, bias, eps: float, running_mean, running_var, momentum):
    """Training batch norm of ``x`` (N, C, *S) as one autograd node on the arrays, the running
    statistics (where both are given) updated in place as ``update_running_statistics`` says; None
    where the ops must run (``_on_arrays``, and running statistics that numpy may not write in place
    or a momentum that is not a number)."""
    track = running_mean is not None and running_var is not None
    if track and not (type(momentum) in (float, int) and _writable(running_mean) and _writable(running_var)):
        return None
    if not _on_arrays(x, weight, bias, *((running_mean, running_var) if track else ())):
        return None
    y, mean, var, arrays = _forward_arrays(x, weight, bias, eps)
    if track:
        count = x.numel() // x.shape[1]
        for t, stat, factor in ((running_mean, mean, momentum), (running_var, var, momentum * count / (count - 1))):
            a = t._data
            a *= 1 - momentum
            a += stat * factor
            t._version[0] += 1  # an in-place change, as mul_ and add_ count it (saved copies then raise)
    result = make_tensor(y.reshape(x.shape), x._device, x._dtype)
    if grad_mode.state.grad_enabled and any(t is not None and t._requires_grad for t in (x, weight, bias)):
        BatchNormBackward.attach(result, (x, weight, bias), arrays, eps)
    return result


def update_running_statistics(running_mean, running_var, mean, var, momentum, count: int) -> None:
    """``r = (1 - momentum) * r + momentum * stat`` for the mean and the unbiased variance, in place
    without gradient (the ops' path; ``batch_norm_on_arrays`` does the same on the arrays)."""
    c = running_mean.shape[0]
    with kiln.no_grad():
        running_mean.mul_(1 - momentum).add_(mean.reshape(c) * momentum)
        running_var.mul_(1 - momentum).add_(var.reshape(c) * (unbiased_factor(var, count) * momentum))


def unbiased_factor(like: kiln.Tensor, count: int) -> kiln.Tensor:
    """``count / (count - 1)`` (Bessel's correction) as a scalar tensor of ``like``'s dtype, computed
    by ops from ``count`` itself: a trace then records the count, which a dynamic program reads as
    its sizes' product (``frontend/jit/dynamic.py``); the Python number ``count / (count - 1)``
    would be a constant that holds another value at every size and keep the program static."""
    one = kiln.ones((), dtype=like.dtype, device=like.device)
    return one / (one - one / count)


def count_batch(counter) -> None:
    """``counter.add_(1)`` without gradient (a BatchNorm's ``num_batches_tracked``): on the array for
    a plain writable buffer outside traces and profiles (the op's dispatch and its in-place checks
    were ~10 us of a (16, 32, 4, 4) BatchNorm2d call's ~60)."""
    if (
        (_jit.tracing and _jit.current.get() is not None)
        or dispatch.profiling_ops
        or type(counter) is not kiln.Tensor
        or not _writable(counter)
    ):
        with kiln.no_grad():
            counter.add_(1)
        return
    counter._data += 1
    counter._version[0] += 1


def _writable(t) -> bool:
    """A buffer numpy may write in place: a plain CPU tensor of its own contiguous memory, no gradient."""
    if t.requires_grad or t._inference or t._base is not None or t._device.type != "cpu":
        return False  # (an inference tensor's in-place error: the ops')
    flags = t._data.flags
    return flags.c_contiguous and flags.writeable


def _channel_sums(a: np.ndarray) -> np.ndarray:
    """Per-channel sums of an (N, C, S) array."""
    return np.einsum("ncs->c", a)


def _forward_arrays(x, weight, bias, eps: float):
    """(y, mean, var, arrays) of the forward's formulas on the arrays, y as (N, C, S) and the
    statistics (C,); ``arrays`` (the deviations, (N, C, S), then ``r``, the first mean and its drift,
    (C,)) are what the backward reads."""
    a = x._data
    n, c, count = a.shape[0], a.shape[1], a.size // (a.shape[0] * a.shape[1])
    a = a.reshape(n, c, count)
    mean = _channel_sums(a) / (n * count)
    centered = a - mean[:, None]
    drift = _channel_sums(centered) / (n * count)
    centered -= drift[:, None]
    var = _channel_sums(centered * centered) / (n * count)
    r = 1 / np.sqrt(var + a.dtype.type(eps))
    scale = r if weight is None else r * weight._data
    y = centered * scale[:, None]
    if bias is not None:
        y += bias._data[:, None]
    return y, mean + drift, var, (centered, r, mean, drift)


class BatchNormBackward(LazyEdgesNode):
    """The closed-form gradients (see the module docstring) of ``batch_norm_on_arrays``'s output on
    the arrays; under create_graph, a trace or a profile, the composite's recomputed with ops."""

    __slots__ = ("saved", "versions", "arrays", "eps")
    saved: tuple | None  # the input, weight and bias (or None); None once released
    versions: tuple  # theirs when saved (checked when read; None: the bias, unchecked)
    arrays: tuple
    eps: float

    @classmethod
    def attach(cls, result, inputs: tuple, arrays: tuple, eps: float) -> None:
        node = cls(tuple([None if t is None else pending_edge(t) for t in inputs]))
        node.saved, node.versions = inputs, save_tensors(inputs, unchecked=(2,))  # (no gradient reads the bias)
        node.arrays, node.eps = arrays, eps
        result.grad_fn, result._output_nr, result._requires_grad = node, 0, True

    def apply(self, grads: list) -> tuple:
        g = grads[0]
        x, weight, bias = unpack_tensors(self, self.saved, self.versions)
        assert x is not None  # (saved by attach; the weight and bias may be None)
        needs = tuple(edge is not None for edge in self.next_edges)
        bias_shape = None if bias is None else tuple(bias.shape)
        if grad_mode.state.grad_enabled:  # create_graph: a gradient autograd can differentiate again
            return tuple(_differentiable_gradients(needs, x, weight, bias_shape, self.eps, g))
        if not plain_arrays(g, x) or g._data.shape != x._data.shape:  # a trace or a profile records ops
            shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
            r, mean, drift = (kiln.from_numpy(a.reshape(shape)) for a in self.arrays[1:])
            return tuple(_closed_form(needs, x, weight, bias_shape, (mean, drift, r), g))
        return tuple(_backward_arrays(needs, self.arrays, weight, bias, g))

    def release(self) -> None:
        self.saved = None
        self.arrays = ()


def _backward_arrays(needs: tuple[bool, ...], arrays: tuple, weight, bias, g) -> list:
    """The closed-form gradients (see the module docstring) on the arrays."""
    centered, r = arrays[:2]
    count = centered.shape[0] * centered.shape[2]
    g3 = g._data.reshape(centered.shape)
    g_sum = _channel_sums(g3)
    gc_sum = _channel_sums(g3 * centered)  # sum(g xhat) / r
    gx = gw = gb = None
    if needs[0]:
        scale = r if weight is None else r * weight._data
        gx = g3 * scale[:, None]
        gx -= (g_sum * (scale / count))[:, None]
        gx -= centered * (scale * r * r * gc_sum / count)[:, None]
        gx = make_tensor(gx.reshape(g.shape), g._device, g._dtype)
    if weight is not None and needs[1]:
        gw = make_tensor(gc_sum * r, g._device, g._dtype)
    if bias is not None and needs[2]:
        gb = make_tensor(g_sum, g._device, g._dtype)
    return [gx, gw, gb]
