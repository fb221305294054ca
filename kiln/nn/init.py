"""``kiln.nn.init``: in-place weight initialisers, PyTorch's names, formulas and defaults.

Every initialiser runs under ``no_grad`` and draws from ``generator`` (kiln's default when None).
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln.frontend.tensor import Tensor

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "dirac_", "sparse_",
]  # fmt: skip

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The recommended gain for ``nonlinearity`` (PyTorch's table)."""
    if nonlinearity in _LINEAR or nonlinearity == "sigmoid":
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, int | float) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    if tensor.dim() < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator=None) -> Tensor:
    with kiln.no_grad():
        return tensor.uniform_(a, b, generator=generator)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> Tensor:
    with kiln.no_grad():
        return tensor.normal_(mean, std, generator=generator)


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator=None) -> Tensor:  # fmt: skip
    """Normal(mean, std) truncated to [a, b]: out-of-range draws are redrawn until all lie inside."""
    with kiln.no_grad():
        value = kiln.empty_like(tensor).normal_(mean, std, generator=generator)
        for _ in range(1000):
            bad = (value < a) | (value > b)
            if not bad.any().item():
                break
            fresh = kiln.empty_like(tensor).normal_(mean, std, generator=generator)
            value = kiln.where(bad, fresh, value)
        else:  # pathological interval (far in a tail): clamp what is left
            value = value.clamp(a, b)
        return tensor.copy_(value)


def constant_(tensor: Tensor, val: float) -> Tensor:
    with kiln.no_grad():
        return tensor.fill_(val)


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    with kiln.no_grad():
        return tensor.zero_()


def eye_(tensor: Tensor) -> Tensor:
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    with kiln.no_grad():
        return tensor.copy_(kiln.eye(*tensor.shape, dtype=tensor.dtype))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def _kaiming_std(tensor: Tensor, a: float, mode: str, nonlinearity: str) -> float:
    if 0 in tensor.shape:
        return 0.0
    return calculate_gain(nonlinearity, a) / math.sqrt(_calculate_correct_fan(tensor, mode))


def kaiming_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator=None) -> Tensor:  # fmt: skip
    if 0 in tensor.shape:
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator=None) -> Tensor:  # fmt: skip
    if 0 in tensor.shape:
        return tensor
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


def orthogonal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    """A (semi-)orthogonal matrix from the QR decomposition of a normal draw, signs fixed by R's diagonal."""
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flat = kiln.empty(rows, cols, dtype=kiln.float64).normal_(0.0, 1.0, generator=generator)
    if rows < cols:
        flat = flat.t()
    # QR of the host copy: initialisation is not differentiable and kiln has no qr op.
    q, r = np.linalg.qr(flat.numpy())
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    with kiln.no_grad():
        return tensor.copy_(kiln.from_numpy(q.copy()).reshape(tensor.shape).to(tensor.dtype) * gain)


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """A convolution weight (3-5 dims) that passes its input through: a 1 at each kernel's centre linking
    output channel i to input channel i, within each of ``groups`` groups."""
    if tensor.ndim not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    out_channels = tensor.shape[0]
    if out_channels % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    per_group = out_channels // groups
    keep = min(per_group, tensor.shape[1])
    values = np.zeros(tuple(tensor.shape), dtype=np.float64)
    centre = tuple(s // 2 for s in tensor.shape[2:])
    for g in range(groups):
        for d in range(keep):
            values[(g * per_group + d, d) + centre] = 1.0  # (not *centre: mypy reads that as 3.11-only)
    with kiln.no_grad():
        return tensor.copy_(kiln.tensor(values, dtype=tensor.dtype, device=tensor.device))


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01, generator=None) -> Tensor:
    """A 2-d tensor drawn from N(0, std^2) with ``ceil(sparsity * rows)`` zeros in each column."""
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    rows, cols = tensor.shape
    zeros = int(math.ceil(sparsity * rows))
    with kiln.no_grad():
        tensor.normal_(0, std, generator=generator)
        for col in range(cols):
            picked = kiln.randperm(rows, generator=generator)[:zeros]
            tensor[picked, col] = 0
    return tensor
