"""Values derived from a module's parameters, recorded once per traced call rather than once per use.

A module called in a Python loop (a cell or a Linear head over T time steps) is traced T times: what
it derives from its parameters alone -- a cell's summed biases, a weight's transpose -- would be T
nodes of the trace and T gradient nodes, each printed into the cache key and rolled into the loop.
``derived`` records it once per trace; its gradients are then summed over the uses by autograd
before they reach the parameter, in one node.
"""

from __future__ import annotations

from kiln.frontend.autograd.grad_mode import state as _grad
from kiln.frontend.jit import state as _jit

__all__ = ["derived"]


def derived(kind: tuple, sources: tuple, make):
    """``make()`` -- or, within one trace, what it made for the same ``sources`` at the same
    versions, requiring grad or not alike, in the same grad mode. ``sources[0]`` only tells the
    device and dtype apart (its version is not part of the key); the others are the tensors (or
    None) ``make`` reads."""
    trace = _jit.current.get() if _jit.tracing else None
    if trace is None:
        return make()
    rest = sources[1:]
    key = (*kind, *map(id, rest), sources[0].dtype, sources[0].device)
    # (whether a source requires grad too: one made before ``w.requires_grad_()`` has no history)
    stamp = (_grad.grad_enabled, *[None if t is None else (t._version[0], t._requires_grad) for t in rest])
    found = trace.derived.get(key)
    # The key's ids are the sources' own: the entry keeps its sources alive, so no other tensor has
    # their ids while it is there (one lookup, no comparison of the sources one by one).
    if found is not None and found[0] == stamp:
        return found[2]
    made = make()
    trace.derived[key] = (stamp, rest, made)
    return made
