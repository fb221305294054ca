"""LLVM fast-math flags, chosen per use and listed here once, each with the reason it is safe.

Every floating-point instruction kiln emits takes its flags from one of these tuples (llvmlite's
``builder.fadd(a, b, flags=ELEMENTWISE)``, ``builder.call(fn, args, fastmath=MATHLIB)``). What
is never used anywhere: ``nnan`` and ``ninf`` (inf and nan must propagate exactly as in eager),
``nsz`` (the sign of zero is observable: ``1 / -0.0``, ``atan2``, numpy's max/min ties) and
``fast`` (which implies all of them).

>>> ELEMENTWISE
('contract',)
"""

from __future__ import annotations

#: Elementwise arithmetic: ``a * b + c`` may become one fused multiply-add. FMA rounds once
#: instead of twice, so results may differ from numpy's by at most the rounding of the product;
#: it never changes inf/nan propagation or the discrete ops (floor, casts, comparisons).
ELEMENTWISE: tuple[str, ...] = ("contract",)

#: Accumulations of reductions (sum, prod, the running max's partner sums): reassociation lets
#: the vectorizer keep several partial accumulators and combine them at the end -- the reason a
#: row sum runs at memory bandwidth. numpy's own pairwise summation also differs from a
#: left-to-right sum, so the tests compare reductions with a tolerance anyway.
REDUCTION: tuple[str, ...] = ("reassoc", "contract")

#: Inside kiln's own math routines (kiln/codegen/llvm/mathlib.py) only: ``afn`` lets LLVM use
#: approximate forms of the intrinsics a routine calls and ``arcp`` turns a division into a
#: multiplication by a reciprocal -- both within the routine's documented ulp bound. Not
#: ``reassoc``: range reductions (Cody-Waite) and compensated polynomial steps depend on the
#: order of their operations.
MATHLIB: tuple[str, ...] = ("contract", "afn", "arcp")

#: The flags no tuple above may contain.
FORBIDDEN = frozenset({"nnan", "ninf", "nsz", "fast"})

assert not FORBIDDEN.intersection(ELEMENTWISE + REDUCTION + MATHLIB), "a forbidden fast-math flag is in use"
