"""Telling a float32 conditioning artefact from a silent difference: the same program in float64.

A float32 program can amplify rounding past any fixed tolerance where it is ill-conditioned
(``BatchNorm1d(1)`` over 3 samples divides by a standard deviation near 0: seed 5150003230), and
a compiled program that merely rounds differently from eager then differs by more than the
tolerance. Such a difference shrinks with the precision: run eagerly and compiled in float64, the
same program agrees. A wrong result does not: a wrong formula, a lost update or a skipped write
differs in float64 as much as in float32. So a float32 value difference that is gone when the
program runs in float64 (every float32 dtype spelled float64, the default dtype float64, the
float64 tolerance) is reported apart, as an artefact, and not counted as a silent difference.

Programs with float16 or bfloat16 are never rechecked: their roundings are part of what they
test (a cast to half and back that the compiled program dropped would vanish in float64).

>>> print(in_float64_source("x = kiln.zeros(3, dtype=kiln.float32)\\ny = x.float() * 2"))
x = kiln.zeros(3, dtype=kiln.float64)
y = x.double() * 2
"""

from __future__ import annotations

import dataclasses
import re

import kiln

from .generator import Program

NUMERIC_CHECKS = ("value", "grad")  # the comparisons whose failure can be rounding
FLOAT64_RTOL = 1e-8  # the generators' float64 tolerance for whole programs (models, optim, loops)
_HALF = re.compile(r"kiln\.(float16|half|bfloat16)\b|\.(half|bfloat16)\(\)")
_FLOAT32 = ((re.compile(r"kiln\.(float32|float)\b"), "kiln.float64"), (re.compile(r"\.float\(\)"), ".double()"))
# the parts of a program that are source lines (op programs and scenarios: see Program, Scenario)
_SOURCE_FIELDS = ("inputs", "captures", "body", "preamble", "setup", "actions")


def in_float64_source(text: str) -> str:
    """``text`` with every float32 dtype and cast spelled float64."""
    for pattern, replacement in _FLOAT32:
        text = pattern.sub(replacement, text)
    return text


def in_float64(program: Program) -> Program | None:
    """The same program in float64 (its float32 made without a dtype comes from the default dtype:
    see ``is_conditioning_artefact``), or None where it has half precision."""
    if _HALF.search(program.source):
        return None
    changes: dict = {"float_dtype": "float64", "rtol": FLOAT64_RTOL}
    for name in _SOURCE_FIELDS:
        lines = getattr(program, name, None)
        if lines is not None:
            changes[name] = [in_float64_source(line) for line in lines]
    return dataclasses.replace(program, **changes)


def is_conditioning_artefact(outcome, backend: str = "llvm") -> bool:
    """Whether ``outcome``'s finding is a float32 value difference that the program, run in float64,
    does not show (eager and compiled both in float64, with the default dtype float64)."""
    from .runner import run  # noqa: PLC0415 - the runner's stateful part imports this package's modules

    difference = outcome.difference
    if difference is None or difference.check not in NUMERIC_CHECKS:
        return False
    program = in_float64(outcome.program)
    if program is None:
        return False
    default = kiln.get_default_dtype()
    kiln.set_default_dtype(kiln.float64)  # tensors made without a dtype (kiln.full, nn layers)
    try:
        return not run(program, backend).finding
    finally:
        kiln.set_default_dtype(default)
