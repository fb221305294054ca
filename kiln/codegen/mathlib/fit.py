"""Where mathlib's polynomial coefficients come from: weighted minimax fits (Remez exchange).

Run ``python -m kiln.codegen.mathlib.fit`` (needs mpmath) to recompute every coefficient
table the routines use; each table in the routine modules names the fit it came from. The fits
run in 50-digit arithmetic on a dense grid; the printed coefficients are rounded to the target
precision (float32 tables to float32, float64 tables to float64), and the tests measure the
errors of the routines that use them, so nothing here is trusted on its own.
"""

from __future__ import annotations

import sys

import mpmath as mp

mp.mp.dps = 50


def remez(target, weight, degree: int, lo: float, hi: float, iterations: int = 12, grid: int = 3000) -> list:
    """Coefficients c0..c_degree minimizing max |weight(x) * (target(x) - sum c_i x^i)| on [lo, hi]."""
    xs = [_nonzero(mp.mpf(lo) + (mp.mpf(hi) - lo) * (1 - mp.cos(mp.pi * i / (grid - 1))) / 2) for i in range(grid)]
    fs = [target(x) for x in xs]
    ws = [weight(x) for x in xs]
    n = degree + 1
    nodes = [_nonzero(mp.mpf(lo) + (mp.mpf(hi) - lo) * (1 - mp.cos(mp.pi * i / n)) / 2) for i in range(n + 1)]
    coeffs = None
    for _ in range(iterations):
        # solve sum c_i x^i + (-1)^k E / w(x) = f(x) at the n + 1 reference points
        matrix = mp.matrix(n + 1, n + 1)
        rhs = mp.matrix(n + 1, 1)
        for k, x in enumerate(nodes):
            for i in range(n):
                matrix[k, i] = x**i
            matrix[k, n] = (-1) ** k / weight(x)
            rhs[k] = target(x)
        solution = mp.lu_solve(matrix, rhs)
        coeffs = [solution[i] for i in range(n)]
        errors = [w * (f - _horner(coeffs, x)) for x, f, w in zip(xs, fs, ws)]
        nodes = _alternating_extrema(xs, errors, n + 1) or nodes
    assert coeffs is not None, "remez needs at least one iteration"
    return coeffs


def _horner(coeffs, x):
    # sum c_i x^i (mpmath 1.4 deprecates polyval's descending order, which 1.3 alone accepts)
    total = mp.mpf(0)
    for c in reversed(coeffs):
        total = total * x + c
    return total


def _nonzero(x):
    # the targets are quotients like (expm1(r) - r) / r**2: evaluate them just beside 0
    return x if abs(x) > mp.mpf(10) ** -30 else mp.mpf(10) ** -30


def _alternating_extrema(xs, errors, count):
    segments = []  # (index of the largest |error|) per run of equal sign
    for i, e in enumerate(errors):
        if segments and (e >= 0) == (errors[segments[-1]] >= 0):
            if abs(e) > abs(errors[segments[-1]]):
                segments[-1] = i
        else:
            segments.append(i)
    if len(segments) < count:
        return None
    while len(segments) > count:  # drop the smaller end until the reference has the right size
        if abs(errors[segments[0]]) < abs(errors[segments[-1]]):
            segments.pop(0)
        else:
            segments.pop()
    return [xs[i] for i in segments]


def max_error(coeffs, target, weight, lo, hi, points=4000) -> float:
    xs = [_nonzero(mp.mpf(lo) + (mp.mpf(hi) - lo) * i / (points - 1)) for i in range(points)]
    return float(max(abs(weight(x) * (target(x) - _horner(coeffs, x))) for x in xs))


def _sqrt(z):
    return mp.sqrt(z)


_LN2_HALF = mp.log(2) / 2
_F_LO, _F_HI = mp.sqrt(0.5) - 1, mp.sqrt(2) - 1  # log's reduced argument f = m - 1, m in [sqrt(1/2), sqrt(2))
_S_MAX = _F_HI / (2 + _F_HI)  # s = f / (2 + f)
_TRIG_Z = (mp.pi / 4 * mp.mpf("1.0001")) ** 2  # r in [-pi/4, pi/4] plus rounding slack, z = r^2

