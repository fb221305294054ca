"""The fitting tool (``kiln.codegen.mathlib.fit``) reproduces the tables the routines use.

The tool needs mpmath, which ``pip install -e ".[dev]"`` installs; it is not needed at run time.
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.codegen.mathlib import exp_log, fit, trig


@pytest.mark.parametrize(
    "name, degree, table",
    [("SIN_S", 3, trig.SIN_S[32]), ("EXPM1_Q", 4, exp_log.EXPM1_Q_F32)],
)
def test_refitting_gives_the_stored_float32_table(name, degree, table):
    target, weight, lo, hi = fit.FITS[name]
    coeffs = fit.remez(target, weight, degree, lo, hi, grid=1500)  # as ``python -m ...fit`` runs it
    assert [float(np.float32(float(c))) for c in coeffs] == list(table)
    # The fit's weighted error is below float32's half ulp: the table is as good as its degree allows.
    assert fit.max_error(coeffs, target, weight, lo, hi, 2000) < 2.0**-24
