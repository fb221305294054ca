"""The ``eager`` and ``compile_cost`` benchmark workloads (issues 34 and 33) at tiny sizes: the
structure of their results, the loss-equality check, the targets and summaries. No assertion here
depends on how fast anything is."""

from __future__ import annotations

import json
import types
from dataclasses import replace

import numpy as np
import pytest

import kiln
from benchmarks import common, compile_cost, eager_overhead, eager_steps, programs, run
from benchmarks.common import Result, Settings, Timing

TINY = Settings(repeats=3, min_repeat_ns=100_000, warmup=1)


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    """A few short repeats, and run-wide options put back after each test."""
    monkeypatch.setattr(common, "QUICK", TINY)
    saved = common.Options(**vars(common.OPTIONS))
    yield
    for name, value in vars(saved).items():
        setattr(common.OPTIONS, name, value)


def timed(workload: str, case: str, impl: str, ms: float, **params) -> Result:
    return Result(workload, case, impl, Timing(ms * 1e6, ms * 1e6, ms * 1e6, 3, 1), params=params)


# ----------------------------------------------------------------------------- the programs
@pytest.mark.parametrize("name", sorted(programs.PROGRAMS))
def test_programs_take_the_same_steps_in_kiln_and_torch(torch, name):
    """Every program, dropout off, from kiln's weights: PyTorch's losses equal kiln's, eager and compiled."""
    program = programs.PROGRAMS[name]
    sizes = program.sizes[True]
    batch_list = programs.batches(program, sizes, 2)
    ours = programs.setup(program, kiln, sizes, dropout=False)
    theirs = programs.setup(program, torch, sizes, dropout=False, reference=ours)
    compiled = kiln.compile(programs.setup(program, kiln, sizes, dropout=False).step)
    expected = programs.losses(programs.cycling(theirs.step, programs.on(torch, batch_list)), 3)
    eager = programs.losses(programs.cycling(ours.step, programs.on(kiln, batch_list)), 3)
    found = programs.losses(programs.cycling(compiled, programs.on(kiln, batch_list)), 3)
    assert expected.shape == (3, 2 if name == "dcgan" else 1)
    assert not np.allclose(expected[0], expected[-1])  # the steps train: the losses move
    np.testing.assert_allclose(eager, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-5)


def test_batches_are_the_same_numbers_and_the_last_may_be_smaller():
    program = programs.PROGRAMS["lstm_lm"]
    sizes = program.sizes[True]
    first, again = programs.batches(program, sizes, 3, last_rows=1), programs.batches(program, sizes, 3, last_rows=1)
    assert [len(b[0]) for b in first] == [sizes["batch"], sizes["batch"], 1]
    assert all(np.array_equal(a, b) for x, y in zip(first, again, strict=True) for a, b in zip(x, y, strict=True))
    idx, targets = first[0]
    np.testing.assert_array_equal(idx[:, 1:], targets[:, :-1])  # next-token targets


# ----------------------------------------------------------------------------- eager
def test_eager_check_catches_a_loss_that_differs(torch):
    """A torch program whose losses are not kiln's is a FAIL, not a pass."""
    program = programs.PROGRAMS["mlp"]

    def build(lib, sizes, dropout):  # PyTorch's losses reported 1% high
        built = program.build(lib, sizes, dropout)
        if lib is kiln:
            return built
        return programs.Setup(built.modules, lambda *batch: built.step(*batch) * 1.01)

    assert eager_steps.check_losses(program, program.sizes[True], torch).startswith("ok: eager ok")
    verdict = eager_steps.check_losses(replace(program, build=build), program.sizes[True], torch)
    assert verdict.startswith("FAIL: eager FAIL") and "compiled FAIL" in verdict


