"""Normalization: layer_norm, batch_norm, group_norm, instance_norm.

Each normalizes with the biased variance, computed as the mean of squared deviations (so the
gradient comes from mean and mul alone), then applies the optional affine weight and bias.
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln.frontend.autograd.checked import check_saved
from kiln.frontend.eager_composites import compiled_composite
from kiln.frontend.opmath import in_float32

from ._batch_norm import (
    ARRAYS_BELOW,
    affine,
    batch_norm_on_arrays,
    moments,
    training_batch_norm,
    unbiased_factor,
    update_running_statistics,
)
from ._layer_norm_arrays import layer_norm_on_arrays
from ._utils import check_tensor

__all__ = ["layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm", "local_response_norm"]


def _normalize(x: kiln.Tensor, dims: tuple[int, ...], eps: float) -> tuple[kiln.Tensor, kiln.Tensor, kiln.Tensor]:
    """(x - mean) / sqrt(var + eps) over ``dims``, with the mean and biased variance (keepdim), the
    deviations centered twice (``_batch_norm.moments`` says why). Eagerly, ``moments``' fewest
    ops (each a pass over memory; the traced form's took 0.88 -> 1.07 ms forward and backward on
    (512, 128) rows); traced, the form whose compiled backward sums its rows in one pass."""
    if kiln.jit.is_tracing():
        return _normalize_traced(x, dims, eps)
    centered, r, mean, var = moments(x, dims, eps)
    return centered * r, mean, var


def _normalize_traced(x: kiln.Tensor, dims: tuple[int, ...], eps: float):
    """``_normalize``'s values (those of ``moments``) in the form chosen for the compiled backward:
    see ``_zero_mean_terms``."""
    mean = x.mean(dim=dims, keepdim=True)
    fixed = mean.detach()
    deviation = x - fixed
    drift = deviation.mean(dim=dims, keepdim=True).detach()
    centered = deviation - drift
    zero = mean - fixed
    var = (centered * centered).mean(dim=dims, keepdim=True) + _zero_mean_terms(centered, zero, dims)
    return (centered - zero) * kiln.rsqrt(var + eps), mean + drift, var


def _zero_mean_terms(centered: kiln.Tensor, zero: kiln.Tensor, dims: tuple[int, ...]) -> kiln.Tensor:
    """``mean((centered - zero)^2) - mean(centered^2)``: zero in value, where ``zero = mean - mean.detach()``.

    ``centered`` is taken from the mean and drift held constant, so its gradient is the identity;
    ``zero`` carries the mean's. Autograd through ``centered = x - mean`` gave a backward of three
    row sums, each waiting for the one before (the mean's gradient removes the mean of a gradient
    that the variance's sum made). Here its two row sums -- of the gradient, and of the gradient
    times the deviations -- read only saved values, one pass together, as a hand-written
    LayerNorm backward's do (layer_norm of (512, 128) rows, forward and backward compiled, one
    thread: 165 -> 145 us). These terms keep the gradient of the gradient exact too: without them
    the variance's second derivative missed the mean's part."""
    return zero * zero - 2 * zero * centered.mean(dim=dims, keepdim=True)


@in_float32  # bfloat16 normalizes in float32, as PyTorch does
@compiled_composite("layer_norm")
@kiln.jit.composite("layer_norm")
def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> kiln.Tensor:
    """Normalize over the trailing ``normalized_shape`` dims, as ``torch.nn.functional.layer_norm``.

    >>> import kiln
    >>> layer_norm(kiln.tensor([[1.0, 3.0]]), (2,), eps=0.0).tolist()
    [[-1.0, 1.0]]
    """
    check_tensor(input, "input", "layer_norm")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k :]) != shape:
        raise RuntimeError(
            f"layer_norm: given normalized_shape={list(shape)}, expected input with shape [*, "
            f"{', '.join(map(str, shape))}], but got input of size {list(input.shape)}"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise RuntimeError(f"layer_norm: expected {name} of shape {list(shape)}, got {list(t.shape)}")
    dims = tuple(range(input.ndim - k, input.ndim))

    def composite(x, weight, bias):
        # in C order, as PyTorch's (and the arrays path's) result: ``layer_norm(x.mT, ...).view(-1)`` works
        y = affine(_normalize(x.contiguous(), dims, eps)[0], weight, bias, shape)
        # PyTorch's node keeps the input (as the arrays path's does): changing it in place before the
        # backward raises, compiled or not
        return check_saved(y, (x,), "NativeLayerNormBackward") if y.grad_fn is not None else y

    y = layer_norm_on_arrays(input, math.prod(shape), weight, bias, eps, composite)  # (None: the ops run)
    return composite(input, weight, bias) if y is None else y


def _channel_shape(x: kiln.Tensor) -> tuple[int, ...]:
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


@in_float32  # mixed dtypes (bfloat16 input, float32 statistics) give the input dtype, as in PyTorch
@compiled_composite("batch_norm", eager_below=ARRAYS_BELOW)  # smaller: on the arrays, faster
@kiln.jit.composite("batch_norm")
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> kiln.Tensor:  # fmt: skip
    """Normalize each channel (dim 1) over the batch and spatial dims.

    In training, the batch statistics normalize, and ``running_mean``/``running_var`` (when
    given) are updated in place without gradient: ``r = (1 - momentum) * r + momentum * stat``,
    with the unbiased variance, as PyTorch does. In eval, the running statistics normalize.
    """
    check_tensor(input, "input", "batch_norm")
    if input.ndim < 2:
        raise ValueError(f"batch_norm: expected 2D or higher input (N, C, ...), got shape {list(input.shape)}")
    c = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (c,):
            raise RuntimeError(f"batch_norm: {name} should contain {c} elements not {t.numel()}")
    input = input.contiguous()  # C-order results, as PyTorch's (and the arrays path's)
    shape = _channel_shape(input)
    if training:
        count = input.numel() // c
        if count <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input size {list(input.shape)}"
            )
        y = batch_norm_on_arrays(input, weight, bias, eps, running_mean, running_var, momentum)
        if y is not None:  # plain tensors: one autograd node on the arrays
            return y
        y, mean, var = training_batch_norm(input, weight, bias, eps)
        if running_mean is not None and running_var is not None:
            update_running_statistics(running_mean, running_var, mean, var, momentum, count)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("batch_norm: running_mean and running_var must be given when training=False")
        y = (input - running_mean.reshape(shape)) * kiln.rsqrt(running_var.reshape(shape) + eps)
        y = affine(y, weight, bias, shape)
    return y


@in_float32  # bfloat16 normalizes in float32, as PyTorch does
@compiled_composite("group_norm")
def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5) -> kiln.Tensor:
    """Normalize each of ``num_groups`` channel groups per sample, as ``torch.nn.functional.group_norm``."""
    check_tensor(input, "input", "group_norm")
    if input.ndim < 2:
        raise RuntimeError(f"group_norm: expected at least 2 dims (N, C, *), got shape {list(input.shape)}")
    n, c = input.shape[0], input.shape[1]
    if num_groups <= 0 or c % num_groups:
        raise RuntimeError(
            f"Expected number of channels in input to be divisible by num_groups, but got input of shape "
            f"{list(input.shape)} and num_groups={num_groups}"
        )
    grouped = input.reshape(n, num_groups, c // num_groups * math.prod(input.shape[2:]))
    y, _, _ = _normalize(grouped, (2,), eps)
    return affine(y.reshape(input.shape), weight, bias, _channel_shape(input))


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> kiln.Tensor:  # fmt: skip
    """Normalize each channel of each sample over its spatial dims, as ``torch.nn.functional.instance_norm``.

    With ``use_input_stats`` the instance statistics normalize and the running statistics (when
    given) move toward their mean over the batch (unbiased variance); without, the running
    statistics normalize, as batch norm does in eval.
    """
    check_tensor(input, "input", "instance_norm")
    if input.ndim < 3:
        raise ValueError(f"instance_norm: expected (N, C, *spatial) input, got shape {list(input.shape)}")
    c = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (c,):
            raise RuntimeError(f"instance_norm: {name} should contain {c} elements not {t.numel()}")
    shape = _channel_shape(input)
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise RuntimeError("Expected running_mean and running_var to be defined when use_input_stats is false")
        y = (input - running_mean.reshape(shape)) * kiln.rsqrt(running_var.reshape(shape) + eps)
        return affine(y, weight, bias, shape)
    count = math.prod(input.shape[2:])
    if count <= 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size {list(input.shape)}")
    y, mean, var = _normalize(input, tuple(range(2, input.ndim)), eps)
    with kiln.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.reshape(input.shape[0], c).mean(dim=0) * momentum)
        if running_var is not None:
            unbiased = var.reshape(input.shape[0], c).mean(dim=0) * unbiased_factor(var, count)
            running_var.mul_(1 - momentum).add_(unbiased * momentum)
    return affine(y, weight, bias, shape)


def rms_norm(input, normalized_shape, weight=None, eps=None) -> kiln.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape`` dims.

    ``eps=None`` uses the machine epsilon of the input's dtype, as PyTorch does.
    """
    check_tensor(input, "input", "rms_norm")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k :]) != shape:
        raise RuntimeError(
            f"rms_norm: given normalized_shape={list(shape)}, expected input with shape [*, "
            f"{', '.join(map(str, shape))}], but got input of size {list(input.shape)}"
        )
    if eps is None:
        eps = float(np.finfo(_numpy_dtype(input)).eps)
    dims = tuple(range(input.ndim - k, input.ndim))
    y = input * kiln.rsqrt((input * input).mean(dim=dims, keepdim=True) + eps)
    return y if weight is None else y * weight


def _numpy_dtype(x: kiln.Tensor):
    return {kiln.float64: np.float64, kiln.float16: np.float16}.get(x.dtype, np.float32)


def local_response_norm(input, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> kiln.Tensor:
    """``x / (k + alpha * mean of x^2 over ``size`` neighbouring channels) ** beta`` (AlexNet's LRN).

    The window is centred like PyTorch's: ``size // 2`` channels before, ``(size - 1) // 2`` after,
    zero-padded at the ends, always divided by ``size``.
    """
    check_tensor(input, "input", "local_response_norm")
    if input.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {input.ndim} dimensions)")
    if input.numel() == 0:
        return input
    c = input.shape[1]
    square = input * input
    amounts = [0, 0] * (input.ndim - 2) + [size // 2, (size - 1) // 2]
    padded = kiln.nn.functional.pad(square, amounts)
    window = sum(kiln.narrow(padded, 1, j, c) for j in range(size))
    return input / (window * (alpha / size) + k) ** beta
