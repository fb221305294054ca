"""The benchmark machinery on tiny configurations: timings, ratios, targets, table, JSON, CLI.

Correctness of what is reported only; no assertion here depends on how fast anything is.
"""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from benchmarks import common, compile_latency, eager_overhead, run, train_steps
from benchmarks.common import Result, Settings, Target, Timing

TINY = Settings(repeats=3, min_repeat_ns=100_000, warmup=1)


@pytest.fixture
def tiny(monkeypatch):
    """Measure with a few short repeats, so the real workloads run in well under a second each."""
    monkeypatch.setattr(common, "QUICK", TINY)


def timing(median_ns: float, q1_ns: float | None = None, q3_ns: float | None = None) -> Timing:
    return Timing(median_ns, q1_ns or median_ns, q3_ns or median_ns, repeats=3, inner=10)


def fake_results() -> list[Result]:
    return [
        Result("w", "tiny op", "kiln", timing(3000, 2900, 3100)),
        Result("w", "tiny op", "torch", timing(1000)),
        Result("w", "tiny op", "numpy", timing(250)),
        Result("w", "big op", "kiln", timing(2e6)),
        Result("w", "big op", "numpy", timing(1e6)),
        common.skipped("w", "big op", "torch", "torch is not installed"),
    ]


def test_measure_reports_per_call_quantiles(tiny):
    calls = []
    t = common.measure(lambda: calls.append(None), quick=True)
    assert t.repeats == TINY.repeats
    assert t.inner >= 1
    assert 0 < t.q1_ns <= t.median_ns <= t.q3_ns
    assert t.iqr_ns == pytest.approx(t.q3_ns - t.q1_ns)
    # Calibration, warm-up and the timed repeats all ran the statement; the last ones `inner` times each.
    assert len(calls) >= (TINY.warmup + TINY.repeats) * t.inner


@pytest.mark.parametrize("interleave", [True, False])
def test_compare_times_every_candidate(tiny, interleave):
    ns = {"a": [1.0] * 1000}
    timings = common.compare({"sum": ("sum(a)", ns), "len": ("len(a)", ns)}, quick=True, interleave=interleave)
    assert set(timings) == {"sum", "len"}
    assert all(t.repeats == TINY.repeats and t.median_ns > 0 for t in timings.values())


def test_summarize_median_and_quartiles_by_hand():
    t = common._summarize([1.0, 2.0, 3.0, 4.0, 5.0], inner=7)
    assert (t.q1_ns, t.median_ns, t.q3_ns, t.repeats, t.inner) == (2.0, 3.0, 4.0, 5, 7)
    assert common._summarize([9.0], inner=1) == Timing(9.0, 9.0, 9.0, 1, 1)


def test_ratios_are_kiln_over_each_reference():
    found = common.ratios(fake_results())
    assert found == {("w", "tiny op", "torch"): 3.0, ("w", "tiny op", "numpy"): 12.0, ("w", "big op", "numpy"): 2.0}


def test_targets_met_missed_and_skipped():
    targets = [
        Target("w", "tiny op", "torch", 4.0),
        Target("w", "big op", "numpy", 1.2),
        Target("w", "big op", "torch", 1.0),
    ]
    checks = common.check_targets(fake_results(), targets)
    assert [(c.ratio, c.status) for c in checks] == [(3.0, "met"), (2.0, "MISSED"), (None, "skipped")]
    text = common.format_targets(checks)
    assert "tiny op: kiln/torch <= 4x" in text and "3.00x" in text and "MISSED" in text


def test_format_time_units():
    assert [common.format_time(ns) for ns in (812, 1360, 4.21e6, 1.2e9)] == ["812 ns", "1.36 us", "4.21 ms", "1.2 s"]


def test_table_rows_ratios_and_skips():
    lines = common.format_table(fake_results()).splitlines()
    assert lines[0].split() == ["workload", "case", "impl", "median", "IQR", "kiln/impl", "note"]
    assert len(lines) == 2 + len(fake_results())  # header, rule, one line per result
    torch_tiny = next(line for line in lines if "tiny op" in line and "torch" in line)
    assert "1 us" in torch_tiny and "3.00x" in torch_tiny
    kiln_tiny = next(line for line in lines if "tiny op" in line and "kiln" in line)
    assert "3 us" in kiln_tiny and "200 ns" in kiln_tiny and "x" not in kiln_tiny.split("kiln", 1)[1]
    torch_big = next(line for line in lines if "big op" in line and "torch" in line)
    assert "skipped" in torch_big and "torch is not installed" in torch_big