def test_eager_quick_run_with_busy(torch, tmp_path, capsys, monkeypatch):
    """Two programs quiet and beside a busy core, plus the overhead cases: every row, kiln's check
    ok, the targets and the summary lines."""
    monkeypatch.setattr(eager_steps, "PROGRAMS", {k: programs.PROGRAMS[k] for k in ("mlp", "lstm_cells")})
    out = tmp_path / "eager.json"
    assert run.main(["--quick", "--in-process", "--busy", "--json", str(out), "eager"]) == 0
    data = json.loads(out.read_text())
    by_key = {(r["case"], r["impl"]): r for r in data["results"]}
    for name in ("mlp", "lstm_cells"):
        title = programs.PROGRAMS[name].title
        for suffix in ("", eager_steps.BUSY):
            for impl in ("kiln", "torch", "kiln compiled"):
                assert by_key[(title + suffix, impl)]["timing"] is not None, by_key[(title + suffix, impl)]
        assert by_key[(title, "kiln")]["check"].startswith("ok: eager ok"), by_key[(title, "kiln")]["check"]
        assert "compiled ok" in by_key[(title, "kiln")]["check"]
        assert by_key[(title, "torch")]["kiln_ratio"] > 0
    for case in eager_steps.OVERHEAD_CASES:
        assert by_key[(case, "kiln")]["timing"] is not None and (case, "torch") in by_key
    statuses = {(t["workload"], t["case"]): t["status"] for t in data["targets"]}
    assert statuses[("eager_overhead", eager_overhead.ADD_TINY)] in ("met", "MISSED")
    assert statuses[("eager", programs.PROGRAMS["mlp"].title)] in ("met", "MISSED")
    printed = capsys.readouterr().out
    assert "eager: median of kiln/torch over 2 programs" in printed and "kiln busy/quiet" in printed


def test_eager_summary_by_hand():
    mlp, gpt, cnn = (programs.PROGRAMS[k].title for k in ("mlp", "gpt", "cnn"))
    busy = eager_steps.BUSY
    results = [
        timed("eager", mlp, "kiln", 3), timed("eager", mlp, "torch", 2), timed("eager", mlp, "kiln compiled", 1),
        timed("eager", gpt, "kiln", 1), timed("eager", gpt, "torch", 1), timed("eager", gpt, "kiln compiled", 1),
        timed("eager", cnn, "kiln", 2), timed("eager", cnn, "torch", 4),
        # beside a busy core: kiln eager 2x slower, torch 1.5x, kiln compiled 1.2x
        timed("eager", mlp + busy, "kiln", 6), timed("eager", mlp + busy, "torch", 3),
        timed("eager", mlp + busy, "kiln compiled", 1.2),
    ]  # fmt: skip
    lines = eager_steps.summary(results).splitlines()
    # ratios 1.5, 1.0, 0.5: the median is 1.0
    assert lines[0] == "eager: median of kiln/torch over 3 programs 1.00x (target <= 1.1x: met)"
    assert lines[2].split() == [*mlp.split(), "2.00x", "1.50x", "1.20x", "MISSED", "met"]
    assert len(lines) == 3  # only the program timed busy has a row


# ----------------------------------------------------------------------------- compile_cost
def fake_child(compile_s: float, *, compiles=(2, 2), run_s=1.0, losses=((1.0,),)) -> dict:
    ragged = {"compiles": list(compiles), "epoch_s": [0.5, 0.1], "rows": [2, 2, 1], "events": []}
    return {"compile_s": compile_s, "compile_calls": 2, "nodes": 100, "calls": 2, "events": [], "run_s": run_s,
            "losses": [list(x) for x in losses], "compiles": 1, "ragged": ragged}  # fmt: skip


