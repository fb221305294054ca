"""Parametrizations in PyTorch's new style: ``weight_norm`` over ``nn.utils.parametrize``.

>>> import kiln
>>> lin = weight_norm(kiln.nn.Linear(3, 2))
>>> sorted(lin.state_dict())
['bias', 'parametrizations.weight.original0', 'parametrizations.weight.original1']
"""

from __future__ import annotations

from ..modules.module import Module
from . import parametrize
from .weight_norm import _norm_except_dim

__all__ = ["weight_norm"]


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
