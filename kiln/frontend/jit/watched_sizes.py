"""Sizes Python reads during a trace that may make them dynamic (``dynamic.py``): ``WatchedSize``.

A trace learns which sizes are dynamic by comparing two traces at two sizes; a branch Python takes
on a size (``if x.shape[0] > 8``) is invisible there when both sizes take it alike. So while such a
trace runs, ``Tensor.shape`` and ``Tensor.size()`` hand out the sizes that may become dynamic as
``WatchedSize`` ints, and a comparison or truth test of one in the user's code keeps the call static.
``len(t)`` gives a plain int (Python converts what ``__len__`` returns), so it is not watched.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_KILN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def watched_shape(shape: tuple, trace) -> tuple:
    """``shape`` with each size the trace watches (``trace.watched_sizes``) as a ``WatchedSize``."""
    watched = trace.watched_sizes
    return tuple(WatchedSize(d, trace) if d in watched else d for d in shape)


class WatchedSize(int):
    """A size Python read from a tensor during a trace that learns dynamic sizes. It is the int it
    says; what Python computes from it stays watched, and a comparison or truth test in the user's
    code (``if x.shape[0] > 8``) is told to the trace, which then keeps the call static: a branch
    taken alike at the two traced sizes could go the other way at a third."""

    trace: Any  # the trace told of a comparison

    def __new__(cls, value: int, trace) -> WatchedSize:
        self = super().__new__(cls, value)
        self.trace = trace
        return self

    def _told(self, what: str) -> None:
        frame = sys._getframe(2)
        if not frame.f_code.co_filename.startswith(_KILN_DIR):  # kiln's own checks of shapes are no branch
            self.trace.on_size_compared(f"{what} at {frame.f_code.co_filename}:{frame.f_lineno}")

    def _same(self, value):
        return WatchedSize(value, self.trace) if type(value) is int else value

    __hash__ = int.__hash__


def _comparison(name: str):
    method = getattr(int, name)

    def compare(self, other):
        self._told(f"a comparison of the dynamic size {int(self)}")
        return method(self, other)

    return compare


def _arithmetic(name: str):
    method = getattr(int, name)

    def compute(self, *other):
        return self._same(method(self, *other))

    return compute


def _truth(self) -> bool:
    self._told(f"a truth test of the dynamic size {int(self)}")
    return int(self) != 0


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(WatchedSize, _name, _comparison(_name))
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__", "__rfloordiv__",
              "__mod__", "__rmod__", "__neg__", "__pow__"):  # fmt: skip
    setattr(WatchedSize, _name, _arithmetic(_name))
WatchedSize.__bool__ = _truth  # type: ignore[method-assign]


def plain_ints(value):
    """``value`` (an op's attributes) with every ``WatchedSize`` an int again."""
    if isinstance(value, WatchedSize):
        return int(value)
    if isinstance(value, tuple):
        return tuple(plain_ints(v) for v in value)
    if isinstance(value, list):
        return [plain_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: plain_ints(v) for k, v in value.items()}
    return value
