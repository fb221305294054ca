"""``kiln.utils.hooks``: PyTorch's ``torch.utils.hooks`` path to the handle a hook registration returns.

A ``RemovableHandle`` keys its hook in an ordered table by the handle's id (modules' forward and
backward hooks, optimizers' step and state-dict hooks); ``remove()`` takes it out again.

>>> from collections import OrderedDict
>>> hooks = OrderedDict()
>>> handle = RemovableHandle(hooks)
>>> hooks[handle.id] = print
>>> handle.remove(); len(hooks)
0
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

__all__ = ["RemovableHandle", "add_hook", "replaced_arguments"]


class RemovableHandle:
    """Returned by ``register_*_hook``; ``remove()`` unregisters the hook."""

    _next_id = 0

    def __init__(self, hooks: dict, *flags: dict) -> None:
        self._hooks = hooks
        self._flags = flags  # the tables that mark the hook (``with_kwargs``...), cleared with it
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self) -> None:
        for table in (self._hooks, *self._flags):
            table.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def add_hook(table: OrderedDict, hook: Callable, prepend: bool = False) -> RemovableHandle:
    """Register ``hook`` in ``table`` (first with ``prepend``): its handle."""
    handle = RemovableHandle(table)
    table[handle.id] = hook
    if prepend:
        table.move_to_end(handle.id, last=False)
    return handle


def replaced_arguments(result, args: tuple, kwargs: dict, what: str) -> tuple[tuple, dict]:
    """The ``(args, kwargs)`` a pre hook's ``result`` leaves: the same for None, else the pair it returned
    (a RuntimeError naming ``what`` for anything else, as PyTorch's)."""
    if result is None:
        return args, kwargs
    if not (isinstance(result, tuple) and len(result) == 2):
        raise RuntimeError(f"{what} must return None or a tuple of (new_args, new_kwargs), but got {result}.")
    return result
