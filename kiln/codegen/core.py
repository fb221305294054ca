"""The scalar core: the few typed operations a code generator implements to compile kiln's formulas.

kiln's semantics (numpy-exact divmod, integer pow, saturating casts, nan-propagating max/min,
the transcendental routines of ``mathlib``) are written once, in ``kiln.codegen.semantics``,
against this protocol. A new backend implements a ``Core`` -- a few dozen methods that map one to
one onto its instructions -- and gets every elementwise primitive's formula from
``Semantics(core)``; it may still override any method of ``Semantics`` with a native one (see
that module's docstring).

Values are ``Scalar(value, dtype)``: the backend's value (an LLVM register, a CUDA expression, a
numpy array) and the kiln dtype it holds. Binary operations take operands of one dtype and return
that dtype; comparisons return ``bool``. Integer arithmetic wraps modulo ``2**bits``; the callers
(the semantics) never divide by zero nor compute ``INT_MIN / -1``, never shift by the width or
more, and never convert a float that does not fit (or nan) to an integer, so a core may map these
to instructions that leave such cases undefined.

Floating-point freedom is a mode, set with ``with core.float_mode(FloatMode.EXACT): ...``:

- ``ELEMENTWISE`` (the default): ``a * b + c`` may contract into one fused multiply-add;
- ``EXACT``: every operation rounds exactly once (numpy's divmod, the math routines' error-free
  steps); routine bodies start in this mode;
- ``REDUCTION``: an accumulation may also be reassociated (vector partial sums).

No mode lets a backend assume away inf, nan or the sign of zero. The LLVM backend maps the modes
onto its fast-math flags in ``kiln/codegen/llvm/flags.py``.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ..ir.dtypes import DType


class Unsupported(Exception):
    """A kernel or formula a code generator does not compile (the reason is the message); the
    executor runs that node with the interpreter instead and ``kiln.explain`` says why."""


@dataclass(frozen=True)
class Scalar:
    """One element's value in a formula: a backend value and its kiln dtype."""

    value: Any
    dtype: DType


class FloatMode(enum.Enum):
    """How much freedom floating-point arithmetic has (see the module docstring)."""

    ELEMENTWISE = "elementwise"
    EXACT = "exact"
    REDUCTION = "reduction"


#: comparison operators of ``Core.compare``; "uno" is true when either operand is nan
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=", "uno")


class Core(Protocol):
    """The operations a backend implements; see the module docstring for the contract."""

    mode: FloatMode

    def float_mode(self, mode: FloatMode) -> contextlib.AbstractContextManager[None]: ...

    # constants and arithmetic (floats and integers; bool only through the bit ops below)
    def constant(self, value: object, dtype: DType) -> Scalar: ...
    def add(self, a: Scalar, b: Scalar) -> Scalar: ...
    def sub(self, a: Scalar, b: Scalar) -> Scalar: ...
    def mul(self, a: Scalar, b: Scalar) -> Scalar: ...
    def div(self, a: Scalar, b: Scalar) -> Scalar: ...  # floats only
    def frem(self, a: Scalar, b: Scalar) -> Scalar: ...  # C's fmod: exact
    def neg(self, x: Scalar) -> Scalar: ...
    def fma(self, a: Scalar, b: Scalar, c: Scalar) -> Scalar: ...  # rounded once

    # comparisons and choice
    def compare(self, op: str, a: Scalar, b: Scalar, *, unordered: bool = False) -> Scalar:
        """``a op b`` as bool. Floats: ordered (false with nan) unless ``unordered`` (true with nan);
        integers: signed or unsigned by the dtype (bool is unsigned)."""
        ...

    def select(self, cond: Scalar, a: Scalar, b: Scalar) -> Scalar: ...  # cond is bool

    # conversions
    def cast(self, x: Scalar, dtype: DType) -> Scalar:
        """The raw conversion: float <-> float rounds to nearest; int/bool -> float by the source's
        signedness; float -> int truncates (the value fits); int -> int truncates or extends by the
        source's signedness (bool zero-extends). Never to bool: truth is a comparison."""
        ...

    def bitcast(self, x: Scalar, dtype: DType) -> Scalar: ...  # same width

    # float operations with vector forms
    def floor(self, x: Scalar) -> Scalar: ...
    def ceil(self, x: Scalar) -> Scalar: ...
    def roundeven(self, x: Scalar) -> Scalar: ...
    def sqrt(self, x: Scalar) -> Scalar: ...
    def fabs(self, x: Scalar) -> Scalar: ...
    def copysign(self, magnitude: Scalar, sign: Scalar) -> Scalar: ...

    # integer and bool bit operations; division only by safe divisors
    def and_(self, a: Scalar, b: Scalar) -> Scalar: ...
    def or_(self, a: Scalar, b: Scalar) -> Scalar: ...
    def xor(self, a: Scalar, b: Scalar) -> Scalar: ...
    def not_(self, x: Scalar) -> Scalar: ...
    def shl(self, a: Scalar, b: Scalar) -> Scalar: ...
    def lshr(self, a: Scalar, b: Scalar) -> Scalar: ...
    def ashr(self, a: Scalar, b: Scalar) -> Scalar: ...
    def sdiv(self, a: Scalar, b: Scalar) -> Scalar: ...
    def srem(self, a: Scalar, b: Scalar) -> Scalar: ...
    def udiv(self, a: Scalar, b: Scalar) -> Scalar: ...
    def urem(self, a: Scalar, b: Scalar) -> Scalar: ...

    # routines
    def routine(self, name: str, body: Callable[..., Scalar], *args: Scalar) -> Scalar:
        """``body(core, *args)``, defined once per module under ``name`` and the argument dtypes
        and called here (so a routine used many times is emitted once); ``body`` runs on a core
        in ``EXACT`` mode. Its result has the first argument's dtype."""
        ...

    def libm_where(self, cond: Scalar, name: str, x: Scalar, otherwise: Scalar) -> Scalar:
        """The platform's correctly rounded ``name(x)`` (sin, cos) where ``cond`` holds, else
        ``otherwise``: the rare path of a routine, computed only for the elements that need it."""
        ...


class ModeMixin:
    """``mode`` and ``float_mode`` for a core: the mode in force inside the ``with`` block."""

    mode: FloatMode = FloatMode.ELEMENTWISE

    @contextlib.contextmanager
    def float_mode(self, mode: FloatMode) -> Iterator[None]:
        saved, self.mode = self.mode, mode
        try:
            yield
        finally:
            self.mode = saved