#: name -> (target g, weight w, lo, hi): fit g on [lo, hi] (degrees in DEGREES)
#: minimizing max |w * error|; the weight turns the error of g into the error of the routine's result.
FITS = {
    # exp(r) = 1 + expm1(r), expm1(r) = r + r^2 Q(r) on |r| <= ln2/2 (relative to expm1: the stricter)
    "EXPM1_Q": (lambda r: (mp.expm1(r) - r) / r**2, lambda r: r**2 / abs(mp.expm1(r)), -_LN2_HALF, _LN2_HALF),
    # log1p(f) = f + f^2 Q(f) for f in [sqrt(1/2) - 1, sqrt(2) - 1] (float32)
    "LOG1P_Q": (lambda f: (mp.log1p(f) - f) / f**2, lambda f: f**2 / abs(mp.log1p(f)), _F_LO, _F_HI),
    # log1p(f) = 2 atanh(s) = 2 s + s R(z), R(z) = z P(z), z = s^2 (float64)
    "LOG_P": (lambda z: (2 * mp.atanh(_sqrt(z)) - 2 * _sqrt(z)) / _sqrt(z) / z, lambda z: z / 2, 0, _S_MAX**2),
    # pow's double-double log: 2 atanh(s) = 2s + (2/3) s^3 + s^3 z P1(z), the 2/3 exact (float64)
    "LOG_P1": (
        lambda z: ((2 * mp.atanh(_sqrt(z)) - 2 * _sqrt(z)) / _sqrt(z) ** 3 - mp.mpf(2) / 3) / z,
        lambda z: z * z / 2,
        _S_MAX**2 / 10**4,
        _S_MAX**2,
    ),
    # tanh(x) = x + x^3 P(x^2) for |x| < 0.625
    "TANH_P": (
        lambda t: (mp.tanh(_sqrt(t)) - _sqrt(t)) / t**1.5,
        lambda t: t**1.5 / mp.tanh(_sqrt(t)),
        0,
        mp.mpf(0.625) ** 2,
    ),
    # erf(x) = x P(x^2) for |x| < 1
    "ERF_SMALL": (lambda t: mp.erf(_sqrt(t)) / _sqrt(t), lambda t: _sqrt(t) / mp.erf(_sqrt(t)), 0, 1),
    # sin(r) = r + r^3 S(r^2), cos(r) = 1 - r^2/2 + r^4 C(r^2) for |r| <= pi/4
    "SIN_S": (lambda z: (mp.sin(_sqrt(z)) - _sqrt(z)) / z**1.5, lambda z: z**1.5 / mp.sin(_sqrt(z)), 0, _TRIG_Z),
    "COS_C": (lambda z: (mp.cos(_sqrt(z)) - 1 + z / 2) / z**2, lambda z: z**2, _TRIG_Z / 10**4, _TRIG_Z),
}


def _erfc_log_fit(lo, hi):
    # erfc(x) = exp(-x^2 + S(x)) for x in [lo, hi], S fitted in u = (x - mid) / half in [-1, 1] so Horner
    # stays well conditioned; the error of S is the relative error of erfc, weighted by erfc / erf
    mid, half = (mp.mpf(lo) + hi) / 2, (mp.mpf(hi) - lo) / 2

    def target(u):
        x = mid + half * u
        return mp.log(mp.erfc(x)) + x * x

    def weight(u):
        x = mid + half * u
        return mp.erfc(x) / mp.erf(x)

    return target, weight, -1, 1


DEGREES = {  # name -> (float32 degree, float64 degree); None: that precision does not use the fit
    "EXPM1_Q": (4, 10),
    "LOG1P_Q": (8, None),
    "LOG_P": (None, 7),
    "LOG_P1": (None, 6),
    "TANH_P": (None, 11),
    "ERF_SMALL": (6, 12),
    "ERFC_LOG": (7, 20),
    "SIN_S": (3, 6),  # float32 sin/cos are evaluated in float64
    "COS_C": (3, 6),
}
ERFC_RANGE = {32: (1, 4), 64: (1, 6)}  # erfc(4) < 2^-25 and erfc(6) < 2^-54: erf rounds to 1 beyond


def main() -> None:
    import numpy as np  # noqa: PLC0415

    only = set(sys.argv[1:])
    for name, (d32, d64) in DEGREES.items():
        if only and name not in only:
            continue
        for bits, degree in ((32, d32), (64, d64)):
            if degree is None:
                continue
            target, weight, lo, hi = _erfc_log_fit(*ERFC_RANGE[bits]) if name == "ERFC_LOG" else FITS[name]
            coeffs = remez(target, weight, degree, lo, hi, grid=1500)
            err = max_error(coeffs, target, weight, lo, hi, 2000)
            cast = np.float32 if bits == 32 else np.float64
            values = ", ".join(repr(float(cast(float(c)))) for c in coeffs)
            print(f"{name}_F{bits} = ({values})  # weighted error 2^{float(mp.log(err, 2)):.1f}", flush=True)


if __name__ == "__main__":
    main()
