"""Shape layers: ``Flatten`` and ``Unflatten`` (``Identity`` lives in linear.py, as in PyTorch)."""

from __future__ import annotations

from .linear import Identity
from .module import Module

__all__ = ["Flatten", "Unflatten", "Identity"]


class Flatten(Module):
    """Flatten dims ``start_dim`` .. ``end_dim`` into one."""

    kiln_only = True  # its forward calls no user code (``Module.kiln_only``)

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Expand dim ``dim`` into ``unflattened_size``."""

    def __init__(self, dim: int, unflattened_size) -> None:
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, input):
        return input.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