def test_json_round_trip(tmp_path):
    checks = common.check_targets(fake_results(), [Target("w", "tiny op", "torch", 4.0)])
    path = common.write_json(tmp_path / "sub" / "out.json", fake_results(), checks)
    data = json.loads(path.read_text())
    assert set(data) == {"environment", "results", "targets"}
    assert data["environment"]["kiln_threads"] >= 1
    first = data["results"][0]
    summary = (first["impl"], first["timing"]["median_ns"], first["iqr_ns"], first["kiln_ratio"])
    assert summary == ("kiln", 3000, 200, None)
    assert data["results"][1]["kiln_ratio"] == 3.0
    assert data["results"][-1]["timing"] is None and data["results"][-1]["note"] == "torch is not installed"
    assert data["targets"] == [
        {"workload": "w", "case": "tiny op", "reference": "torch", "max_ratio": 4.0, "ratio": 3.0, "status": "met"}
    ]


@pytest.fixture
def fake_workload(monkeypatch):
    """A registered workload ``fake`` whose results and targets are known in advance."""
    module = types.ModuleType("fake_workload")
    module.run = lambda quick: fake_results() if quick else []
    module.TARGETS = [Target("w", "big op", "numpy", 1.2)]
    monkeypatch.setitem(sys.modules, "fake_workload", module)
    monkeypatch.setitem(run.WORKLOADS, "fake", "fake_workload")


