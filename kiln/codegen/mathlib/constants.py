"""Mathematical constants for mathlib, computed exactly with Python integers and split into
float32/float64 pieces (Cody-Waite splits: a head with trailing zero bits, so that an integer
times it is exact, plus the rounded remainder)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

_BITS = 320  # working precision of the exact constants, far beyond what any split needs


def _arctan_inverse(n: int, scale: int) -> int:
    """arctan(1/n) * scale, by its alternating series in integers."""
    total, power, k, sign = 0, scale // n, 1, 1
    while power:
        total += sign * (power // k)
        power //= n * n
        k += 2
        sign = -sign
    return total


def _ln2(scale: int) -> int:
    """ln 2 * scale: ln 2 = 2 atanh(1/3), atanh(1/3) = sum 1 / ((2k+1) 3^(2k+1))."""
    total, power, k = 0, scale // 3, 1
    while power:
        total += power // k
        power //= 9
        k += 2
    return 2 * total


_SCALE = 1 << (_BITS + 16)
PI = Fraction(4 * (4 * _arctan_inverse(5, _SCALE) - _arctan_inverse(239, _SCALE)), _SCALE)  # Machin
LN2 = Fraction(_ln2(_SCALE), _SCALE)


def split(value: Fraction, dtype: type, head_bits: int) -> tuple[float, float]:
    """(head, tail): head is value rounded to ``head_bits`` significant bits, tail the float
    nearest to value - head."""
    exponent = 0
    magnitude = abs(value)
    while magnitude >= 2:
        magnitude /= 2
        exponent += 1
    while magnitude < 1:
        magnitude *= 2
        exponent -= 1
    head = Fraction(round(value / Fraction(2) ** (exponent - head_bits + 1))) * Fraction(2) ** (
        exponent - head_bits + 1
    )
    return float(dtype(float(head))), float(dtype(float(value - head)))


def nearest(value: Fraction, dtype: type) -> float:
    return float(dtype(float(value)))


def parts(value: Fraction, dtype: type, count: int) -> list[float]:
    """value as ``count`` non-overlapping floats of ``dtype`` (each the nearest to what is left)."""
    out = []
    for _ in range(count):
        piece = dtype(float(value))
        out.append(float(piece))
        value -= Fraction(float(piece))
    return out


F32, F64 = np.float32, np.float64
