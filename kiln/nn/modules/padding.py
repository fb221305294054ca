"""Padding layers: constant (and zero), reflection, replication and circular, for 1-3 spatial dims.

``padding`` is an int (every side) or a tuple in ``F.pad``'s order (left, right, top, bottom, front, back).
"""

from __future__ import annotations

from .. import functional as F
from .module import Module

__all__ = ["ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
           "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d",
           "ReplicationPad3d", "CircularPad1d", "CircularPad2d", "CircularPad3d"]  # fmt: skip


class _PadNd(Module):
    _d = 1
    _mode = "constant"

    def __init__(self, padding) -> None:
        super().__init__()
        sides = 2 * self._d
        if isinstance(padding, int):
            padding = (padding,) * sides
        padding = tuple(padding)
        if len(padding) != sides:
            raise ValueError(f"{type(self).__name__}: expected padding of {sides} ints, got {padding}")
        self.padding = padding

    def _check_input(self, input) -> None:
        d = self._d
        if input.dim() not in (d + 1, d + 2):
            raise ValueError(f"{type(self).__name__}: expected {d + 1}D or {d + 2}D input, got {input.dim()}D")

    def forward(self, input):
        self._check_input(input)
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value: float) -> None:
        super().__init__(padding)
        self.value = value

    def forward(self, input):
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    _d = 1


class ConstantPad2d(_ConstantPadNd):
    _d = 2


class ConstantPad3d(_ConstantPadNd):
    _d = 3


class _ZeroPadNd(_ConstantPadNd):
    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad1d(_ZeroPadNd):
    _d = 1


class ZeroPad2d(_ZeroPadNd):
    _d = 2


class ZeroPad3d(_ZeroPadNd):
    _d = 3


class ReflectionPad1d(_PadNd):
    _d, _mode = 1, "reflect"


class ReflectionPad2d(_PadNd):
    _d, _mode = 2, "reflect"


class ReflectionPad3d(_PadNd):
    _d, _mode = 3, "reflect"


class ReplicationPad1d(_PadNd):
    _d, _mode = 1, "replicate"


class ReplicationPad2d(_PadNd):
    _d, _mode = 2, "replicate"


class ReplicationPad3d(_PadNd):
    _d, _mode = 3, "replicate"


class CircularPad1d(_PadNd):
    _d, _mode = 1, "circular"


class CircularPad2d(_PadNd):
    _d, _mode = 2, "circular"


class CircularPad3d(_PadNd):
    _d, _mode = 3, "circular"