def test_compile_cost_rows_targets_and_summary_by_hand():
    found = {
        "cold": fake_child(2.0, run_s=3.0),  # 2 calls before the compiled one
        "warm": fake_child(0.5, compiles=(2, 3), run_s=1.5),
        "eager": {"run_s": 4.0, "losses": [[1.0]], "first_calls_s": [0.15, 0.05, 0.02]},
        "eager_warm": {"run_s": 1.6, "losses": [[1.0]]},  # its kernels from its cache directory
        "torch": {"run_s": 2.0, "losses": [[1.0]]},
        "length": fake_child(2.5),
        "eager_length": {"first_calls_s": [0.5, 0.3, 0.2]},  # a fresh process's first calls at T=350
        "background": {"run_s": 3.5, "losses": [[1.0]], "compiles": 1, "events": []},
    }
    results = compile_cost.rows("lstm_lm", True, found)
    names = compile_cost.cases("lstm_lm")
    by_key = {(r.case, r.impl): r for r in results}
    assert by_key[(names["cold"], "kiln")].median_ns == 2e9
    # the compile beyond the step's own work: the first call to the first compiled one, less kiln eager's
    # first two calls in a fresh process at that length
    assert by_key[(names["length"], "kiln")].median_ns == pytest.approx(1.7e9)  # 2.5 - (0.5 + 0.3)
    assert by_key[(names["length"], compile_cost.SHORT)].median_ns == pytest.approx(1.8e9)  # 2.0 - (0.15 + 0.05)
    assert by_key[(names["run"], compile_cost.WARM_RUN)].median_ns == 1.5e9
    assert by_key[(names["run"], compile_cost.EAGER_WARM)].median_ns == 1.6e9
    assert by_key[(names["ragged"], "kiln")].params["compiles"] == [2, 3]
    assert by_key[(names["run"], "kiln")].check.startswith("ok")
    assert by_key[(names["run"], compile_cost.BACKGROUND)].median_ns == 3.5e9
    assert by_key[(names["run"], compile_cost.BACKGROUND)].check.startswith("ok")
    checks = {(c.target.case, c.target.reference): c for c in common.check_targets(results, compile_cost.TARGETS)}
    assert checks[(names["cold"], None)].status == "met"  # 2 s < 3 s
    assert checks[(names["warm"], None)].status == "MISSED"  # 0.5 s > 0.3 s
    assert checks[(names["length"], compile_cost.SHORT)].value == "0.94x"  # within 1.5x: met
    assert checks[(names["run"], "kiln eager")].status == "met"  # 3 s against 4 s
    assert checks[(names["run"], "torch")].status == "MISSED"  # 3 s against 2 s
    row = compile_cost.summary(results).splitlines()[1].split("  ")
    cells = [c.strip() for c in row if c.strip()]
    assert cells == [programs.PROGRAMS["lstm_lm"].title, "2 s", "met", "500 ms", "MISSED", "2, +1", "MISSED",
                     "0.94x", "met", "3 s / 4 s / 2 s", "MISSED", "3.5 s", "MISSED", "1.5 s", "1.6 s / 2 s", "met"]  # fmt: skip


def test_compile_cost_length_row_needs_as_many_eager_first_calls():
    """The length row subtracts kiln eager's first calls; without enough of them it is not measured
    (never a compile cost that still holds the step's own work)."""
    names = compile_cost.cases("lstm_lm")
    row = compile_cost._length_row(names["length"], "kiln", fake_child(2.5), {"first_calls_s": [0.5]}, {"steps": 350})
    assert row.timing is None and "timed 1 first calls, not 2" in row.note
    failed = compile_cost._length_row(
        names["length"], "kiln", fake_child(2.5), {"error": "error: it died"}, {"steps": 350}
    )
    assert failed.timing is None and "error: it died" in failed.note


def test_compile_cost_reports_a_failed_or_hung_process(monkeypatch, tmp_path):
    monkeypatch.setattr(compile_cost, "CHILD_LIMIT_S", 0.01)
    monkeypatch.setattr(compile_cost, "ORDER", ("mlp",))
    out = compile_cost._spawn("cold", "mlp", True, str(tmp_path))
    assert out == {"error": "error: cold process timed out after 0.01 s"}
    results = compile_cost.rows("mlp", True, {"cold": out, "warm": out, "eager": out, "eager_warm": out, "torch": out})
    assert all(r.timing is None for r in results)
    assert results[0].note == out["error"]  # the table shows why
    summary_row = compile_cost.summary(results).splitlines()[1]
    assert summary_row.split("  ")[0] == programs.PROGRAMS["mlp"].title


def test_compile_cost_quick_run(tmp_path, capsys, monkeypatch):
    """The MLP through fresh processes: cold and warm compiles timed, the ragged epochs counted,
    the three runs timed, the compiled losses equal kiln eager's."""
    monkeypatch.setattr(compile_cost, "ORDER", ("mlp",))
    out = tmp_path / "cost.json"
    assert run.main(["--quick", "--in-process", "--json", str(out), "compile_cost"]) == 0
    by_key = {(r["case"], r["impl"]): r for r in json.loads(out.read_text())["results"]}
    names = compile_cost.cases("mlp")
    for key in ("cold", "warm", "ragged"):
        assert by_key[(names[key], "kiln")]["timing"] is not None, by_key[(names[key], "kiln")]["note"]
    compiles = by_key[(names["ragged"], "kiln")]["params"]["compiles"]
    assert len(compiles) == 2 and 1 <= compiles[0] <= compiles[1]
    for impl in ("kiln", "kiln eager", "torch"):
        assert by_key[(names["run"], impl)]["timing"] is not None or impl == "torch"
    assert by_key[(names["run"], "kiln")]["check"].startswith("ok"), by_key[(names["run"], "kiln")]["check"]
    printed = capsys.readouterr().out
    assert "compiles (epoch 1, 2)" in printed and programs.PROGRAMS["mlp"].title in printed


