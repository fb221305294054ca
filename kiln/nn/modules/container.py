"""``torch.nn.modules.container``'s path: the containers (defined in containers.py)."""

from .containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential

__all__ = ["Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"]
