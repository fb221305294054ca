"""``functional_call``: call a module with some of its parameters and buffers replaced by given tensors.

The replacements are installed for the duration of the call and the originals put back after, even
when the call raises; gradients flow to the given tensors.

>>> import kiln
>>> lin = kiln.nn.Linear(2, 1, bias=False)
>>> functional_call(lin, {"weight": kiln.ones(1, 2)}, (kiln.tensor([[1.0, 2.0]]),)).tolist()
[[3.0]]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import kiln

__all__ = ["functional_call"]


def _owner(module, name: str):
    *path, leaf = name.split(".")
    for part in path:
        module = getattr(module, part)
    return module, leaf


@contextlib.contextmanager
def _swapped(module, tensors: dict, strict: bool) -> Iterator[None]:
    names = set(dict(module.named_parameters(remove_duplicate=False))) | set(
        dict(module.named_buffers(remove_duplicate=False)))  # fmt: skip
    unknown = [n for n in tensors if n not in names]
    missing = [n for n in names if n not in tensors]
    if unknown or (strict and missing):
        parts = []
        if missing and strict:
            parts.append(f"Missing key(s): {', '.join(repr(k) for k in sorted(missing))}.")
        if unknown:
            parts.append(f"Unexpected key(s): {', '.join(repr(k) for k in sorted(unknown))}.")
        raise RuntimeError("Error(s) in reparametrizing for " + type(module).__name__ + ":\n\t" + "\n\t".join(parts))
    saved = []
    try:
        for name, value in tensors.items():
            owner, leaf = _owner(module, name)
            store = owner._parameters if leaf in owner._parameters else owner._buffers
            saved.append((store, leaf, store[leaf]))
            store[leaf] = value  # a plain dict write: the given tensor is used as is (no Parameter wrapping)
        yield
    finally:
        for store, leaf, original in reversed(saved):
            store[leaf] = original


def functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None, *, tie_weights: bool = True,
                    strict: bool = False):  # fmt: skip
    """``module(*args, **kwargs)`` with the named parameters/buffers taken from ``parameter_and_buffer_dicts``
    (a dict, or a sequence of dicts merged in order)."""
    if isinstance(parameter_and_buffer_dicts, dict):
        tensors = dict(parameter_and_buffer_dicts)
    else:
        tensors = {}
        for d in parameter_and_buffer_dicts:
            overlap = set(tensors) & set(d)
            if overlap:
                raise ValueError(f"{sorted(overlap)} appeared in multiple dictionaries; behavior of functional call is "
                                 "ambiguous")  # fmt: skip
            tensors.update(d)
    for name, value in tensors.items():
        if value is not None and not isinstance(value, kiln.Tensor):
            raise TypeError(f"functional_call: expected a tensor for {name!r}, got {type(value).__name__}")
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with _swapped(module, tensors, strict):
        return module(*args, **(kwargs or {}))
