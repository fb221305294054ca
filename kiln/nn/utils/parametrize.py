"""Parametrizations, as ``torch.nn.utils.parametrize``: a tensor of a module computed from others.

``register_parametrization(module, "weight", p)`` moves the parameter to
``module.parametrizations.weight.original`` (or ``original0``, ``original1``, ... when ``p.right_inverse``
returns several tensors) and makes ``module.weight`` a property that evaluates ``p(*originals)`` on
every access. The state-dict keys are PyTorch's, so parametrized checkpoints load by key.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import kiln

from ..modules.container import ModuleDict, ModuleList
from ..modules.module import Module
from ..parameter import Parameter

__all__ = ["register_parametrization", "remove_parametrizations", "is_parametrized", "cached",
           "ParametrizationList", "type_before_parametrizations"]  # fmt: skip


class ParametrizationList(ModuleList):
    """The parametrizations of one tensor (applied in order) and the original tensor(s) they start from."""

    def __init__(self, modules, original, unsafe: bool = False) -> None:
        super().__init__(modules)
        self.unsafe = unsafe
        first = modules[0]
        with kiln.no_grad():
            new = first.right_inverse(original) if hasattr(first, "right_inverse") else original
        self.is_tensor = isinstance(new, kiln.Tensor)
        self.ntensors = 1 if self.is_tensor else len(new)
        if self.is_tensor:
            if isinstance(original, Parameter):
                self.original = Parameter(new.detach().clone(), original.requires_grad)
            else:  # a parametrized buffer stays a buffer
                self.register_buffer("original", new.detach().clone())
        else:
            for i, value in enumerate(new):
                setattr(self, f"original{i}", Parameter(value.detach().clone(), original.requires_grad))

    def right_inverse(self, value) -> None:
        """Set the originals so that the parametrized tensor becomes ``value``."""
        with kiln.no_grad():
            for module in reversed(list(self)):
                if not hasattr(module, "right_inverse"):
                    raise RuntimeError(f"parametrization {type(module).__name__} does not implement right_inverse.")
                value = module.right_inverse(value)
            if self.is_tensor:
                self.original.copy_(value)
            else:
                for i, v in enumerate(value):
                    getattr(self, f"original{i}").copy_(v)

    def forward(self):
        modules = list(self)
        if self.is_tensor:
            x = modules[0](self.original)
        else:
            x = modules[0](*(getattr(self, f"original{i}") for i in range(self.ntensors)))
        for module in modules[1:]:
            x = module(x)
        return x


def _property(name: str) -> property:
    def get(self):
        return self.parametrizations[name]()

    def set(self, value):
        self.parametrizations[name].right_inverse(value)

    return property(get, set)


def _deepcopy(self, memo):
    # Each copy gets a class of its own: the properties live on the class, and removing a
    # parametrization from one copy must not remove it from the others.
    cls = type(self)
    self.__class__ = cls._kiln_original_class
    try:
        copied = copy.deepcopy(self, memo)
    finally:
        self.__class__ = cls
    _inject_class(copied)
    for name, value in cls.__dict__.items():
        if isinstance(value, property):
            setattr(type(copied), name, value)
    return copied


def _inject_class(module: Module) -> None:
    cls = module.__class__
    module.__class__ = type(f"Parametrized{cls.__name__}", (cls,),
                            {"_kiln_original_class": cls, "__deepcopy__": _deepcopy})  # fmt: skip


def is_parametrized(module: Module, tensor_name: str | None = None) -> bool:
    parametrizations = module.__dict__.get("_modules", {}).get("parametrizations")
    if not isinstance(parametrizations, ModuleDict):
        return False
    return len(parametrizations) > 0 if tensor_name is None else tensor_name in parametrizations


def type_before_parametrizations(module: Module) -> type:
    return getattr(type(module), "_kiln_original_class", type(module))


def register_parametrization(module: Module, tensor_name: str, parametrization: Module, *,
                             unsafe: bool = False) -> Module:  # fmt: skip
    """Make ``module.<tensor_name>`` be ``parametrization(original)``; returns the module."""
    if is_parametrized(module, tensor_name):
        module.parametrizations[tensor_name].append(parametrization)
        return module
    if tensor_name in module._parameters or tensor_name in module._buffers:
        original = getattr(module, tensor_name)
        plist = ParametrizationList([parametrization], original, unsafe=unsafe)
        store = module._parameters if tensor_name in module._parameters else module._buffers
        del store[tensor_name]
    else:
        raise ValueError(f"Module '{module}' does not have a parameter, a buffer, or a parametrized element with "
                         f"name '{tensor_name}'")  # fmt: skip
    if not is_parametrized(module):
        _inject_class(module)
        module.parametrizations = ModuleDict()
    setattr(type(module), tensor_name, _property(tensor_name))
    module.parametrizations[tensor_name] = plist
    return module


def remove_parametrizations(module: Module, tensor_name: str, leave_parametrized: bool = True) -> Module:
    """Undo ``register_parametrization``: the tensor becomes a plain parameter again (its parametrized value,
    or the original with ``leave_parametrized=False``)."""
    if not is_parametrized(module, tensor_name):
        raise ValueError(f"Module {module} does not have a parametrization on {tensor_name}")
    plist = module.parametrizations[tensor_name]
    if leave_parametrized:
        with kiln.no_grad():
            value = getattr(module, tensor_name).detach().clone()
    elif plist.is_tensor:
        value = plist.original.detach().clone()
    else:
        raise ValueError("Cannot leave unparametrized (`leave_parametrized=False`) a tensor that is parametrized in "
                         "terms of a sequence of tensors.")  # fmt: skip
    del module.parametrizations[tensor_name]
    delattr(type(module), tensor_name)
    module.register_parameter(tensor_name, Parameter(value))
    if not is_parametrized(module):
        del module._modules["parametrizations"]
        module.__class__ = type_before_parametrizations(module)
    return module


@contextlib.contextmanager
def cached() -> Iterator[None]:
    """Accepted for PyTorch programs; kiln evaluates parametrizations on each access."""
    yield
