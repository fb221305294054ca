"""The base of every backward node, and the handles that remove hooks from one."""

from __future__ import annotations

import itertools
import traceback

from . import grad_mode
from .grad_mode import state

_next_seq = itertools.count().__next__  # a bound method: cheaper than next(counter)
Edge = tuple["Node", int] | None


class Node:
    """A backward function in the graph. ``apply(grads) -> grads``, one per next edge."""

    __slots__ = ("next_edges", "seq", "pre_hooks", "hooks", "forward_stack", "__weakref__")
    num_outputs = 1
    #: Whether ``apply`` runs kiln's code only, never a callable from the user (its hooks run apart):
    #: a traced call's hazard watch is paused around it (``jit.state.unwatched``).
    kiln_only = False

    def __init__(self, next_edges: tuple[Edge, ...]) -> None:
        self.next_edges = next_edges
        self.seq = _next_seq()  # later nodes run first when several are ready
        self.pre_hooks: dict[int, list] | None = None  # output_nr -> hooks on that gradient
        self.hooks: list | None = None
        # anomaly mode: the stack at the forward op (less Node's and its subclass's __init__ and their caller)
        self.forward_stack = _forward_stack(3) if grad_mode.anomaly_used and state.anomaly else None

    def name(self) -> str:
        return type(self).__name__

    @property
    def next_functions(self) -> tuple[tuple[Node | None, int], ...]:
        """PyTorch's view of the edges: per input of the forward op, the node its gradient goes to
        and which of that node's outputs it is, ``(None, 0)`` for an input that needs no gradient
        (a leaf's node is its ``AccumulateGrad``, whose ``variable`` is the leaf)."""
        return tuple(edge if edge is not None else (None, 0) for edge in self.next_edges)

    def apply(self, grads: list) -> tuple:
        raise NotImplementedError

    def release(self) -> None:
        """Drop what was saved for backward (after a backward without retain_graph)."""

    def register_hook(self, fn) -> RemovableHandle:
        """``fn(grad_inputs, grad_outputs)`` runs after this node; it may return new grad_inputs."""
        if self.hooks is None:
            self.hooks = []
        return RemovableHandle(self.hooks, fn)

    def register_prehook(self, fn, output_nr: int = 0) -> RemovableHandle:
        if self.pre_hooks is None:
            self.pre_hooks = {}
        return RemovableHandle(self.pre_hooks.setdefault(output_nr, []), fn)

    def __repr__(self) -> str:
        return f"<{self.name()} object>"


def _forward_stack(frames_of_kiln: int) -> list[str]:
    """The stack at the forward op that makes a node, less the last ``frames_of_kiln`` frames below
    this call (the node's construction): anomaly mode names it if the node's backward fails."""
    return traceback.format_stack()[: -1 - frames_of_kiln]


class RemovableHandle:
    """A registered tensor or node hook; ``remove()`` unregisters it. ``changes`` counts every
    registration and removal: a compiled call compares its captured tensors' hooks with those they
    were traced with only when it moved (``jit/specialization.py``)."""

    __slots__ = ("_hooks", "_fn")
    changes = 0

    def __init__(self, hooks: list, fn) -> None:
        self._hooks = hooks
        self._fn = fn
        hooks.append(fn)
        RemovableHandle.changes += 1

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)
            RemovableHandle.changes += 1

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def hook_state(t) -> tuple:
    """A tensor's hooks as a compiled call's guards compare them: (gradient hooks, post-accumulate hooks)."""
    return (tuple(t._hooks or ()), tuple(t._post_accumulate_hooks or ()))
