"""Reduction primitives: sum, max, min, prod and arg-reductions over axes, and cumulative sums.

``axes`` is a sorted tuple of non-negative axes (the frontend normalizes ``dim``); ``keepdim``
keeps reduced axes with size 1. Composite reductions (mean, var, logsumexp, softmax, norm)
are Python over these in ``kiln.frontend.ops.reductions``.
"""

from __future__ import annotations

from ..shapes import normalize_axes, reduced_shape
from ..types import TensorType
from . import Kind, Primitive, Sample, register


def _reduce_infer(name: str):
    def infer(x: TensorType, *, axes: tuple[int, ...], keepdim: bool) -> TensorType:
        normalize_axes(axes, x.ndim)  # raises for out-of-range axes
        return TensorType(reduced_shape(x.shape, axes, keepdim), x.dtype, x.device)

    return infer


def _sum_vjp(ops, c, g):
    (t,) = c.input_types
    if not c.attrs["keepdim"]:
        g = ops.reshape(g, reduced_shape(t.shape, c.attrs["axes"], True))
    return (ops.expand(g, t.shape),)


def _sum_samples(rng):
    x = rng.normal(size=(2, 3, 4))
    return [
        Sample((x,), {"axes": (1,), "keepdim": False}),
        Sample((x,), {"axes": (0, 2), "keepdim": True}),
        Sample((x,), {"axes": (0, 1, 2), "keepdim": False}),
        Sample((rng.normal(size=()),), {"axes": (), "keepdim": False}),
        Sample((rng.normal(size=(0, 3)),), {"axes": (0,), "keepdim": False}),
    ]


reduce_sum = register(Primitive(
    "reduce_sum", Kind.REDUCE, _reduce_infer("reduce_sum"),
    lambda xp, x, *, axes, keepdim: xp.sum(x, axis=axes, keepdims=keepdim, dtype=x.dtype),
    _sum_vjp, reference=lambda torch, x, *, axes, keepdim: torch.sum(x, dim=axes, keepdim=keepdim),
    samples=_sum_samples,
))  # fmt: skip
