"""Ordering: ``argsort``, the positions that sort values along an axis.

A sort is no elementwise op, reduction or view: no code generator fuses it, so a compiled graph runs
it as an extern node with its eager kernel (numpy's stable sort; cupy's on a GPU) at every call, as
the decompositions run. The frontend builds ``sort``, ``topk``, ``argsort`` and ``randperm`` on it
with ops -- values through ``gather``, which carries their gradient -- so a traced call that sorts
compiles instead of running eagerly.

The order is torch's stable CPU sort's: ties keep their positions, and nan counts as the largest
value (last ascending, first descending). Descending is the ascending order of the values reversed
along the axis, reversed again: no negation, so unsigned and the smallest signed integers sort right.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..types import TensorType
from . import NOT_DIFFERENTIABLE, Kind, Primitive, Sample, register


def _infer(x: TensorType, *, axis: int, descending: bool) -> TensorType:
    if not (-max(x.ndim, 1) <= axis < max(x.ndim, 1)):
        raise IndexError(f"argsort: dim {axis} is out of range for a tensor of {x.ndim} dims")
    return TensorType(x.shape, dt.int64, x.device)


def _stable(xp, x, axis: int):
    return xp.argsort(x, axis=axis, kind="stable") if xp is np else xp.argsort(x, axis=axis)


def _eager(xp, x, *, axis: int, descending: bool):
    if x.ndim == 0:
        return xp.zeros((), dtype=xp.int64)
    if not descending:
        return _stable(xp, x, axis).astype(xp.int64, copy=False)
    n = x.shape[axis]
    order = xp.flip(_stable(xp, xp.flip(x, axis), axis), axis)
    return (n - 1 - order).astype(xp.int64, copy=False)


def _samples(rng):
    ties = np.array([[1.0, 3.0, 3.0, 0.0, 3.0], [np.nan, 2.0, np.nan, -np.inf, np.inf]])
    ints = rng.integers(-3, 3, size=(4, 6))
    return [
        Sample((rng.normal(size=(3, 5)),), {"axis": -1, "descending": False}, gradcheck=False),
        Sample((rng.normal(size=(3, 5)),), {"axis": 0, "descending": True}, gradcheck=False),
        Sample((ties,), {"axis": 1, "descending": False}, gradcheck=False),
        Sample((ties,), {"axis": 1, "descending": True}, gradcheck=False),
        Sample((ints,), {"axis": 1, "descending": True}, gradcheck=False),
        Sample((np.array([0, 255, 7, 255], dtype=np.uint8),), {"axis": 0, "descending": True}, gradcheck=False),
        Sample((rng.normal(size=()),), {"axis": 0, "descending": False}, gradcheck=False),
        Sample((rng.normal(size=(0, 3)),), {"axis": 1, "descending": False}, gradcheck=False),
    ]


argsort = register(Primitive(
    "argsort", Kind.ORDER, _infer, _eager, NOT_DIFFERENTIABLE,
    reference=lambda torch, x, *, axis, descending: torch.argsort(x, dim=axis, descending=descending, stable=True),
    samples=_samples,
    doc="The int64 positions that sort `x` along `axis` (stable; nan as the largest value).",
))  # fmt: skip
