"""The scalar emitter protocol that elementwise primitives' formulas are written against.

A primitive's ``scalar(em, *values, **attrs)`` computes one element. Each code generator
supplies an emitter whose methods build code (LLVM IR for the CPU, CUDA source for the GPU);
fusing a chain of elementwise nodes is evaluating their formulas one after another on the same
emitter inside one loop nest. A code generator does not write these methods itself: it
implements the small scalar core of ``kiln/codegen/core.py`` and takes every method below from
``kiln.codegen.semantics.Semantics``, which is kiln's numpy-exact semantics written once. ``NumpyEmitter`` evaluates the formulas on whole numpy arrays: it
is the reference that proves every formula computes what the eager kernel computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .dtypes import FLOATING, DType, float_to_int

UNARY_METHODS = ("neg", "abs", "sign", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh",
                 "sigmoid", "erf", "floor", "ceil", "round_half_even", "logical_not", "bitwise_not")  # fmt: skip
BINARY_METHODS = ("add", "sub", "mul", "div", "floordiv", "mod", "pow", "max", "min", "eq", "ne", "lt", "le", "gt",
                  "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
                  "shift_left", "shift_right")  # fmt: skip


class Emitter(Protocol):
    """Every method takes and returns the emitter's value type (an LLVM value, a CUDA expression...).

    Unary: neg abs sign exp expm1 log log1p sqrt rsqrt sin cos tanh sigmoid erf floor ceil
    round_half_even logical_not bitwise_not (sign is 0 for nan). Binary: add sub mul div floordiv (toward -inf) mod
    (sign of the divisor) pow max min (both propagate nan) eq ne lt le gt ge logical_and logical_or
    logical_xor bitwise_and bitwise_or bitwise_xor shift_left shift_right (integers; a count < 0 or >= the
    width shifts every bit out, as in PyTorch). Also ``select(cond, a, b)`` and ``cast(x, dtype)`` (float -> int saturates,
    nan -> 0).
    """

    def select(self, cond: Any, a: Any, b: Any) -> Any: ...
    def cast(self, x: Any, dtype: DType) -> Any: ...


_NUMPY_NAMES: dict[str, Callable[..., Any]] = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "exp": np.exp, "expm1": np.expm1, "log": np.log,
    "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: np.reciprocal(np.sqrt(x)), "sin": np.sin,
    "cos": np.cos, "tanh": np.tanh, "floor": np.floor, "ceil": np.ceil, "round_half_even": np.round,
    "logical_not": np.logical_not, "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "max": np.maximum, "min": np.minimum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor, "bitwise_not": np.invert,
}  # fmt: skip


class NumpyEmitter:
    """Evaluates scalar formulas elementwise on numpy arrays (the reference emitter)."""

    def __getattr__(self, name: str):
        try:
            fn = _NUMPY_NAMES[name]
        except KeyError:
            raise AttributeError(f"the emitter protocol has no operation {name!r}") from None
        return lambda *args: np.asarray(fn(*args))

    def sign(self, x):
        return np.where(x != x, 0, np.sign(x)).astype(x.dtype)

    def sigmoid(self, x):
        return np.asarray(1 / (1 + np.exp(-x))).astype(x.dtype)

    def erf(self, x):
        return np.asarray(np.frompyfunc(math.erf, 1, 1)(x)).astype(x.dtype)

    def select(self, cond, a, b):
        return np.where(cond, a, b)

    def shift_left(self, a, b):
        from .primitives.bitwise import shift_left  # noqa: PLC0415 - the reference's own kernel, loaded when used

        return np.asarray(shift_left.eager(np, a, b))

    def shift_right(self, a, b):
        from .primitives.bitwise import shift_right  # noqa: PLC0415

        return np.asarray(shift_right.eager(np, a, b))

    def cast(self, x, dtype: DType):
        if dtype.category != FLOATING and x.dtype.kind == "f":
            return float_to_int(np, x, dtype)
        return x.astype(dtype.np)
