"""Numpy arrays that a traced call made itself, and why a program cannot read them.

``Trace.on_numpy`` binds a tensor made from a numpy array (``from_numpy``, ``tensor``,
``as_tensor``) to a graph input that reads the array's memory at each call: right for an array
that lives on between calls (a buffer the caller refills in place), and silently wrong for one
the call itself computed with numpy (nanoGPT's ``get_batch`` slices a memmap at random indices
and converts the slices with ``astype``): numpy's work is not traced, so every compiled call
would read the first call's batch again. Such an array is recognised after the traced call
returns: nothing but kiln holds it any more (nor any view of it), so no later call could see
a change to it. The call then stops compiling, with that reason.
"""

from __future__ import annotations

import gc
import sys

from ..tensor import Tensor

#: References to the array that ``_held_by_kiln_only`` holds itself (its local ``array`` and
#: ``getrefcount``'s argument), subtracted from ``sys.getrefcount``.
_OWN_REFERENCES = 2


def made_in_call(trace, shadows: dict) -> tuple[str, object] | None:
    """(reason, where) for the first array this trace shadowed that no one outside kiln holds now.

    ``shadows`` is the compiled function's ``numpy_shadows``; an array found made in the call is
    dropped from it (its shadow would keep a dead array alive for nothing)."""
    indexed = trace._roots.held_pairs()
    for key, where in trace.new_arrays:
        entry = shadows.get(key)
        if entry is None or not _held_by_kiln_only(entry, indexed):
            continue
        array = entry[0]
        del shadows[key]
        reason = (f"a tensor made from a numpy array of {array.dtype}{list(array.shape)} that the call computed "
                  "with numpy: numpy is not traced, so a compiled call would read this call's values again; "
                  "make the tensor outside the compiled function and pass it as an argument")  # fmt: skip
        return reason, where
    return None


def _held_by_kiln_only(entry: tuple, indexed: set[int]) -> bool:
    """Whether the only holders of ``entry``'s array are kiln's: the entry, tensors on the array's
    memory, the trace's memory index (``indexed``: ids of its pairs).

    A view of the array (its ``.base``) is no object the garbage collector sees, so references are
    counted as well: any reference unaccounted for is someone else's, and the array is kept."""
    array = entry[0]
    if array.base is not None:
        return False  # a view: its base may well be the caller's buffer, refilled between calls
    holders = 0
    for holder in gc.get_referrers(array):
        if holder is entry or id(holder) in indexed or (isinstance(holder, Tensor) and holder._data is array):
            holders += 1
        else:
            return False
    return sys.getrefcount(array) - _OWN_REFERENCES == holders
