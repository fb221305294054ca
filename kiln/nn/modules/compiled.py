"""``kiln.compile(module)``: a module whose calls are compiled, and which is otherwise the module.

The wrapper shares the original's parameter, buffer, submodule and hook tables, so parameters,
``state_dict``/``load_state_dict``, ``to``, ``train``/``eval`` and hooks act on the same
objects; other attributes are read from the original module.
"""

from __future__ import annotations

from kiln.frontend.jit.call_cache import CompiledFunction

from .module import HOOK_TABLES, Module

_SHARED = ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules", *HOOK_TABLES)


class CompiledModule(Module):
    def __init__(self, module: Module, **options) -> None:
        d = self.__dict__
        d["_orig_mod"] = module
        for name in _SHARED:
            d[name] = module.__dict__[name]
        # the module's uncompiled call (``Module.__call__`` runs what ``module.compile()`` made, if it did;
        # a class's own ``__call__`` is the user's)
        call = module._call_impl if type(module).__call__ is Module.__call__ else module
        d["_compiled"] = CompiledFunction(call, guard_code=type(module).forward, name=type(module).__name__, **options)

    def _state_owner(self) -> Module:
        return self._orig_mod  # (its extra state, ``module_state.py``)

    @property
    def training(self) -> bool:  # type: ignore[override]
        return self._orig_mod.training

    def train(self, mode: bool = True) -> CompiledModule:
        self._orig_mod.train(mode)
        return self

    def forward(self, *args, **kwargs):
        return self._orig_mod.forward(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self._compiled(*args, **kwargs)

    @property
    def graph(self):
        """The IR of the most recent specialization."""
        return self._compiled.graph

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_orig_mod"], name)

    def __repr__(self) -> str:
        return repr(self._orig_mod)