def test_cli_prints_table_targets_and_writes_json(fake_workload, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert run.main(["--quick", "--json", str(out), "fake"]) == 0
    printed = capsys.readouterr().out
    assert "tiny op" in printed and "3.00x" in printed and "big op: kiln/numpy <= 1.2x" in printed
    data = json.loads(out.read_text())
    assert len(data["results"]) == len(fake_results())
    assert data["targets"][0]["status"] == "MISSED"
    # --strict turns a missed target into a failing exit status.
    assert run.main(["--quick", "--strict", "--json", str(out), "fake"]) == 1


def test_cli_rejects_unknown_workload(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run.main(["no_such_workload"])
    assert exit_info.value.code == 2
    assert (
        "unknown workload(s) no_such_workload; expected any of: eager_overhead, train_steps, compile"
        in capsys.readouterr().err
    )


def test_eager_overhead_quick_run(tiny, tmp_path, capsys):
    out = tmp_path / "latest.json"
    assert run.main(["--quick", "--json", str(out), "eager_overhead"]) == 0
    data = json.loads(out.read_text())
    cases = [eager_overhead.ADD_TINY, eager_overhead.ADD_TINY_GRAD, eager_overhead.ADD_LARGE, eager_overhead.MATMUL]
    by_key = {(r["case"], r["impl"]): r for r in data["results"]}
    for case in cases:
        kiln_result = by_key[(case, "kiln")]
        assert kiln_result["timing"] is not None, kiln_result["note"]  # kiln must run every case
        assert kiln_result["params"]["threads"] == data["environment"]["kiln_threads"]
        assert (case, "torch") in by_key  # timed, or skipped with a reason when torch is missing
        assert ((case, "numpy") in by_key) == (case != eager_overhead.ADD_TINY_GRAD)
    assert [(t["case"], t["reference"]) for t in data["targets"]] == [
        (t.case, t.reference) for t in eager_overhead.TARGETS
    ]
    assert all(t["status"] in ("met", "MISSED") for t in data["targets"])
    printed = capsys.readouterr().out
    assert all(case in printed for case in cases)


def test_eager_overhead_cases_compute_the_same_values():
    """Every implementation is timed on the same numbers: check kiln's answer against numpy's."""
    import numpy as np

    import kiln

    for case in (eager_overhead.ADD_TINY, eager_overhead.ADD_LARGE, eager_overhead.MATMUL):
        x, y, stmt = eager_overhead._inputs(case)
        expected = eval(stmt, {"x": x, "y": y})
        actual = eval(stmt, {"x": kiln.from_numpy(x), "y": kiln.from_numpy(y)})
        np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-5, atol=1e-4)


def test_train_steps_quick_run(tiny, tmp_path, capsys):
    out = tmp_path / "latest.json"
    assert run.main(["--quick", "--json", str(out), "train_steps"]) == 0
    data = json.loads(out.read_text())
    by_key = {(r["case"], r["impl"]): r for r in data["results"]}
    for case in (train_steps.MLP, train_steps.CNN):
        kiln_result = by_key[(case, "kiln")]
        assert kiln_result["timing"] is not None
        assert kiln_result["note"].endswith(" steps/s") and kiln_result["params"]["batch"] == 64
        assert (case, "torch") in by_key  # timed, or skipped with a reason when torch is missing
    printed = capsys.readouterr().out
    assert all(case in printed for case in (train_steps.MLP, train_steps.CNN))


@pytest.mark.parametrize("case", [train_steps.MLP, train_steps.CNN])
def test_train_steps_kiln_and_torch_take_the_same_steps(torch, case):
    """Same weights, same batch, same Adam: the losses of three steps agree, so the same work is timed."""
    found = train_steps.setups(case, torch)
    (kiln_step, _), (torch_step, _) = found["kiln"], found["torch"]
    for _ in range(3):
        np.testing.assert_allclose(kiln_step().item(), torch_step().item(), rtol=1e-4, atol=1e-5)


def test_compile_quick_run(tiny, tmp_path, capsys):
    out = tmp_path / "latest.json"
    assert run.main(["--quick", "--json", str(out), "compile"]) == 0
    data = json.loads(out.read_text())
    by_key = {(r["case"], r["impl"]): r for r in data["results"]}
    cl = compile_latency
    cases = [cl.STEP_CALL1, cl.STEP_COMPILE, cl.STEP_WARMUP, cl.STEP_STEADY, cl.TRIVIAL_COMPILE, cl.TRIVIAL]
    for case in cases:
        kiln_result = by_key[(case, "kiln")]
        assert kiln_result["timing"] is not None and kiln_result["timing"]["median_ns"] > 0
        assert "WARNING" not in kiln_result["note"]  # call 1 not cached, call 2 compiled, as the cases say
    for case in (cl.STEP_STEADY, cl.TRIVIAL):
        assert by_key[(case, cl.KILN_EAGER)]["timing"] is not None
        assert by_key[(case, cl.KILN_EAGER)]["kiln_ratio"] > 0
    # --quick skips torch.compile and says so; jax.jit is timed or skipped with a reason.
    for case in (cl.STEP_COMPILE, cl.STEP_STEADY, cl.TRIVIAL):
        assert by_key[(case, "torch.compile")]["timing"] is None
        assert by_key[(case, "torch.compile")]["note"] in (cl.QUICK_SKIP, "torch is not installed")
        assert (case, "jax.jit") in by_key
    printed = capsys.readouterr().out
    assert all(case in printed for case in cases) and "skipped in --quick" in printed


def test_compile_kiln_steps_compiled_and_eager_agree():
    """The compiled step is the eager step: same losses over four steps from the same weights."""
    import kiln

    compiled, _, _ = compile_latency.kiln_setup()
    compiled = kiln.compile(compiled)
    eager, _, _ = compile_latency.kiln_setup()
    for _ in range(4):
        np.testing.assert_allclose(compiled().numpy(), eager().numpy(), rtol=1e-4, atol=1e-6)
    assert [e.kind for e in compiled.state.events] == ["not cached", "compiled"]


def test_compile_kiln_and_torch_take_the_same_steps(torch):
    """Same weights, batch and Adam: kiln's and PyTorch's losses agree, so the same work is timed."""
    kiln_step, weights, data = compile_latency.kiln_setup()
    torch_step = compile_latency.torch_setup(torch, weights, data)
    for _ in range(3):
        np.testing.assert_allclose(kiln_step().numpy(), torch_step().numpy(), rtol=1e-4, atol=1e-5)


def test_compile_jax_step_matches_kiln():
    """The JAX step (Adam written out by hand) takes the same steps as kiln's, when jax is installed."""
    jax = pytest.importorskip("jax")
    kiln_step, weights, data = compile_latency.kiln_setup()
    _, jax_step = compile_latency.jax_setup(jax, weights, data)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(jax_step()), kiln_step().numpy(), rtol=1e-4, atol=1e-5)
