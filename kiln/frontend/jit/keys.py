"""A compiled call's key (``call_cache``'s step 1): the arguments' structure, each tensor's shape,
strides, dtype, device, requires_grad and whether ``.grad`` is set, which arguments share memory,
plain arguments by type and value (other objects by identity), the grad mode, the default dtype
and autocast; and, for ``kiln.explain``, what changed between two keys."""

from __future__ import annotations

from typing import Any

from ...ir import dtypes as _dtypes
from ..autocast import key as _autocast_key
from ..autograd.grad_mode import state as grad_state
from ..tensor import Tensor
from .dynamic import SizeClass
from .layouts import MemoryIndex

_PLAIN = (int, float, bool, str, bytes, complex, type(None))


def call_key(tree, leaves: list, dynamic: frozenset[int] | None = None) -> tuple:
    """The key of a call (see the module docstring). ``dynamic``: the leaf positions whose leading
    size is dynamic (``dynamic.py``): a size >= 2 there is keyed by which of the call's distinct
    dynamic sizes it is, so one key serves every size."""
    roots: dict[int, int] = {}
    classes: dict[int, SizeClass] = {}
    # Arguments sharing memory with no root in common (from_numpy of one array): compared from the
    # second tensor argument on (a call with one, the usual compiled step's input, pays nothing).
    memory: MemoryIndex | None = None
    first: tuple | None = None
    parts: list[tuple] = []  # entries of several shapes: a tensor's, a Python value's, an object's
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, Tensor):
            data = leaf._data
            root = leaf._base if leaf._base is not None else leaf
            alias: Any = roots.setdefault(id(root), i)
            overlapped: tuple = ()
            if memory is not None:
                overlapped = memory.share(data, alias)
            elif first is None:
                first = (data, alias)
            else:
                memory = MemoryIndex()
                memory.share(*first)
                overlapped = memory.share(data, alias)
            if overlapped:  # explain() shows the one argument it shares memory with, or all of them
                alias = overlapped[0] if alias == i and len(overlapped) == 1 else (alias, *overlapped)
            shape = data.shape
            if dynamic is not None and i in dynamic and shape and shape[0] >= 2:
                size = classes.get(shape[0])
                if size is None:
                    size = classes[shape[0]] = SizeClass(len(classes))
                shape = (size, *shape[1:])
            parts.append(
                ("tensor", shape, data.strides, leaf._dtype, leaf._device, leaf._requires_grad,
                 leaf._grad is not None, alias)
            )  # fmt: skip
        elif type(leaf) is float:
            parts.append((float, leaf.hex()))  # -0.0 and nan are values of their own
        elif isinstance(leaf, _PLAIN):
            parts.append((type(leaf), leaf))
        else:
            try:
                hash(leaf)
                parts.append(("object", type(leaf), id(leaf), leaf if _hashable_by_value(leaf) else None))
            except TypeError:
                parts.append(("object", type(leaf), id(leaf), None))
    # Global modes that change what ops produce are part of the key (the default dtype, autocast regions).
    return (tree, tuple(parts), grad_state.grad_enabled, _dtypes._default_dtype, _autocast_key())


def _autocast_text(regions) -> str:
    return "off" if regions is None else ", ".join(f"{device} {dtype.name}" for device, dtype in regions)


def _hashable_by_value(leaf) -> bool:
    from ...ir.dtypes import DType  # noqa: PLC0415
    from ...ir.types import Device  # noqa: PLC0415

    return isinstance(leaf, DType | Device)


def describe_key_change(old: tuple, new: tuple) -> str:
    """Which guard of the key changed, in words: the reason for a retrace."""
    if old[2] != new[2]:
        return f"grad mode changed from {old[2]} to {new[2]}"
    if old[3] != new[3]:
        return f"the default dtype changed from {old[3].name} to {new[3].name}"
    if old[4] != new[4]:
        return f"autocast changed from {_autocast_text(old[4])} to {_autocast_text(new[4])}"
    if old[0] != new[0]:
        return "the structure of the arguments changed"
    names = ("shape", "strides", "dtype", "device", "requires_grad", ".grad is set", "memory shared with argument")
    for i, (a, b) in enumerate(zip(old[1], new[1], strict=True)):
        if a == b:
            continue
        if a[0] == "tensor" and b[0] == "tensor":
            changes = [f"{n} {x} -> {y}" for n, x, y in zip(names, a[1:], b[1:], strict=True) if x != y]
            return f"argument {i}: " + ", ".join(changes)
        if a[0] == "object" or b[0] == "object":
            return f"argument {i}: a different object"
        return f"argument {i}: {a[1]!r} -> {b[1]!r}" if a[0] is b[0] else f"argument {i}: type changed"
    return "the arguments changed"
