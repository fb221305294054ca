"""Helpers for the pass tests: run a pass, compare its text with the expected IR, verify it, and
check that it computes what the input graph computes, bit for bit."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence

import numpy as np

from kiln.ir.graph import Graph
from kiln.ir.interpreter import interpret
from kiln.ir.verifier import verify

#: Floats that break wrong identities: signed zeros, infinities, nan, tiny and huge values.
SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.5, -0.5, np.inf, -np.inf, np.nan, 1e-30, 1e30, -3e38]


def special(shape: tuple[int, ...], dtype=np.float32, shift: int = 0) -> np.ndarray:
    """An array of ``shape`` cycling through ``SPECIAL`` (rotated by ``shift``)."""
    n = int(np.prod(shape))
    values = [SPECIAL[(i + shift) % len(SPECIAL)] for i in range(n)]
    with np.errstate(over="ignore"):  # 1e30 and -3e38 are inf in float16, as intended
        return np.array(values).astype(dtype).reshape(shape)


def assert_identical(actual: np.ndarray, expected: np.ndarray) -> None:
    """Same dtype, shape and values; nan matches nan, and 0.0 and -0.0 differ."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual, expected)
    np.testing.assert_array_equal(actual, expected, strict=True)
    if actual.dtype.kind == "f":
        numbers = ~np.isnan(expected)  # the sign of a nan carries no meaning
        np.testing.assert_array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers]))


def assert_same_results(before: Graph, after: Graph, inputs: Sequence[np.ndarray]) -> None:
    for a, b in zip(interpret(before, inputs), interpret(after, inputs), strict=True):
        assert_identical(b, a)


def check_pass(
    run: Callable[[Graph], Graph], before: Graph, expected: str, inputs: Sequence[Sequence[np.ndarray]] = ()
) -> Graph:
    """``run(before)``: its text is ``expected``, it verifies, it leaves ``before`` untouched, and
    it gives the same results as ``before`` on each input list."""
    text_before = str(before)
    after = run(before)
    assert str(after) == textwrap.dedent(expected).lstrip("\n"), "\n" + str(after)
    verify(after)
    assert str(before) == text_before, "the pass changed its input graph"
    for args in inputs:
        assert_same_results(before, after, args)
    return after
