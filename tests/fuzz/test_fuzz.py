"""The differential fuzzer's CI profile: random programs, compiled against eager, no finding allowed.

The op programs' profile size comes from ``KILN_FUZZ_PROGRAMS`` (default 300 under CI=true, 100
otherwise; 0 skips it and the other kinds' profiles); ``-m "not fuzz"`` deselects them. The other
kinds (layers, models, optim, pystate, loops) run ``NEW_KINDS`` programs each. The large profile runs from
the command line: ``python -m tests.fuzz --programs 10000``.
"""

from __future__ import annotations

import os

import pytest

from .cli import fuzz, program_seeds

# programs per kind in CI: about 30 s together on 2 cores (measured: see the commit)
NEW_KINDS = {"layers": 30, "models": 8, "optim": 24, "pystate": 40, "loops": 10}  # loops: about 3 s each
# Classes of findings that other branches of issue 35 fix. A new kind's test whose findings are all
# of these classes calls pytest.xfail (as xfail(strict=False) would, but a finding of any other
# class still fails it, and a clean run passes). Remove an entry when its fix is merged.
KNOWN_BUGS: dict = {}  # none open: issue 35 fixed the optimizer, container and pooling classes


def profile_size() -> int:
    default = 300 if os.environ.get("CI") else 100
    return int(os.environ.get("KILN_FUZZ_PROGRAMS", default))


@pytest.mark.fuzz
@pytest.mark.skipif(profile_size() == 0, reason="KILN_FUZZ_PROGRAMS=0")
def test_compiled_programs_match_eager():
    assert os.environ.get("KILN_JIT_STRICT") == "1", "the fuzzer must see backend failures (conftest sets this)"
    # one shrunk repro per kind of finding keeps a failing run within the profile's time
    summary = fuzz(program_seeds(profile_size(), 0, "0/1"), backend="llvm", shrink_per_kind=1, shrink_budget=30)
    if summary.classes:  # pytest.fail, not assert: the report is the message, without the summary's repr
        pytest.fail("compiled differs from eager (each repro runs with python -m tests.fuzz --repro FILE):\n"
                    + summary.report(), pytrace=False)  # fmt: skip


def known_bug(key: str) -> str | None:
    return next((reason for reason, matches in KNOWN_BUGS.items() if matches(key)), None)


@pytest.mark.fuzz
@pytest.mark.skipif(profile_size() == 0, reason="KILN_FUZZ_PROGRAMS=0")
@pytest.mark.parametrize("kind", sorted(NEW_KINDS))
def test_new_kinds_match_eager(kind):
    """Layers, whole models, optimizers, Python state and loops: no finding but the known bugs' (xfail)."""
    summary = fuzz(program_seeds(NEW_KINDS[kind], 0, "0/1"), kinds=(kind,), shrink_per_kind=2, shrink_budget=8)
    unknown = [key for key in summary.classes if known_bug(key) is None]
    if unknown:
        pytest.fail(f"compiled differs from eager in {len(unknown)} new classes: {unknown}\n" + summary.report(),
                    pytrace=False)  # fmt: skip
    if summary.classes:
        reasons = sorted({known_bug(key) for key in summary.classes})
        pytest.xfail(f"known bugs (issue 35, fixed on other branches): {'; '.join(reasons)}")


def test_the_fuzzer_sees_a_planted_difference(monkeypatch):
    """The instrument itself: a compiled copy that adds 1e-3 to float results must be reported."""
    import kiln

    from .generator import generate
    from .runner import run

    original = kiln.compile

    def skewed(fn, **kwargs):
        compiled = original(fn, **kwargs)

        def call(*args):
            out = compiled(*args)
            outs = out if isinstance(out, tuple) else (out,)
            shifted = tuple(o + 1e-3 if isinstance(o, kiln.Tensor) and o.dtype == kiln.float64 else o for o in outs)
            return shifted if isinstance(out, tuple) else shifted[0]

        call.state = compiled.state
        return call

    monkeypatch.setattr(kiln, "compile", skewed)
    outcomes = [run(generate(seed)) for seed in range(40)]
    float64_results = [o for o in outcomes if o.program.float_dtype == "float64"]
    assert float64_results, "the first 40 programs should include float64 ones"
    assert any(o.difference is not None and o.difference.check in ("value", "aliasing") for o in float64_results)


def test_the_fuzzer_reports_nothing_when_compiled_is_eager(monkeypatch):
    """The harness adds no difference of its own: with KILN_JIT=0 both copies run eagerly."""
    from .generator import generate
    from .runner import run

    monkeypatch.setenv("KILN_JIT", "0")
    outcomes = [run(generate(seed)) for seed in range(60)]
    assert [str(o.difference or o.crash) for o in outcomes if o.finding] == []
    assert sum(o.calls["fallback"] for o in outcomes) > 0  # every call ran eagerly, none compiled


def test_a_compiled_only_crash_is_reported_with_where_it_raised(monkeypatch):
    """A crash of the compiled copy keeps its innermost frames, and the summary prints them even with
    --quiet: a crash that depends on the process's history may not come back on --replay."""
    import kiln

    from .cli import Summary
    from .generator import generate
    from .runner import run

    original = kiln.compile

    def crashing(fn, **kwargs):
        compiled = original(fn, **kwargs)

        def planted_failure(*args):
            raise AttributeError("'NoneType' object has no attribute '_data'")

        planted_failure.state = compiled.state
        return planted_failure

    monkeypatch.setattr(kiln, "compile", crashing)
    outcome = run(generate(3))
    assert outcome.crash and "AttributeError" in outcome.crash
    assert "planted_failure" in outcome.crash_trace
    summary = Summary()
    summary.add(outcome)
    assert "planted_failure" in summary.report(repros=False)
