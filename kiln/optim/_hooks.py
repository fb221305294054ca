"""Optimizer hooks, as PyTorch's: step pre/post hooks (per optimizer, and global ones for every
optimizer), state-dict and load-state-dict pre/post hooks.

A step's pre hooks (the global ones, then the optimizer's) run before it with ``(optimizer, args,
kwargs)`` -- ``args`` holding the optimizer itself first -- and may return ``(new_args,
new_kwargs)``; its post hooks (the optimizer's, then the global ones) after it. ``with_step_hooks``
wraps ``Optimizer.step`` and every subclass's own ``step`` (``Optimizer.__init_subclass__``).

Under ``kiln.compile`` a hook runs while the step is traced, so its tensor operations are part of
the program, and the hooks a traced step ran are a guard of it (``hook_tables``): a hook registered
or removed later makes the next call trace again.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kiln.utils.hooks import RemovableHandle, add_hook, replaced_arguments

__all__ = ["OptimizerPostHook", "OptimizerPreHook", "register_optimizer_step_post_hook",
           "register_optimizer_step_pre_hook"]  # fmt: skip

#: ``hook(optimizer, args, kwargs) -> None | (new_args, new_kwargs)``
OptimizerPreHook = Callable[[Any, tuple, dict], tuple | None]
#: ``hook(optimizer, args, kwargs) -> None``
OptimizerPostHook = Callable[[Any, tuple, dict], None]

_global_optimizer_pre_hooks: OrderedDict = OrderedDict()
_global_optimizer_post_hooks: OrderedDict = OrderedDict()

#: An optimizer's own hook tables (id -> hook), as PyTorch names them.
TABLES = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
          "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
          "_optimizer_load_state_dict_post_hooks")  # fmt: skip


def register_optimizer_step_pre_hook(hook: OptimizerPreHook) -> RemovableHandle:
    """Register a pre hook of every optimizer's step: ``hook(optimizer, args, kwargs)``, which may return
    ``(new_args, new_kwargs)``."""
    return add_hook(_global_optimizer_pre_hooks, hook)


def register_optimizer_step_post_hook(hook: OptimizerPostHook) -> RemovableHandle:
    """Register a post hook of every optimizer's step: ``hook(optimizer, args, kwargs)``."""
    return add_hook(_global_optimizer_post_hooks, hook)


def new_tables(optimizer) -> None:
    """Give ``optimizer`` its hook tables where it lacks them (a new one, one unpickled)."""
    for table in TABLES:
        if table not in optimizer.__dict__:
            setattr(optimizer, table, OrderedDict())


def hook_tables(optimizer) -> tuple:
    """The step hooks that run at ``optimizer``'s step, in order (compared by identity): a traced
    step's guard."""
    return (tuple(_global_optimizer_pre_hooks.values()), tuple(optimizer._optimizer_step_pre_hooks.values()),
            tuple(optimizer._optimizer_step_post_hooks.values()), tuple(_global_optimizer_post_hooks.values()))  # fmt: skip


def with_step_hooks(step: Callable) -> Callable:
    """``step`` running the step hooks around it."""
    if getattr(step, "runs_step_hooks", False):
        return step

    @functools.wraps(step)
    def stepped(*args, **kwargs):
        optimizer = args[0]
        own_pre, own_post = optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks
        if not (own_pre or own_post or _global_optimizer_pre_hooks or _global_optimizer_post_hooks):
            return step(*args, **kwargs)
        for hook in (*_global_optimizer_pre_hooks.values(), *own_pre.values()):
            args, kwargs = replaced_arguments(hook(optimizer, args, kwargs), args, kwargs, str(step))
        out = step(*args, **kwargs)
        for hook in (*own_post.values(), *_global_optimizer_post_hooks.values()):
            hook(optimizer, args, kwargs)
        return out

    stepped.runs_step_hooks = True  # type: ignore[attr-defined]
    return stepped
