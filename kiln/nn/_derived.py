"""Values derived from a module's parameters, recorded once per traced call rather than once per use.

A module called in a Python loop (a cell or a Linear head over T time steps) is traced T times: what
it derives from its parameters alone -- a cell's summed biases, a weight's transpose -- would be T
nodes of the trace and T gradient nodes, each printed into the cache key and rolled into the loop.
``derived`` records it once per trace; its gradients are then summed over the uses by autograd
before they reach the parameter, in one node.
"""

from __future__ import annotations

import kiln
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
    key = (*kind, *[id(t) for t in sources[1:]], sources[0].dtype, sources[0].device)
    # (whether a source requires grad too: one made before ``w.requires_grad_()`` has no history)
    stamp = (kiln.is_grad_enabled(), *[None if t is None else (t._version[0], t._requires_grad) for t in sources[1:]])
    found = trace.derived.get(key)
    if found is not None and found[0] == stamp and all(a is b for a, b in zip(found[1], sources[1:], strict=True)):
        return found[2]
    made = make()
    trace.derived[key] = (stamp, sources[1:], made)  # the sources kept: their ids stay theirs
    return made
