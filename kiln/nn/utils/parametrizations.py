"""Parametrizations in PyTorch's new style: ``weight_norm`` and ``spectral_norm`` over ``nn.utils.parametrize``.

>>> import kiln
>>> lin = weight_norm(kiln.nn.Linear(3, 2))
>>> sorted(lin.state_dict())
['bias', 'parametrizations.weight.original0', 'parametrizations.weight.original1']
"""

from __future__ import annotations

import kiln

from .. import functional as F
from ..modules.conv_transpose import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from ..modules.module import Module
from . import parametrize
from .weight_norm import _norm_except_dim

__all__ = ["weight_norm", "spectral_norm"]


class _WeightNorm(Module):
    def __init__(self, dim: int | None = 0) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, weight_g, weight_v):
        return weight_v * (weight_g / _norm_except_dim(weight_v, self.dim))

    def right_inverse(self, weight):
        return _norm_except_dim(weight, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """``module.<name>`` as ``g * v / ||v||``: ``original0`` is the magnitude g, ``original1`` the direction v."""
    if dim is not None and dim < -1:
        dim += getattr(module, name).ndim
    if dim == -1:
        dim = None
    return parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)


class _SpectralNorm(Module):
    """``weight / sigma``, sigma the largest singular value of the weight as a matrix (rows along ``dim``),
    estimated by power iteration; the vectors ``_u``, ``_v`` are buffers refined in training mode."""

    def __init__(self, weight, n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12) -> None:
        super().__init__()
        self.dim = dim if dim >= 0 else dim + weight.ndim
        self.eps = eps
        if weight.ndim > 1:
            if n_power_iterations <= 0:
                raise ValueError(f"Expected n_power_iterations to be positive, but got n_power_iterations="
                                 f"{n_power_iterations}")  # fmt: skip
            self.n_power_iterations = n_power_iterations
            matrix = self._as_matrix(weight.detach())
            h, w = matrix.shape
            u = kiln.randn(h, dtype=matrix.dtype, device=matrix.device)
            v = kiln.randn(w, dtype=matrix.dtype, device=matrix.device)
            self.register_buffer("_u", F.normalize(u, dim=0, eps=eps))
            self.register_buffer("_v", F.normalize(v, dim=0, eps=eps))
            self._power_method(matrix, 15)

    def _as_matrix(self, weight):
        if self.dim != 0:
            weight = weight.permute(self.dim, *(d for d in range(weight.ndim) if d != self.dim))
        return weight.flatten(1)

    def _power_method(self, matrix, iterations: int) -> None:
        with kiln.no_grad():
            for _ in range(iterations):
                self._u.copy_(F.normalize(kiln.matmul(matrix, self._v), dim=0, eps=self.eps))
                self._v.copy_(F.normalize(kiln.matmul(matrix.transpose(0, 1), self._u), dim=0, eps=self.eps))

    def forward(self, weight):
        if weight.ndim == 1:
            return F.normalize(weight, dim=0, eps=self.eps)
        matrix = self._as_matrix(weight)
        if self.training:
            self._power_method(matrix.detach(), self.n_power_iterations)
        u, v = self._u.clone(), self._v.clone()
        sigma = (u * kiln.matmul(matrix, v)).sum()
        return weight / sigma

    def right_inverse(self, value):
        return value


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:  # fmt: skip
    """Divide ``module.<name>`` by its spectral norm on every access (power iteration in training mode)."""
    weight = getattr(module, name, None)
    if not isinstance(weight, kiln.Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if dim is None:
        dim = 1 if isinstance(module, ConvTranspose1d | ConvTranspose2d | ConvTranspose3d) else 0
    return parametrize.register_parametrization(module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))
