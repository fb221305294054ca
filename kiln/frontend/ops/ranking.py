"""The order that sorts a vector, as ops of the graph: what ``randperm`` needs inside compiled code.

The IR has no sort primitive. ``stable_order(keys)`` counts, for each key, the keys before it in
a stable sort (those smaller, and equal ones at smaller positions): that count is the key's place,
and scattering the positions to their places gives ``argsort(keys, kind="stable")`` exactly. It
takes ``n * n`` comparisons (fused into one reduction), so callers use it for small ``n`` only.

>>> import kiln
>>> stable_order(kiln.tensor([30, 10, 20, 10])).tolist()
[1, 3, 2, 0]
"""

from __future__ import annotations

from ...ir import dtypes as dt
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor
from .creation import arange, zeros
from .elementwise import eq, logical_and, logical_or, lt

__all__ = ["stable_order", "TRACED_RANDPERM_LIMIT"]

#: The largest ``randperm`` a compiled call computes with ``stable_order`` (16M comparisons at the
#: limit: 2.3 ms compiled against 0.4 ms for numpy's sort eagerly); a larger one stops the trace.
TRACED_RANDPERM_LIMIT = 4096


def stable_order(keys: Tensor) -> Tensor:
    """int64 positions that sort the 1-D ``keys`` in ascending order, ties in their order (stable)."""
    if keys.ndim != 1:
        raise ValueError(f"stable_order: expected a 1-D tensor of keys, got shape {tuple(keys.shape)}")
    n = keys.shape[0]
    with no_grad():
        position = arange(n, device=keys.device)
        mine, other = keys.reshape(n, 1), keys.reshape(1, n)  # row i compares key i with every key j
        earlier = lt(position.reshape(1, n), position.reshape(n, 1))
        before = logical_or(lt(other, mine), logical_and(eq(other, mine), earlier))
        place = before.sum(1)
        return zeros(n, dtype=dt.int64, device=keys.device).scatter(0, place, position)
