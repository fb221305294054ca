"""The float64 recheck: a float32 conditioning artefact is listed apart, a real difference is not."""

from __future__ import annotations

import kiln

from .cli import fuzz
from .generator import generate as generate_ops
from .kinds import GENERATORS, generate
from .recheck import in_float64, in_float64_source, is_conditioning_artefact
from .runner import run

ARTEFACT_SEED = 5150003230  # BatchNorm1d(1) over 3 samples, float32: rounding amplified past tolerance


def test_float32_spellings_become_float64():
    text = "x = kiln.ones(2, dtype=kiln.float32).float()\nm = nn.Linear(2, 2).to(kiln.float)\ny = x.floatish"
    assert in_float64_source(text) == (
        "x = kiln.ones(2, dtype=kiln.float64).double()\nm = nn.Linear(2, 2).to(kiln.float64)\ny = x.floatish"
    )


def test_programs_with_half_precision_are_not_rechecked():
    seeds = [s for s in range(200) if "float16" in generate_ops(s).source][:3]
    assert seeds, "the first 200 op programs should include float16 ones"
    assert all(in_float64(generate_ops(s)) is None for s in seeds)
    plain = next(generate_ops(s) for s in range(200) if "float16" not in generate_ops(s).source)
    assert "float32" not in in_float64(plain).source


def test_an_ill_conditioned_float32_difference_is_an_artefact_not_a_finding():
    program = generate(ARTEFACT_SEED, tuple(GENERATORS))
    outcome = run(program)
    # (if compiled float32 ever rounds as eager does here, pick another seed: the finding is the premise)
    assert outcome.difference is not None and outcome.difference.check == "value", outcome.difference
    assert is_conditioning_artefact(outcome)
    assert kiln.get_default_dtype() == kiln.float32  # restored after the float64 run
    summary = fuzz([ARTEFACT_SEED], kinds=tuple(GENERATORS), shrink=False)
    assert summary.classes == {} and summary.mismatches == 0
    assert [o.program.seed for o in summary.artefacts] == [ARTEFACT_SEED]
    assert "float32 conditioning artefacts" in summary.report() and "1 float32 artefacts" in summary.report()


def test_a_difference_that_float64_shows_too_stays_a_finding(monkeypatch):
    """A compiled copy 1% off in every float result (a wrong result, not rounding) differs in float64 too."""
    original = kiln.compile

    def skewed(fn, **kwargs):
        compiled = original(fn, **kwargs)

        def call(*args):
            out = compiled(*args)
            outs = out if isinstance(out, tuple) else (out,)
            off = tuple(o * 1.01 if isinstance(o, kiln.Tensor) and o.is_floating_point() else o for o in outs)
            return off if isinstance(out, tuple) else off[0]

        call.state = compiled.state
        return call

    monkeypatch.setattr(kiln, "compile", skewed)
    float32 = [s for s in range(60) if generate_ops(s).float_dtype == "float32"]
    outcomes = [run(generate_ops(s)) for s in float32[:12]]
    found = [o for o in outcomes if o.difference is not None and o.difference.check == "value"]
    assert any(in_float64(o.program) is not None for o in found), "a 1% skew of float32 results should be found"
    assert not any(is_conditioning_artefact(o) for o in found)
