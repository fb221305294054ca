"""Which of a traced call's tensors eager autograd checks for in-place changes at backward time.

Eager autograd saves tensors with the versions they had and raises if one changed in place before
the backward reads it (``autograd/saved.py``). A compiled call's backward must raise exactly where
that would: for every tensor the user can still reach and change (an argument, a captured tensor,
a view of either, a result) that eager's nodes saved -- and for no other, since a check eager does
not make is an error where eager gives a gradient.

Which nodes save what is each node's own business (primitives check only the inputs their VJP
reads, a convolution checks tensors it read only copies of, fused nodes check all theirs), so the
answer is found by running the traced call's own eager backward (``build._trace_backward``) with
the version counters of those tensors watched: every check compares a counter's value with the
saved version by ``!=``, and a watched value records that comparison. Other comparisons of versions
(the tracer's bindings, whether a view's history is current) use ``==``: a ``!=`` among them would
make a check eager does not make (``test_compile_saved_checks`` has a case that finds it).

>>> import kiln
>>> x, w = kiln.ones(3), kiln.ones(3, requires_grad=True)
>>> y = (x * w).sum()
>>> with watched_versions([x, w]) as checked:
...     y.backward()
>>> sorted(checked) == [id(x._version)]  # w's gradient reads x; no gradient reads w
True
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["watched_versions"]


class _WatchedVersion(int):
    """A version counter's value that records, in ``sink[0]``, each comparison by ``!=`` (a version
    check). ``==`` is left alone: the tracer compares versions that way to bind values, which is no
    check. An in-place change while watched makes a plain int again (``+= 1``). A copy kept after the
    block (a binding the tracer made meanwhile) records into a set no one reads."""

    key: int  # the id of the counter
    sink: list[set[int]]  # where the comparison is recorded while the block runs

    def __new__(cls, value: int, key: int, sink: list[set[int]]) -> _WatchedVersion:
        watched = super().__new__(cls, value)
        watched.key, watched.sink = key, sink
        return watched

    def __ne__(self, other: object) -> bool:
        self.sink[0].add(self.key)
        return int(self) != other

    __hash__ = int.__hash__


@contextmanager
def watched_versions(tensors) -> Iterator[set[int]]:
    """A set that fills, while the block runs, with the ids of the version counters (``t._version``,
    shared by a tensor and its views) of ``tensors`` that a version check compared."""
    checked: set[int] = set()
    sink = [checked]
    counters = {id(t._version): t._version for t in tensors}
    for key, counter in counters.items():
        counter[0] = _WatchedVersion(counter[0], key, sink)
    try:
        yield checked
    finally:
        sink[0] = set()
        for counter in counters.values():
            counter[0] = int(counter[0])
