"""View steps of static attributes as one numpy call on their input (``extern_call.ExternCall``)."""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter, methodcaller
from typing import Any

from ..ir.graph import Node


def direct_view(node: Node) -> Callable[[Any], Any] | None:
    """A slice, reshape or permute of static attributes as one numpy call on its input array: the eager
    kernel's work without its call (a loop's trip makes a dozen such views of new arrays), or None."""
    a, shape = node.attrs, node.inputs[0].type.shape if len(node.inputs) == 1 else ()
    if not shape:  # (indexing a 0-d array gives a numpy scalar)
        return None
    if node.op == "slice" and all(isinstance(n, int) for n in (*a["starts"], *a["stops"], *a["steps"])):
        return itemgetter(tuple(map(slice, a["starts"], a["stops"], a["steps"])))
    if node.op == "reshape" and all(isinstance(n, int) for n in a["shape"]):
        return methodcaller("reshape", tuple(a["shape"]))
    if node.op == "permute":
        return methodcaller("transpose", tuple(a["perm"]))
    return None
