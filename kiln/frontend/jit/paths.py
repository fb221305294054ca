"""The paths from what a compiled function names to the tensors and tables it reaches, walked plainly.

``reads.reach`` finds the Python state a traced call reaches, with paths in the user's words; the
guards also need a coarser walk, through every dict, list, tuple and object attribute table, to find
the tensors reachable from the function's globals, closure and arguments (``reachable_tensors``: which
captured tensors a program may alias) and the containers on the way to each (``guards._holders``).
"""

from __future__ import annotations

import types

import numpy as np

from ..tensor import Tensor
from .reads import _is_module_dict
from .snapshots import _SCALARS


def _attrs(obj) -> dict:
    try:
        d = vars(obj)
    except TypeError:
        return {}
    return d if isinstance(d, dict) else {}


def _walk(roots: list, depth: int = 5, limit: int = 20000):
    """``(container, its values)`` for the dicts, lists, tuples and objects reachable from ``roots``
    (the objects, globals and closure values the function names) through dicts, lists, tuples and
    instance attributes, ``depth`` levels down -- the paths by which the function reaches state."""
    seen: set[int] = set()
    level = list(roots)
    for _ in range(depth):
        following: list = []
        for obj in level:
            if id(obj) in seen or isinstance(obj, (Tensor, *_SCALARS)) or len(seen) > limit:
                continue
            seen.add(id(obj))
            if isinstance(obj, dict):
                if _is_module_dict(obj):
                    continue  # a module's globals: the names the function reads are guarded one by one
                values = list(obj.values())
            elif isinstance(obj, list | tuple):
                values = list(obj)
            elif isinstance(obj, types.ModuleType | types.FunctionType | type | np.ndarray):
                continue
            else:
                values = list(_attrs(obj).values())
            yield obj, values
            following.extend(v for v in values if not isinstance(v, Tensor))
        level = following


def reachable_tensors(roots: list) -> dict[int, Tensor]:
    """The memory owners (by id) of the tensors reachable from ``roots`` (see ``_walk``)."""
    found = {}
    for t in [r for r in roots if isinstance(r, Tensor)] + [
        v for _, values in _walk(roots) for v in values if isinstance(v, Tensor)
    ]:
        root = t._base if t._base is not None else t
        found[id(root)] = root
    return found
