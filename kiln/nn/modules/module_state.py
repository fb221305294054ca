"""A module's state dict, as PyTorch's: ``state_dict``, ``load_state_dict``, their hooks and extra state.

``Module`` inherits ``StateDict``. ``state_dict()`` holds each module's parameters and persistent
buffers by dotted name, and its extra state under ``_extra_state`` where its class defines
``get_extra_state``; ``load_state_dict`` loads module by module, each from the entries under its
prefix (a copy per submodule, as PyTorch's), so that a load pre hook may rename or drop entries
(an old checkpoint's key made the new one) before its module reads them. Hooks, by PyTorch's
signatures:

- ``register_state_dict_pre_hook``: ``hook(module, prefix, keep_vars)`` before a module adds its entries;
- ``register_state_dict_post_hook``: ``hook(module, state_dict, prefix, local_metadata)`` after a module
  and its submodules added theirs, changing the dict in place (a value returned is an error);
- ``register_load_state_dict_pre_hook``: ``hook(module, state_dict, prefix, local_metadata, strict,
  missing_keys, unexpected_keys, error_msgs)`` before a module loads its entries;
- ``register_load_state_dict_post_hook``: ``hook(module, incompatible_keys)`` after a module and its
  submodules loaded, which may remove keys from the lists in place (a value returned is an error);
  ``strict`` errors come after the hooks.
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import kiln
from kiln.frontend.tensor import Tensor

from ..parameter import Parameter

if TYPE_CHECKING:
    from kiln.utils.hooks import RemovableHandle

__all__ = ["STATE_DICT_HOOK_TABLES", "StateDict"]

#: A module's state-dict hook tables (id -> hook), as PyTorch names them.
STATE_DICT_HOOK_TABLES = ("_state_dict_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks",
                          "_load_state_dict_post_hooks")  # fmt: skip
_EXTRA_STATE = "_extra_state"
_METADATA = {"version": 1}  # a module's ``local_metadata`` (PyTorch's ``Module._version``)
_IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])  # type: ignore[name-match]  # PyTorch's name


class StateDict:
    """``Module``'s state dict (see the module docstring)."""

    if TYPE_CHECKING:  # Module's
        _parameters: OrderedDict
        _buffers: OrderedDict
        _modules: OrderedDict
        _non_persistent_buffers_set: set

        def _add_hook(self, table: str, hook: Callable, prepend: bool) -> RemovableHandle: ...

    # ------------------------------------------------------------------ hooks
    def register_state_dict_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, prefix, keep_vars)`` runs before ``state_dict`` adds this module's entries."""
        return self._add_hook("_state_dict_pre_hooks", hook, False)

    def register_state_dict_post_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata)`` runs after this module and its submodules
        added their entries; it changes ``state_dict`` in place."""
        return self._add_hook("_state_dict_hooks", hook, False)

    def register_load_state_dict_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
        error_msgs)`` runs before this module loads its entries of ``state_dict``."""
        return self._add_hook("_load_state_dict_pre_hooks", hook, False)

    def register_load_state_dict_post_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, incompatible_keys)`` runs after this module and its submodules loaded; it may
        remove keys from ``incompatible_keys``' lists in place."""
        return self._add_hook("_load_state_dict_post_hooks", hook, False)

    # ------------------------------------------------------------------ extra state
    def get_extra_state(self) -> Any:
        """This module's state besides parameters and buffers, stored under ``_extra_state`` by
        ``state_dict`` when a class defines it (and ``set_extra_state`` to load it)."""
        raise RuntimeError(
            "Reached a code path in Module.get_extra_state() that should never be called: a module class that "
            "keeps extra state defines get_extra_state()"
        )

    def set_extra_state(self, state: Any) -> None:
        """Load what ``get_extra_state`` returned (a class that defines one defines this)."""
        raise RuntimeError(
            "Reached a code path in Module.set_extra_state() that should never be called: a module class that "
            "keeps extra state defines set_extra_state()"
        )

    def _state_owner(self) -> StateDict:
        """The module whose class says what extra state there is: this one (a ``CompiledModule``: the
        module it compiles)."""
        return self

    def _defines(self, name: str) -> bool:
        """Whether this module's class defines its own ``name`` (``get_extra_state``/``set_extra_state``)."""
        return getattr(type(self), name) is not getattr(StateDict, name)

    # ------------------------------------------------------------------ saving
    def state_dict(self, *, destination=None, prefix: str = "", keep_vars: bool = False) -> OrderedDict:
        """Parameters and persistent buffers by dotted name (detached unless ``keep_vars``)."""
        if destination is None:
            destination = OrderedDict()
        d = self.__dict__
        for hook in d["_state_dict_pre_hooks"].values():
            hook(self, prefix, keep_vars)
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()
        if self._state_owner()._defines("get_extra_state"):
            destination[prefix + _EXTRA_STATE] = self._state_owner().get_extra_state()
        for name, mod in self._modules.items():
            if mod is not None:
                mod.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        for hook in d["_state_dict_hooks"].values():
            if hook(self, destination, prefix, dict(_METADATA)) is not None:
                raise RuntimeError("state_dict post-hook must return None")
        return destination

    def _local_state(self) -> dict:
        state = {k: v for k, v in self._parameters.items() if v is not None}
        state.update(
            (k, v) for k, v in self._buffers.items() if v is not None and k not in self._non_persistent_buffers_set
        )
        return state

    # ------------------------------------------------------------------ loading
    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Copy values in by name; returns ``(missing_keys, unexpected_keys)``.

        Shape mismatches are always errors; with ``strict`` missing and unexpected keys are too.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict).__name__}.")
        missing: list[str] = []
        unexpected: list[str] = []
        errors: list[str] = []

        def load(module: StateDict, local: dict, prefix: str) -> None:
            for hook in module.__dict__["_load_state_dict_pre_hooks"].values():
                hook(module, local, prefix, dict(_METADATA), True, missing, unexpected, errors)
            module._load_local(local, prefix, assign, missing, unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    below = prefix + name + "."
                    load(child, {k: v for k, v in local.items() if k.startswith(below)}, below)
            keys = _IncompatibleKeys(missing, unexpected)  # (the hooks may change the lists in place)
            for hook in module.__dict__["_load_state_dict_post_hooks"].values():
                if hook(module, keys) is not None:
                    raise AssertionError(
                        "Hooks registered with ``register_load_state_dict_post_hook`` are not expected to return "
                        "new values, if incompatible_keys need to be modified, it should be done inplace."
                    )

        load(self, OrderedDict(state_dict), "")
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        return _IncompatibleKeys(missing, unexpected)

    def _load_local(self, local: dict, prefix: str, assign: bool, missing: list, unexpected: list,
                    errors: list) -> None:  # fmt: skip
        """Load this module's own entries of ``local`` (those under ``prefix``), noting what is missing,
        unexpected or wrong."""
        own = self._local_state()
        for name, target in own.items():
            key = prefix + name
            if key not in local:
                missing.append(key)
                continue
            value = local[key]
            if not isinstance(value, Tensor):
                errors.append(
                    f'While copying the parameter named "{key}", expected kiln.Tensor or Tensor-like object '
                    f"from checkpoint but received {type(value).__name__}"
                )
            elif tuple(value.shape) != tuple(target.shape):
                errors.append(
                    f"size mismatch for {key}: copying a param with shape {kiln.Size(value.shape)} from checkpoint, "
                    f"the shape in current model is {kiln.Size(target.shape)}."
                )
            else:
                _load_one(self, name, target, value, assign)
        extra = prefix + _EXTRA_STATE
        if self._state_owner()._defines("set_extra_state"):
            if extra in local:
                self._state_owner().set_extra_state(local[extra])
            else:
                missing.append(extra)
        elif extra in local:
            unexpected.append(extra)
        for key in local:
            if key.startswith(prefix) and key != extra:
                first, *rest = key[len(prefix) :].split(".", 1)
                if (first not in self._modules) if rest else (first not in own):
                    unexpected.append(key)


def _load_one(mod, name: str, target: Tensor, value: Tensor, assign: bool) -> None:
    if assign:
        if isinstance(target, Parameter):
            value = Parameter(value, target.requires_grad)
        setattr(mod, name, value)
        return
    with kiln.no_grad():
        target.copy_(value.to(device=target.device))
