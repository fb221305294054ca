"""``spectral_norm`` in PyTorch's original (hook) style: ``<name>_orig`` is the parameter, ``<name>_u`` and
``<name>_v`` the power-iteration vectors (buffers), and a forward pre-hook sets ``<name>`` to
``<name>_orig / sigma`` before every call, refining u and v first in training mode."""

from __future__ import annotations

import kiln

from .. import functional as F
from ..modules.conv_transpose import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from ..modules.module import RemovableHandle
from ..parameter import Parameter

__all__ = ["spectral_norm", "remove_spectral_norm"]


class SpectralNorm:
    """The pre-hook: recompute the normalized weight from ``<name>_orig``."""

    handle: RemovableHandle  # set by spectral_norm() once the hook is registered

    def __init__(self, name: str, n_power_iterations: int, dim: int, eps: float) -> None:
        if n_power_iterations <= 0:
            raise ValueError(f"Expected n_power_iterations to be positive, but got n_power_iterations="
                             f"{n_power_iterations}")  # fmt: skip
        self.name, self.n_power_iterations, self.dim, self.eps = name, n_power_iterations, dim, eps

    def matrix(self, weight):
        if self.dim != 0:
            weight = weight.permute(self.dim, *(d for d in range(weight.ndim) if d != self.dim))
        return weight.reshape(weight.shape[0], -1)

    def compute_weight(self, module, power_iteration: bool):
        weight = getattr(module, self.name + "_orig")
        u, v = getattr(module, self.name + "_u"), getattr(module, self.name + "_v")
        matrix = self.matrix(weight)
        if power_iteration:
            with kiln.no_grad():
                for _ in range(self.n_power_iterations):
                    v.copy_(F.normalize(kiln.matmul(matrix.detach().transpose(0, 1), u), dim=0, eps=self.eps))
                    u.copy_(F.normalize(kiln.matmul(matrix.detach(), v), dim=0, eps=self.eps))
        sigma = (u.clone() * kiln.matmul(matrix, v.clone())).sum()
        return weight / sigma

    def __call__(self, module, inputs) -> None:
        object.__setattr__(module, self.name, self.compute_weight(module, module.training))


def spectral_norm(module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12, dim=None):
    """Normalize ``module.<name>`` by its spectral norm (estimated by power iteration); returns the module."""
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, SpectralNorm) and hook.name == name:
            raise RuntimeError(f"Cannot register two spectral_norm hooks on the same parameter {name}")
    if dim is None:
        dim = 1 if isinstance(module, ConvTranspose1d | ConvTranspose2d | ConvTranspose3d) else 0
    weight = getattr(module, name)
    fn = SpectralNorm(name, n_power_iterations, dim if dim >= 0 else dim + weight.ndim, eps)
    matrix = fn.matrix(weight.detach())
    h, w = matrix.shape
    del module._parameters[name]
    module.register_parameter(name + "_orig", Parameter(weight.detach().clone()))
    module.register_buffer(name + "_u", F.normalize(kiln.randn(h, dtype=weight.dtype), dim=0, eps=eps))
    module.register_buffer(name + "_v", F.normalize(kiln.randn(w, dtype=weight.dtype), dim=0, eps=eps))
    object.__setattr__(module, name, weight.detach().clone())
    fn.handle = module.register_forward_pre_hook(fn)
    return module


def remove_spectral_norm(module, name: str = "weight"):
    """Undo ``spectral_norm``: ``<name>`` becomes one parameter again (its current normalized value)."""
    for hook in list(module._forward_pre_hooks.values()):
        if isinstance(hook, SpectralNorm) and hook.name == name:
            with kiln.no_grad():
                weight = hook.compute_weight(module, False).detach().clone()
            hook.handle.remove()
            del module._parameters[name + "_orig"]
            del module._buffers[name + "_u"]
            del module._buffers[name + "_v"]
            module.__dict__.pop(name, None)
            module.register_parameter(name, Parameter(weight))
            return module
    raise ValueError(f"spectral_norm of '{name}' not found in {module}")