class TracesTwice:
    """A stand-in for a compiled function whose first two calls each trace (a specialization and
    an event), as a step does when its first call creates the gradients; later calls run compiled."""

    def __init__(self, fn, traces: int = 2):
        self.fn, self.traces, self.calls = fn, traces, 0
        self.state = types.SimpleNamespace(specializations=[], events=[])

    def __call__(self, *args):
        self.calls += 1
        if self.calls <= self.traces:
            self.state.specializations.append(types.SimpleNamespace(traced_graph=types.SimpleNamespace(nodes=[1, 2])))
            self.state.events.append(types.SimpleNamespace(kind="compiled", detail=f"specialization {self.calls}"))
        return self.fn(*args)


def test_compile_time_runs_to_the_first_call_that_runs_compiled(monkeypatch):
    sizes = programs.PROGRAMS["mlp"].sizes[True]
    monkeypatch.setattr(compile_cost, "kiln_compile", TracesTwice)
    out = compile_cost._compiled_run("mlp", sizes, None)
    assert (out["compile_calls"], out["compiles"], out["calls"], out["nodes"]) == (2, 2, 3, 2)
    assert 0 < out["compile_s"] <= out["run_s"]
    out = compile_cost._compiled_run("mlp", sizes, 5)  # a run goes on to its steps
    assert (out["compile_calls"], out["calls"], len(out["losses"])) == (2, 5, compile_cost.CHECK_STEPS)
    monkeypatch.setattr(compile_cost, "kiln_compile", lambda fn: TracesTwice(fn, traces=99))
    out = compile_cost._compiled_run("mlp", sizes, None)  # never runs compiled: no compile time, said so
    assert "compile_s" not in out and out["calls"] == compile_cost.MAX_CALLS_TO_COMPILE
    row = compile_cost._compile_row("c", out, {})
    assert row.timing is None and row.note.startswith("error: no call ran compiled within 6 calls; compiled: ")
    overran = {"error": "error: cold process timed out after 600 s", "calls_done": 1, "elapsed_s": 12.0, "events": []}
    assert compile_cost._compile_row("c", overran, {}).note == (
        "error: cold process timed out after 600 s; 1 call(s) had finished after 12.0 s"
    )


def test_a_process_that_overran_keeps_what_it_measured():
    """A cold process that compiled but did not finish its run: its compile is a row, its run an error."""
    printed = b'CompileWarning...\n{"compile_s": 1.5}\n{"compile_s": 2.0, "compile_calls": 2, "compiles": 1, '
    printed += b'"nodes": 9, "events": []}\nnot json {\n'
    partial = compile_cost._last_json(printed)
    assert partial["compile_s"] == 2.0 and compile_cost._last_json(b"") == {} and compile_cost._last_json(None) == {}
    cold = {**partial, "error": "error: cold process timed out after 600 s"}
    eager = {"run_s": 5.0, "losses": [[1.0]]}
    torch = {"error": "error: torch process timed out after 600 s"}
    results = compile_cost.rows("cnn", True, {"cold": cold, "warm": cold, "eager": eager, "torch": torch})
    names = compile_cost.cases("cnn")
    by_key = {(r.case, r.impl): r for r in results}
    assert by_key[(names["cold"], "kiln")].median_ns == 2e9
    assert by_key[(names["ragged"], "kiln")].note == cold["error"]
    assert by_key[(names["run"], "kiln")].timing is None and by_key[(names["run"], "kiln")].note == cold["error"]
    assert by_key[(names["run"], "kiln eager")].median_ns == 5e9
    assert by_key[(names["run"], "torch")].note == torch["error"]
