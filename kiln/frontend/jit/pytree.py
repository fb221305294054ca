"""Nested arguments and results: flatten tuples, lists and dicts into leaves and a hashable structure.

>>> leaves, tree = flatten(({"a": 1, "b": [2, 3]}, 4))
>>> leaves
[1, 2, 3, 4]
>>> unflatten(tree, [10, 20, 30, 40])
({'a': 10, 'b': [20, 30]}, 40)
"""

from __future__ import annotations

from typing import Any

LEAF = None  # the structure of a leaf


def flatten(obj: Any) -> tuple[list, Any]:
    leaves: list = []
    return leaves, _flatten(obj, leaves)


def _flatten(obj: Any, leaves: list) -> Any:
    kind = type(obj)
    if kind is tuple or kind is list:
        return (kind, tuple(_flatten(x, leaves) for x in obj))
    if kind is dict:
        keys = tuple(obj)
        return (dict, keys, tuple(_flatten(obj[k], leaves) for k in keys))
    if isinstance(obj, tuple) and hasattr(kind, "_fields"):  # a namedtuple keeps its type
        return (kind, tuple(_flatten(x, leaves) for x in obj))
    leaves.append(obj)
    return LEAF


_FLAT_CALLS: dict[int, Any] = {}


def flatten_call(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """``flatten((args, kwargs))``, with a shortcut for the common call of plain positional leaves
    (a compiled function's per-call cost)."""
    if not kwargs:
        for arg in args:
            if isinstance(arg, tuple | list | dict):
                break
        else:
            tree = _FLAT_CALLS.get(len(args))
            if tree is None:
                tree = _FLAT_CALLS[len(args)] = flatten((args, kwargs))[1]
            return list(args), tree
    return flatten((args, kwargs))


def unflatten(tree: Any, leaves: list) -> Any:
    if tree is LEAF:  # one tensor returned (a compiled call's usual result)
        return leaves[0]
    it = iter(leaves)
    return _build(tree, it)


def _build(tree: Any, it) -> Any:
    if tree is LEAF:
        return next(it)
    kind = tree[0]
    if kind is dict:
        return {k: _build(sub, it) for k, sub in zip(tree[1], tree[2], strict=True)}
    items = [_build(sub, it) for sub in tree[1]]
    if kind is list:
        return items
    if kind is tuple:
        return tuple(items)
    return kind(*items)
