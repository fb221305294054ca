"""Devices and the static type of a tensor value: ``TensorType(shape, dtype, device)``.

Shapes are tuples of ints today; a dimension may later be a symbol (a dynamic batch size)
without a new IR, so code that reads shapes goes through ``TensorType`` rather than assuming.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DType


@dataclass(frozen=True, eq=False)
class Device:
    """A device: ``Device("cpu")`` or ``Device("cuda", 0)``. Interned by ``device()``, so equality
    and hashing are by identity (a C-level hash: devices are dictionary keys on the hot path)."""

    type: str
    index: int | None = None

    def __reduce__(self):  # unpickle to the interned instance
        return (device, (str(self),))

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        index = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{index})"


_DEVICES: dict[tuple[str, int | None], Device] = {}
DEVICE_TYPES = ("cpu", "cuda")


def device(spec: object = "cpu", index: int | None = None) -> Device:
    """Parse ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``Device`` into the interned ``Device``.

    >>> device("cuda:1")
    device(type='cuda', index=1)
    """
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"expected a device such as 'cpu' or 'cuda:0', got {spec!r}")
    kind, _, idx = spec.partition(":")
    if kind not in DEVICE_TYPES or (idx and not idx.isdigit()):
        raise ValueError(f"expected a device such as 'cpu', 'cuda' or 'cuda:0', got {spec!r}")
    if idx:
        index = int(idx)
    if kind == "cpu":
        index = None
    elif index is None:
        index = 0
    key = (kind, index)
    if key not in _DEVICES:
        _DEVICES[key] = Device(kind, index)
    return _DEVICES[key]


CPU = device("cpu")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType
    device: Device = CPU

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(map(str, self.shape))}]"
