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

from ...ir.graph import SourceLocation
from ..tensor import Tensor

#: References to an array that ``made_in_call`` holds itself (its list of candidates, its local
#: ``array`` and ``getrefcount``'s argument), subtracted from ``sys.getrefcount``.
_OWN_REFERENCES = 3


def made_in_call(trace, shadows: dict) -> tuple[str, SourceLocation | None] | None:
    """(reason, where) for the first array this trace shadowed that no one outside kiln holds now:
    its only holders are the shadow entry, tensors on its memory and the trace's memory index.

    ``shadows`` is the compiled function's ``numpy_shadows``; an array found made in the call is
    dropped from it (its shadow would keep a dead array alive for nothing). One scan of the heap
    (``gc.get_referrers``) serves every array: about 3 ms per 40,000 objects the collector tracks.
    A view of an array (its ``.base``) is no object the collector sees, so references are counted
    too: any reference unaccounted for is someone else's, and the array is kept."""
    found = [(shadows[key], where) for key, where in trace.new_arrays if key in shadows]
    arrays = [entry[0] for entry, _ in found if entry[0].base is None]  # a view: its base may be the caller's
    if not arrays:
        return None
    index = {id(a): i for i, a in enumerate(arrays)}
    kiln_pairs = trace._roots.held_pairs() | {id(entry) for entry, _ in found}
    kiln_holds, others = [0] * len(arrays), set()
    for holder in gc.get_referrers(*arrays):
        if holder is arrays:
            continue
        ours = id(holder) in kiln_pairs or isinstance(holder, Tensor)
        for held in gc.get_referents(holder):
            i = index.get(id(held))
            if i is not None and ours and (not isinstance(holder, Tensor) or holder._data is held):
                kiln_holds[i] += 1
            elif i is not None:
                others.add(i)
    holder = held = None  # (the loop's last values would count as references)
    for i in range(len(arrays)):  # (not enumerate: its cached pair would be one more reference)
        array = arrays[i]
        if i in others or sys.getrefcount(array) - _OWN_REFERENCES != kiln_holds[i]:
            continue
        entry, where = next((e, w) for e, w in found if e[0] is array)
        del shadows[id(array)]
        reason = (f"a tensor made from a numpy array of {array.dtype}{list(array.shape)} that the call computed "
                  "with numpy: numpy is not traced, so a compiled call would read this call's values again; "
                  "make the tensor outside the compiled function and pass it as an argument")  # fmt: skip
        return reason, where
    return None
