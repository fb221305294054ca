"""Movement primitives: ops that move or view elements and compute none.

``reshape`` and ``expand`` are views (the eager result shares memory with the input), as their
PyTorch counterparts ``view`` and ``expand`` are.
"""

from __future__ import annotations

from ..shapes import numel
from ..types import TensorType
from . import Kind, Primitive, Sample, register


def _reshape_infer(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    if numel(shape) != x.numel or any(d < 0 for d in shape):
        raise RuntimeError(f"shape {list(shape)} is invalid for input of size {x.numel} (shape {list(x.shape)})")
    return TensorType(tuple(shape), x.dtype, x.device)


reshape = register(Primitive(
    "reshape", Kind.MOVEMENT, _reshape_infer, lambda xp, x, *, shape: x.reshape(shape),
    lambda ops, c, g: (ops.reshape(g, c.input_types[0].shape),),
    reference=lambda torch, x, *, shape: x.reshape(shape),
    samples=lambda rng: [Sample((rng.normal(size=(2, 6)),), {"shape": (3, 4)}),
                         Sample((rng.normal(size=()),), {"shape": (1, 1)}),
                         Sample((rng.normal(size=(0, 2)),), {"shape": (2, 0)})],
    is_view=True, doc="Row-major reshape of a tensor whose strides allow a view (the frontend copies first otherwise).",
))  # fmt: skip


def _expand_infer(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    lead = len(shape) - x.ndim
    ok = lead >= 0 and all(s == d or d == 1 for s, d in zip(shape[lead:], x.shape, strict=True))
    if not ok:
        raise RuntimeError(
            f"the expanded size {list(shape)} must match the existing size {list(x.shape)} at every "
            "non-singleton dimension (and have at least as many dimensions)"
        )
    return TensorType(tuple(shape), x.dtype, x.device)


expand = register(Primitive(
    "expand", Kind.MOVEMENT, _expand_infer, lambda xp, x, *, shape: xp.broadcast_to(x, shape),
    lambda ops, c, g: (ops.sum_to(g, c.input_types[0].shape),),
    reference=lambda torch, x, *, shape: x.expand(shape),
    samples=lambda rng: [Sample((rng.normal(size=(3, 1)),), {"shape": (2, 3, 4)}),
                         Sample((rng.normal(size=()),), {"shape": (5,)})],
    is_view=True, doc="Broadcast to `shape` without copying (stride 0 on the new dimensions).",
))  # fmt: skip


copy = register(Primitive(
    "copy", Kind.MOVEMENT, lambda x: x, lambda xp, x: xp.array(x, copy=True, order="C"),
    lambda ops, c, g: (g,), reference=lambda torch, x: x.clone(),
    samples=lambda rng: [Sample((rng.normal(size=(2, 3)).T,)), Sample((rng.normal(size=()),))],
    doc="A fresh row-major copy (clone, contiguous).",
))  # fmt: skip
