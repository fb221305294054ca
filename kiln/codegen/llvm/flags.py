"""LLVM fast-math flags, chosen per use and listed here once, each with the reason it is safe.

Every floating-point instruction kiln emits takes its flags from one of these tuples, chosen by
the scalar core's float mode (``BY_MODE``: ``LLVMCore.add`` in ``ELEMENTWISE`` mode emits
``fadd contract``). What
is never used anywhere: ``nnan`` and ``ninf`` (inf and nan must propagate exactly as in eager),
``nsz`` (the sign of zero is observable: ``1 / -0.0``, ``atan2``, numpy's max/min ties) and
``fast`` (which implies all of them).

>>> ELEMENTWISE
('contract',)
"""

from __future__ import annotations

from ..core import FloatMode

#: Elementwise arithmetic: ``a * b + c`` may become one fused multiply-add. FMA rounds once
#: instead of twice, so results may differ from numpy's by at most the rounding of the product;
#: it never changes inf/nan propagation or the discrete ops (floor, casts, comparisons).
ELEMENTWISE: tuple[str, ...] = ("contract",)

#: Accumulations of reductions (sum, prod, the running max's partner sums): reassociation lets
#: the vectorizer keep several partial accumulators and combine them at the end -- the reason a
#: row sum runs at memory bandwidth. numpy's own pairwise summation also differs from a
#: left-to-right sum, so the tests compare reductions with a tolerance anyway.
REDUCTION: tuple[str, ...] = ("reassoc", "contract")

#: kiln's own math routines (kiln/codegen/mathlib/) and numpy's divmod: no flags at all. Their
#: error analyses (exact Cody-Waite steps, TwoSum, compensated divisions, npy_divmod's snapping)
#: rely on every operation rounding exactly once; the polynomials use explicit ``fma`` instead.
EXACT: tuple[str, ...] = ()

#: The flags of each float mode of the scalar core (kiln/codegen/core.py).
BY_MODE: dict[FloatMode, tuple[str, ...]] = {
    FloatMode.ELEMENTWISE: ELEMENTWISE,
    FloatMode.EXACT: EXACT,
    FloatMode.REDUCTION: REDUCTION,
}

#: The flags no tuple above may contain.
FORBIDDEN = frozenset({"nnan", "ninf", "nsz", "fast"})

assert not FORBIDDEN.intersection(ELEMENTWISE + REDUCTION + EXACT), "a forbidden fast-math flag is in use"
