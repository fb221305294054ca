"""LLVM fast-math flags, chosen per use and listed here once, each with the reason it is safe.

Every floating-point instruction kiln emits takes its flags from one of these tuples, chosen by
the scalar core's float mode (``BY_MODE``: ``LLVMCore.add`` in ``ELEMENTWISE`` mode emits
``fadd contract``). What
is never used anywhere: ``nnan`` and ``ninf`` (inf and nan must propagate exactly as in eager)
and ``fast`` (which implies them); ``nsz`` only where numpy's own answer does not fix the sign of
zero either (``EXTREMUM_REDUCTION``): elsewhere it is observable (``1 / -0.0``, ``atan2``).

>>> ELEMENTWISE
('contract',)
"""

from __future__ import annotations

from ..core import FloatMode

#: Elementwise arithmetic: ``a * b + c`` may become one fused multiply-add. FMA rounds once
#: instead of twice, so results may differ from numpy's by at most the rounding of the product;
#: it never changes inf/nan propagation. Whether LLVM contracts depends on the kernel around the
#: expression, so two kernels computing one value may disagree in its last bit, and a comparison
#: of the two may not hold: the backward never decides on a recomputed rounded value for that
#: reason (passes/partition.py, ``Primitive.exact``).
ELEMENTWISE: tuple[str, ...] = ("contract",)

#: Accumulations of reductions (sum, prod, the running max's partner sums): reassociation lets
#: the vectorizer keep several partial accumulators and combine them at the end -- the reason a
#: row sum runs at memory bandwidth. numpy's own pairwise summation also differs from a
#: left-to-right sum, so the tests compare reductions with a tolerance anyway.
REDUCTION: tuple[str, ...] = ("reassoc", "contract")

#: Max/min reductions (``llvm.maximum``/``llvm.minimum``): which of 0.0 and -0.0 a row holding both
#: reduces to is left open, as numpy leaves it (``np.maximum`` returns either, by the order it
#: meets them); nan still propagates. Ordering the zeros costs x86 a sign test and a blend on each
#: accumulator's dependency chain: a float32 row max took 1.45x the time, softmax 1.1x.
EXTREMUM_REDUCTION: tuple[str, ...] = ("nsz",)

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

#: The flags no tuple above may contain (``EXTREMUM_REDUCTION`` alone holds ``nsz``, see there).
FORBIDDEN = frozenset({"nnan", "ninf", "nsz", "fast"})

assert not FORBIDDEN.intersection(ELEMENTWISE + REDUCTION + EXACT), "a forbidden fast-math flag is in use"
assert FORBIDDEN.intersection(EXTREMUM_REDUCTION) == {"nsz"}, "max/min reductions may drop the sign of zero only"
