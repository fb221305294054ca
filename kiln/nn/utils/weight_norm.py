"""``weight_norm``: reparametrize a weight as ``g * v / ||v||`` (magnitude and direction learned apart).

The module gets parameters ``<name>_g`` and ``<name>_v`` (PyTorch's names, so state dicts load by
key) and a forward pre-hook that recomputes ``<name>`` from them before every call.
"""

from __future__ import annotations

import kiln

from ..modules.module import RemovableHandle
from ..parameter import Parameter

__all__ = ["weight_norm", "remove_weight_norm"]


def _norm_except_dim(v, dim: int | None):
    """||v|| over every dim but ``dim``, shaped to broadcast against ``v`` (the whole norm when None)."""
    if dim is None:
        return kiln.norm(v)
    dims = tuple(d for d in range(v.ndim) if d != dim)
    return kiln.norm(v, 2, dim=dims, keepdim=True) if dims else kiln.abs(v)


class WeightNorm:
    """The pre-hook that recomputes the weight; kept on the module so ``remove_weight_norm`` finds it."""

    handle: RemovableHandle  # set by weight_norm() once the hook is registered

    def __init__(self, name: str, dim: int | None) -> None:
        self.name, self.dim = name, dim

    def compute_weight(self, module):
        g, v = getattr(module, self.name + "_g"), getattr(module, self.name + "_v")
        return v * (g / _norm_except_dim(v, self.dim))

    def __call__(self, module, inputs) -> None:
        object.__setattr__(module, self.name, self.compute_weight(module))


def weight_norm(module, name: str = "weight", dim: int | None = 0):
    """Apply weight normalization to ``module.<name>``; returns the module.

    >>> lin = weight_norm(kiln.nn.Linear(3, 2))
    >>> sorted(n for n, _ in lin.named_parameters())
    ['bias', 'weight_g', 'weight_v']
    """
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, WeightNorm) and hook.name == name:
            raise RuntimeError(f"Cannot register two weight_norm hooks on the same parameter {name}")
    weight = getattr(module, name)
    if dim is not None and dim < 0:
        dim += weight.ndim
    fn = WeightNorm(name, dim)
    del module._parameters[name]
    with kiln.no_grad():
        module.register_parameter(name + "_g", Parameter(_norm_except_dim(weight.detach(), dim).clone()))
        module.register_parameter(name + "_v", Parameter(weight.detach().clone()))
    object.__setattr__(module, name, fn.compute_weight(module))
    handle = module.register_forward_pre_hook(fn)
    fn.handle = handle
    return module


def remove_weight_norm(module, name: str = "weight"):
    """Undo ``weight_norm``: ``<name>`` becomes one parameter again (its current value)."""
    for hook in list(module._forward_pre_hooks.values()):
        if isinstance(hook, WeightNorm) and hook.name == name:
            with kiln.no_grad():
                weight = hook.compute_weight(module).detach().clone()
            hook.handle.remove()
            del module._parameters[name + "_g"]
            del module._parameters[name + "_v"]
            module.__dict__.pop(name, None)
            module.register_parameter(name, Parameter(weight))
            return module
    raise ValueError(f"weight_norm of '{name}' not found in {module}")
