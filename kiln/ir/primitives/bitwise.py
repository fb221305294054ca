"""Bit primitives on integers (and bool): ``bitwise_and/or/xor/not`` and the two shifts.

They are elementwise like ``add`` (inputs of one dtype, broadcast; the frontend promotes and
casts first), exact and not differentiable. On bool, ``&``, ``|``, ``^`` and ``~`` are the
logical ops and the frontend records those (the fused kernels and graphs of bool masks stay as
they were); these primitives take bool too, so a graph loaded from a file may hold them.

Shifts follow PyTorch, which defines every count rather than leaving C's undefined behaviour:
a count below zero or at least the width (bits of the dtype) shifts every bit out -- 0 for a left
shift, the sign fill for a right shift (-1 for a negative signed value, else 0). A right shift of
a signed value is arithmetic. Both ``eager`` and the scalar formula (``Semantics.shift_left``)
clamp the count before shifting, so no backend meets an out-of-range count.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..types import TensorType
from . import NOT_DIFFERENTIABLE, Cost, Kind, Primitive, Sample, register
from .elementwise import _nary_infer


def _integers_only(name: str, allow_bool: bool):
    """The binary shape rule, refusing floating point (and bool for the shifts) as PyTorch does."""
    broadcast = _nary_infer(name, None)

    def infer(*types: TensorType) -> TensorType:
        for t in types:
            if t.dtype.category == dt.FLOATING or (t.dtype is dt.bool_ and not allow_bool):
                raise TypeError(
                    f"{name}: expected integer{' or bool' if allow_bool else ''} tensors, got {t.dtype.name}"
                )
        return broadcast(*types)

    return infer


def _shift_eager(left: bool):
    """A shift with PyTorch's counts: out-of-range counts shift every bit out (module docstring)."""

    def eager(xp, a, b):
        a, b = xp.asarray(a), xp.asarray(b)
        width = 8 * a.dtype.itemsize
        in_range = b < width if a.dtype.kind == "u" else (b >= 0) & (b < width)
        arithmetic = not left and a.dtype.kind == "i"
        # an arithmetic right shift by width - 1 is the sign fill; every other case gives 0 out of range
        count = xp.where(in_range, b, width - 1 if arithmetic else 0).astype(a.dtype, copy=False)
        shifted = xp.left_shift(a, count) if left else xp.right_shift(a, count)
        if not arithmetic:
            shifted = xp.where(in_range, shifted, xp.zeros((), a.dtype))
        return xp.asarray(shifted).astype(a.dtype, copy=False)

    return eager


_INTS = (np.uint8, np.int8, np.int16, np.int32, np.int64)


def _bit_samples(allow_bool: bool):
    def samples(rng):
        out = []
        for t in _INTS:
            info = np.iinfo(t)
            a = rng.integers(info.min, info.max, size=(3, 4), endpoint=True).astype(t)
            b = rng.integers(info.min, info.max, size=(4,), endpoint=True).astype(t)
            out.append(Sample((a, b), gradcheck=False))
        out.append(Sample((np.array(5, np.int32), np.array([[1], [-6]], np.int32)), gradcheck=False))
        if allow_bool:
            out.append(Sample((rng.random((2, 3)) > 0.5, rng.random((2, 3)) > 0.5), gradcheck=False))
        return out

    return samples


def _shift_samples(rng):
    """Every count from below zero to past the width, on edge values of every integer dtype."""
    out = []
    for t in _INTS:
        info = np.iinfo(t)
        width = 8 * np.dtype(t).itemsize
        values = np.array([0, 1, -1, 5, -5, 100, info.min, info.max], np.int64).astype(t)
        counts = np.array([-1, 0, 1, 3, width - 1, width, width + 1, 100], np.int64).astype(t)
        out.append(Sample((values[:, None], counts[None, :]), gradcheck=False))
    out.append(Sample((np.array(-7, np.int64), np.arange(-2, 70, dtype=np.int64)), gradcheck=False))
    return out


def _binary(name, eager, reference, *, allow_bool=True, samples=None, doc=""):
    return register(Primitive(
        name, Kind.BINARY, _integers_only(name, allow_bool), eager, NOT_DIFFERENTIABLE,
        scalar=lambda em, a, b: getattr(em, name)(a, b), reference=reference,
        samples=samples or _bit_samples(allow_bool), doc=doc, cost=Cost.CHEAP, exact=True,
    ))  # fmt: skip


def _not_infer(x: TensorType) -> TensorType:
    return _integers_only("bitwise_not", True)(x)


bitwise_and = _binary("bitwise_and", lambda xp, a, b: xp.bitwise_and(a, b), lambda torch, a, b: torch.bitwise_and(a, b))
bitwise_or = _binary("bitwise_or", lambda xp, a, b: xp.bitwise_or(a, b), lambda torch, a, b: torch.bitwise_or(a, b))
bitwise_xor = _binary("bitwise_xor", lambda xp, a, b: xp.bitwise_xor(a, b), lambda torch, a, b: torch.bitwise_xor(a, b))
shift_left = _binary("shift_left", _shift_eager(left=True), lambda torch, a, b: torch.bitwise_left_shift(a, b),
                     allow_bool=False, samples=_shift_samples,
                     doc="a << b, wrapping; a count < 0 or >= the width gives 0 (PyTorch's).")  # fmt: skip
shift_right = _binary("shift_right", _shift_eager(left=False), lambda torch, a, b: torch.bitwise_right_shift(a, b),
                      allow_bool=False, samples=_shift_samples,
                      doc="a >> b, arithmetic on signed ints; a count < 0 or >= the width gives the sign fill.")  # fmt: skip
bitwise_not = register(Primitive(
    "bitwise_not", Kind.UNARY, _not_infer, lambda xp, x: xp.invert(x), NOT_DIFFERENTIABLE,
    scalar=lambda em, x: em.bitwise_not(x), reference=lambda torch, x: torch.bitwise_not(x),
    samples=lambda rng: [Sample((s.args[0],), gradcheck=False) for s in _bit_samples(True)(rng)],
    doc="~x: every bit flipped (logical not on bool).", cost=Cost.CHEAP, exact=True,
))  # fmt: skip
