"""A compiled call's key (``call_cache``'s step 1): the arguments' structure, each tensor's shape,
strides, dtype, device, requires_grad, whether ``.grad`` is set and its hooks, which arguments share memory,
plain arguments by type and value (other objects by identity), the grad mode, the default dtype
and autocast; and, for ``kiln.explain``, what changed between two keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...ir import dtypes as _dtypes
from ...ir.types import Device
from ..autocast import key as _autocast_key
from ..autograd.grad_mode import state as grad_state
from ..tensor import Tensor
from .dynamic import C_ORDER, SizeClass
from .layouts import MemoryIndex
from .scalar_args import ANY
from .watched_sizes import SizeGuard

_PLAIN = (int, float, bool, str, bytes, complex, type(None))
_BY_VALUE = (_dtypes.DType, Device)  # other objects keyed by value (others by identity)


def call_key(tree, leaves: list, dynamic: Mapping[int, tuple[int, ...]] | None = None,
             floats: frozenset[int] = frozenset()) -> tuple:  # fmt: skip
    """The key of a call (see the module docstring). ``dynamic``: the dynamic dimensions of each leaf
    position that has some (``dynamic.py``): a size >= 2 there is keyed by which of the call's
    distinct dynamic sizes it is, and C-order strides as ``C_ORDER``, so one key serves every size.
    ``floats``: the leaf positions whose float is an input of the program at any value
    (``scalar_args.py``): keyed as ``ANY`` there."""
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
            shape, strides = data.shape, data.strides
            if dynamic is not None and i in dynamic:
                shape, strides = _dynamic_shape(shape, strides, dynamic[i], classes, data.flags.c_contiguous)
            # how many hooks it has: a backward inside the call runs them as traced (then
            # ``Specialization.arg_hooks`` holds them by identity); one outside runs each call's own
            hooks = _hook_counts(leaf) if leaf._hooks or leaf._post_accumulate_hooks else None
            parts.append(
                ("tensor", shape, strides, leaf._dtype, leaf._device, leaf._requires_grad, leaf._grad is not None,
                 alias, hooks)
            )  # fmt: skip
        elif type(leaf) is float:  # -0.0 and nan are values of their own
            parts.append((float, ANY if i in floats else leaf.hex()))
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


def _dynamic_shape(shape: tuple, strides: tuple, dims: tuple[int, ...], classes: dict, c_order: bool):
    """A tensor's shape and strides in a dynamic key: each size >= 2 of ``dims`` as its ``SizeClass``
    (``classes``: the call's sizes met so far), strides as ``C_ORDER`` when they are."""
    sizes = list(shape)
    for d in dims:
        n = shape[d] if d < len(shape) else 0
        if n >= 2:
            size = classes.get(n)
            if size is None:
                size = classes[n] = SizeClass(len(classes))
            sizes[d] = size
    return tuple(sizes), (C_ORDER if c_order else strides)


def _autocast_text(regions) -> str:
    return "off" if regions is None else ", ".join(f"{device} {dtype}" for device, dtype in regions)


def _hashable_by_value(leaf) -> bool:
    return isinstance(leaf, _BY_VALUE)


def changed_ints(old: tuple, new: tuple) -> list[int]:
    """The leaf positions of the int arguments whose values differ between two keys of one structure:
    each value is a key of its own (a bool's too, which this leaves out)."""
    if old[0] != new[0]:
        return []
    return [i for i, (a, b) in enumerate(zip(old[1], new[1], strict=True)) if a != b and a[0] is int and b[0] is int]


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
    names = (
        "shape",
        "strides",
        "dtype",
        "device",
        "requires_grad",
        ".grad is set",
        "memory shared with argument",
        "hooks",
    )
    for i, (a, b) in enumerate(zip(old[1], new[1], strict=True)):
        if a == b:
            continue
        if a[0] == "tensor" and b[0] == "tensor":
            changes = [f"{n} {_count(x) if n == 'hooks' else x} -> {_count(y) if n == 'hooks' else y}"
                       for n, x, y in zip(names, a[1:], b[1:], strict=True) if x != y]  # fmt: skip
            return f"argument {i}: " + ", ".join(changes)
        if a[0] == "object" or b[0] == "object":
            return f"argument {i}: a different object"
        return f"argument {i}: {a[1]!r} -> {b[1]!r}" if a[0] is b[0] else f"argument {i}: type changed"
    return "the arguments changed"


def _hook_counts(t) -> tuple[int, int]:
    return (len(t._hooks or ()), len(t._post_accumulate_hooks or ()))


def _count(hooks: tuple | None) -> str:
    """A tensor argument's hooks in a key, in words."""
    if hooks is None:
        return "none"
    return " and ".join(f"{n} {kind}" for kind, n in zip(("hooks", "post-accumulate hooks"), hooks, strict=True) if n)


def dynamic_key(
    dims_by_tree: dict, key: tuple, spec, leaves: list, floats: frozenset[int] = frozenset()
) -> tuple[tuple, str]:
    """The key a new dynamic specialization (``spec.dynamic``: its (argument, dim) pairs) is cached
    under, its dynamic sizes as size classes, and what to add to its reason for ``kiln.explain``.
    ``dims_by_tree`` (the compiled function's, per call tree) gains its dims: the key leaves out the
    sizes of every dim any specialization made dynamic, so those this one keeps static (an earlier
    program's dynamic batch beside this one's dynamic image) become ``==`` size guards of it."""
    dims = dict(dims_by_tree.get(key[0], {}))
    for p, d in spec.dynamic:
        dims[p] = tuple(sorted({*dims.get(p, ()), d}))
    dims_by_tree[key[0]] = dims
    # ``leaves`` are the arguments after the traced call: their ``.grad`` (a backward inside the call)
    # and requires_grad are taken from ``key``, the arguments as they came, as every call looks up
    fresh = call_key(key[0], leaves, dims, floats)
    parts = tuple((*new[:5], *old[5:7], *new[7:]) if new[0] == "tensor" else new
                  for new, old in zip(fresh[1], key[1], strict=True))  # fmt: skip
    spec.key = (fresh[0], parts, *key[2:])
    own = set(spec.dynamic)
    spec.size_guards += [SizeGuard(p, d, "__eq__", int(leaves[p].shape[d]), True, "the size its program was traced at")
                         for p, ds in dims.items() for d in ds if (p, d) not in own]  # fmt: skip
    named = ", ".join(f"argument {p} dim {d}" for p, d in sorted(spec.dynamic))
    guards = ", ".join(f"argument {g.argument} dim {g.dim} {g}{'' if g.result else ' is False'}"
                       for g in spec.size_guards if isinstance(g, SizeGuard))  # fmt: skip
    return spec.key, f"; dynamic: {named} (one program for every size >= 2{'; guards: ' + guards if guards else ''})"
