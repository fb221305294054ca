"""Normalization: layer_norm, batch_norm, group_norm, instance_norm.

Each normalizes with the biased variance, computed as the mean of squared deviations (so the
gradient comes from mean and mul alone), then applies the optional affine weight and bias.
"""

from __future__ import annotations

import math

import kiln

from ._utils import check_tensor

__all__ = ["layer_norm", "batch_norm", "group_norm", "instance_norm"]


def _normalize(x: kiln.Tensor, dims: tuple[int, ...], eps: float) -> tuple[kiln.Tensor, kiln.Tensor, kiln.Tensor]:
    """(x - mean) / sqrt(var + eps) over ``dims``, with the mean and biased variance (keepdim)."""
    mean = x.mean(dim=dims, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=dims, keepdim=True)
    return centered * kiln.rsqrt(var + eps), mean, var


def _affine(y: kiln.Tensor, weight, bias, shape: tuple[int, ...]) -> kiln.Tensor:
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


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
    y, _, _ = _normalize(input, tuple(range(input.ndim - k, input.ndim)), eps)
    return _affine(y, weight, bias, shape)


def _channel_shape(x: kiln.Tensor) -> tuple[int, ...]:
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


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
    shape = _channel_shape(input)
    dims = (0, *range(2, input.ndim))
    if training:
        count = input.numel() // c
        if count <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input size {list(input.shape)}"
            )
        y, mean, var = _normalize(input, dims, eps)
        if running_mean is not None and running_var is not None:
            with kiln.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.reshape(c) * momentum)
                running_var.mul_(1 - momentum).add_(var.reshape(c) * (momentum * count / (count - 1)))
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("batch_norm: running_mean and running_var must be given when training=False")
        y = (input - running_mean.reshape(shape)) * kiln.rsqrt(running_var.reshape(shape) + eps)
    return _affine(y, weight, bias, shape)


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
    return _affine(y.reshape(input.shape), weight, bias, _channel_shape(input))


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> kiln.Tensor:  # fmt: skip
    """Normalize each channel of each sample over its spatial dims (running statistics not supported)."""
    check_tensor(input, "input", "instance_norm")
    if not use_input_stats or running_mean is not None or running_var is not None:
        raise NotImplementedError("instance_norm: running statistics are not supported yet")
    if input.ndim < 3:
        raise ValueError(f"instance_norm: expected (N, C, *spatial) input, got shape {list(input.shape)}")
    y, _, _ = _normalize(input, tuple(range(2, input.ndim)), eps)
    return _affine(y, weight, bias, _channel_shape(input))
