"""What ``kiln.compile`` costs a user before it pays (issue 33's "what it must show").

Per program of ``benchmarks/programs.py`` -- two LSTMCells looped over 1,000 time steps, a DCGAN
step, a 2-layer LSTM LM, a CNN (whose epochs end with a smaller batch), a GPT -- each in fresh
processes (``CHILD_LIMIT_S`` each, so a pathological compile cannot hang the run):

- cold compile: an empty ``KILN_CACHE_DIR``, the time from the first call of the compiled step to
  the first call that runs compiled (the first call creates the optimizer's state or the first
  gradients, so this is usually calls 1 and 2);
- warm compile: the same in a second process on the same cache directory;
- the LSTM LM's cold compile at ``LENGTH_FACTOR`` times the sequence length (T=350 against T=35), less
  the step's own work: the calls before the first compiled one, less as many first calls of kiln eager
  in a fresh process at that length (a first call at T=350 spends ~0.3 s touching new memory, tracing
  or not; the steady step's 0.06 s left that in the compile's share);
- compiles over two epochs whose last batch is smaller (the compiled function's specializations);
- the wall time of a run of ``RUN_STEPS`` steps compiled (its compile included, in the cold
  process) against kiln eager and PyTorch eager (a process each); kiln eager's process starts on an
  empty cache directory of its own, as the cold one does (its eager kernels compile in it); the
  compiled run's first losses are checked against kiln eager's;
- the same run as a user's program runs it by default (a process of its own, on an empty cache):
  ``kiln.compile(step)`` compiles in the background while the first calls run eagerly;
- the compiled run again in the warm process (a user's program run a second time: the compile from the
  disk cache), against kiln eager run a second time on its cache directory (its kernels from it).

Every process compiles its eager ops' kernels in the background, kiln's default (numpy runs an op until
its kernel is ready); the cold, warm and length processes wait for their programs (``wait=True``).

The summary prints each number beside the issue's target, marked met or MISSED; a missed target
never fails the run. ``python -m benchmarks.run compile_cost [--quick]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import kiln

from . import common
from .common import KILN, Result, Target, close, format_time, kiln_compile, one_shot, skipped
from .programs import PROGRAMS, batches, cycling, on, setup

WORKLOAD = "compile_cost"
ORDER = ("lstm_cells", "dcgan", "lstm_lm", "cnn", "gpt")
ROOT = Path(__file__).resolve().parent.parent
CHILD_LIMIT_S = 600  # each fresh process
CHILD_TIMEOUT_S = {True: 600, False: 4 * 3600}  # the whole workload, when benchmarks.run runs it
RUN_STEPS = {False: 200, True: 6}
LONG_STEPS = {False: 1000, True: 20}  # the LSTMCell loop's length
LENGTH_FACTOR = 10  # the LSTM LM compiled again at this many times its length (T=35: T=350)
LENGTH_PROGRAMS = ("lstm_lm",)
EPOCH_BATCHES = {False: 8, True: 3}  # full batches per epoch, then one smaller
CHECK_STEPS = 3
MAX_CALLS_TO_COMPILE = 6  # calls made waiting for one that runs compiled before giving up
COLD_MAX_S, WARM_MAX_S, MAX_COMPILES, LENGTH_MAX = 3.0, 0.3, 2, 1.5
EAGER, TORCH, SHORT, BACKGROUND = "kiln eager", "torch", "kiln, 1x length", "kiln, background"
WARM_RUN = "kiln, warm cache"
EAGER_WARM = "kiln eager, warm cache"


def cases(name: str) -> dict[str, str]:
    """The case names of a program's rows."""
    title = PROGRAMS[name].title
    return {
        "cold": f"{title}: cold compile",
        "warm": f"{title}: warm compile (2nd process)",
        "length": f"{title}: compile at 10x the length",
        "ragged": f"{title}: two epochs, ragged last batch",
        "run": f"{title}: training run, compile included",
    }


TARGETS = [
    target
    for name in ORDER
    for target in (
        Target(WORKLOAD, cases(name)["cold"], None, max_ns=COLD_MAX_S * 1e9),
        Target(WORKLOAD, cases(name)["warm"], None, max_ns=WARM_MAX_S * 1e9),
        Target(WORKLOAD, cases(name)["run"], EAGER, max_ratio=1.0),
        Target(WORKLOAD, cases(name)["run"], TORCH, max_ratio=1.0),
    )
] + [Target(WORKLOAD, cases("lstm_lm")["length"], SHORT, max_ratio=LENGTH_MAX)]


def sizes_for(name: str, quick: bool, steps: int | None = None) -> dict:
    """The program's sizes here: the LSTMCell loop at LONG_STEPS, a sequence length when given."""
    sizes = dict(PROGRAMS[name].sizes[quick])
    if name == "lstm_cells":
        sizes["steps"] = LONG_STEPS[quick]
    if steps is not None:
        sizes["steps"] = steps
    return sizes


# ----------------------------------------------------------------------------- in the fresh processes
def compiles(fn) -> int:
    """The number of specializations a compiled function holds."""
    return len(fn.state.specializations)


def _compiled_run(name: str, sizes: dict, steps: int | None) -> dict:
    """Call a fresh compiled step until a call runs compiled, then on to ``steps`` calls in all
    (None: stop there). The compile time runs from the first call to the start of the first call
    that ran compiled: one that added no specialization and no event (a trace break, a call not
    cached), after one at least was made -- so a second trace (once ``.grad`` is set) counts too."""
    program = PROGRAMS[name]
    fn = kiln_compile(setup(program, kiln, sizes).step)
    call = cycling(fn, on(kiln, batches(program, sizes, 4)))
    start = time.perf_counter()
    out: dict = {}
    calls, losses = 0, []
    while calls < (steps or MAX_CALLS_TO_COMPILE) and (steps or "compile_s" not in out):
        before, history, called = compiles(fn), len(fn.state.events), time.perf_counter()
        losses.append(np.asarray(call().numpy(), dtype=np.float64).ravel().tolist())
        if "compile_s" not in out and before and compiles(fn) == before and len(fn.state.events) == history:
            out.update(compile_s=called - start, compile_calls=calls, nodes=_nodes(fn), compiles=compiles(fn))
            out["events"] = _events(fn)
            _emit(out)  # kept if the rest of the run overruns its time
        elif "compile_s" not in out:  # where a compile that overruns had got to
            _emit({"calls_done": calls + 1, "elapsed_s": time.perf_counter() - start, "events": _events(fn)})
        calls += 1
    out.update(run_s=time.perf_counter() - start, calls=calls, losses=losses[:CHECK_STEPS])
    out.update(events=_events(fn), compiles=compiles(fn))
    return out


def _background_run(name: str, sizes: dict, steps: int) -> dict:
    """``steps`` calls of ``kiln.compile(step)`` as a user writes it (compiled in the background;
    ``_spawn`` gives this process kiln's defaults): the wall time, compiles and the calls that ran
    compiled."""
    program = PROGRAMS[name]
    fn = kiln.compile(setup(program, kiln, sizes).step)
    call = cycling(fn, on(kiln, batches(program, sizes, 4)))
    start = time.perf_counter()
    losses = [np.asarray(call().numpy(), dtype=np.float64).ravel().tolist() for _ in range(steps)]
    return {"run_s": time.perf_counter() - start, "losses": losses[:CHECK_STEPS], "compiles": compiles(fn),
            "events": _events(fn)}  # fmt: skip


def _first_eager_calls(name: str, sizes: dict) -> dict:
    """The wall times of the first ``MAX_CALLS_TO_COMPILE`` calls of the undecorated step in this fresh
    process: what the calls a compile spans would cost had the user not decorated the step."""
    program = PROGRAMS[name]
    call = cycling(setup(program, kiln, sizes).step, on(kiln, batches(program, sizes, 4)))
    times = []
    for _ in range(MAX_CALLS_TO_COMPILE):
        start = time.perf_counter()
        np.asarray(call().numpy())  # as ``_compiled_run`` times its calls
        times.append(time.perf_counter() - start)
    return {"first_calls_s": times}


def _events(fn) -> list[str]:
    return [f"{e.kind}: {e.detail}" for e in fn.state.events][:8]


def _emit(partial: dict) -> None:
    """Print a partial result now: a process that overruns its limit still reports what it measured."""
    print(json.dumps(partial), flush=True)


def _nodes(fn) -> int | None:
    graph = getattr(fn.state.specializations[0], "traced_graph", None)
    return None if graph is None else len(graph.nodes)


def _ragged_epochs(name: str, sizes: dict, quick: bool) -> dict:
    """Two epochs of a fresh compiled step whose last batch is smaller: compiles after each."""
    program = PROGRAMS[name]
    rows = max(1, sizes["batch"] * 3 // 5)
    epoch = on(kiln, batches(program, sizes, EPOCH_BATCHES[quick] + 1, last_rows=rows))
    fn = kiln_compile(setup(program, kiln, sizes).step)
    counts, seconds = [], []
    for _ in range(2):
        start = time.perf_counter()
        for batch in epoch:
            fn(*batch)
        seconds.append(time.perf_counter() - start)
        counts.append(compiles(fn))
    return {"compiles": counts, "epoch_s": seconds, "rows": [len(b[0]) for b in epoch], "events": _events(fn)}


def _eager_run(name: str, sizes: dict, steps: int, lib) -> dict:
    """The wall time of ``steps`` eager steps with ``lib`` (kiln, or torch from kiln's weights), and
    the first losses. PyTorch runs in a process of its own, so a slow kiln run cannot starve it."""
    program = PROGRAMS[name]
    batch_list = batches(program, sizes, 4)
    built = setup(program, kiln, sizes)
    if lib is not kiln:
        built = setup(program, lib, sizes, reference=built)
    call = cycling(built.step, on(lib, batch_list))
    start = time.perf_counter()
    losses, ends = [], []
    for _ in range(steps):
        losses.append(np.asarray(call().detach().numpy(), dtype=np.float64).ravel().tolist())
        ends.append(time.perf_counter())
    first = np.diff([start, *ends[:MAX_CALLS_TO_COMPILE]]).tolist()  # the length row's short baseline
    return {"run_s": ends[-1] - start if ends else 0.0, "losses": losses[:CHECK_STEPS], "first_calls_s": first}


def child(mode: str, name: str, quick: bool, steps: int | None) -> dict:
    """One fresh process's measurement (``mode``: cold, warm, length, eager_length, eager, torch)."""
    sizes = sizes_for(name, quick, steps if mode in ("length", "eager_length") else None)
    if mode == "cold":
        return _compiled_run(name, sizes, RUN_STEPS[quick])
    if mode == "length":
        return _compiled_run(name, sizes, None)
    if mode == "eager_length":
        return _first_eager_calls(name, sizes)
    if mode == "background":
        return _background_run(name, sizes, RUN_STEPS[quick])
    if mode == "warm":
        out = _compiled_run(name, sizes, RUN_STEPS[quick])
        _emit(out)
        return {**out, "ragged": _ragged_epochs(name, sizes, quick)}
    if mode == "eager":
        return _eager_run(name, sizes, RUN_STEPS[quick], kiln)
    torch = common.optional_import("torch")
    return _eager_run(name, sizes, RUN_STEPS[quick], torch) if torch else {"error": "torch is not installed"}


def _spawn(mode: str, name: str, quick: bool, cache: str, steps: int | None = None) -> dict:
    """``child(...)`` in a fresh process on ``cache``: its last JSON line (a partial one when it failed
    or overran), with ``"error": why`` added when it did not finish."""
    # Eager ops compile their kernels in the background, as in a user's program (benchmarks/__init__.py
    # compiles them in the calls, for steady-state timing); the background run has kiln's defaults.
    env = {**os.environ, "KILN_CACHE_DIR": cache, "KILN_EAGER_KERNELS": "1"}
    if mode == "background":
        env["KILN_COMPILE_WAIT"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "benchmarks.compile_cost", "--child", mode, name]
    command += ["--quick"] if quick else []
    command += ["--steps", str(steps)] if steps else []
    command += ["--threads", str(common.OPTIONS.threads)] if common.OPTIONS.threads else []
    command += ["--kiln-backend", common.OPTIONS.kiln_backend] if common.OPTIONS.kiln_backend else []
    try:
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=CHILD_LIMIT_S, check=False)
    except subprocess.TimeoutExpired as overran:
        return {**_last_json(overran.stdout), "error": f"error: {mode} process timed out after {CHILD_LIMIT_S} s"}
    found = _last_json(done.stdout)
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return {**found, "error": f"error: {mode} process exited with status {done.returncode}: {last[:200]}"}
    return found or {"error": f"error: {mode} process printed no result: {done.stdout[-200:]!r}"}


def _last_json(stdout: bytes | None) -> dict:
    """The last line of ``stdout`` that is a JSON object, or {}."""
    for line in reversed((stdout or b"").decode(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}


# ----------------------------------------------------------------------------- the parent: rows of the table
def measure(name: str, quick: bool) -> dict[str, dict]:
    """Every fresh process of one program: ``{mode: its JSON, or {"error": why}}``."""
    found: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="kiln-cache-") as cache:
        for mode in ("cold", "warm", "torch"):
            if mode == "warm" and "compile_s" not in found["cold"]:  # it would only repeat the cold compile
                found[mode] = {"error": "error: not run: no call of the cold process ran compiled"}
                continue
            common.progress(f"compile_cost: {name}, {mode}")
            found[mode] = _spawn(mode, name, quick, cache)
    # kiln eager on a cache of its own: the cold process's, filled by its compile, would hand it
    # kernels no eager run of a user's would find the first time
    with tempfile.TemporaryDirectory(prefix="kiln-cache-") as cache:
        for key, label in (("eager", "eager"), ("eager_warm", "eager, warm cache")):
            common.progress(f"compile_cost: {name}, {label}")
            found[key] = _spawn("eager", name, quick, cache)
    with tempfile.TemporaryDirectory(prefix="kiln-cache-") as cache:
        common.progress(f"compile_cost: {name}, background")
        found["background"] = _spawn("background", name, quick, cache)
    if name in LENGTH_PROGRAMS:
        with tempfile.TemporaryDirectory(prefix="kiln-cache-") as cache:
            long = sizes_for(name, quick)["steps"] * LENGTH_FACTOR
            common.progress(f"compile_cost: {name}, T={long}")
            found["length"] = _spawn("length", name, quick, cache, steps=long)
        with tempfile.TemporaryDirectory(prefix="kiln-cache-") as cache:  # eager's own, as above
            common.progress(f"compile_cost: {name}, eager at T={long}")
            found["eager_length"] = _spawn("eager_length", name, quick, cache, steps=long)
    return found


def _compile_row(case: str, out: dict, params: dict) -> Result:
    if "compile_s" not in out:
        why = out.get("error") or f"error: no call ran compiled within {out['calls']} calls"
        if "calls_done" in out:
            why += f"; {out['calls_done']} call(s) had finished after {out['elapsed_s']:.1f} s"
        return skipped(WORKLOAD, case, KILN, "; ".join([why, *out.get("events", [])])[:400])
    note = f"{out['compile_calls']} calls, {out['compiles']} compile(s), {out['nodes']} traced nodes (first)"
    return Result(WORKLOAD, case, KILN, one_shot([out["compile_s"] * 1e9]), note, {**params, "events": out["events"]})


def _length_row(case: str, impl: str, out: dict, eager: dict, params: dict) -> Result:
    """A compile's cost beyond the step's own work: the time from the first call to the first compiled
    one, less the same number of first calls of kiln eager in a fresh process at that length (``eager``'s
    ``first_calls_s``: a traced call runs the step too, and a process's first calls touch new memory,
    compiled or not)."""
    row = replace(_compile_row(case, out, params), impl=impl)
    if "compile_s" not in out:
        return replace(row, note=f"T={params['steps']}; " + row.note)
    calls, firsts = out["compile_calls"], eager.get("first_calls_s", [])
    if len(firsts) < calls:
        why = eager.get("error") or f"kiln eager timed {len(firsts)} first calls, not {calls}"
        return skipped(WORKLOAD, case, impl, f"T={params['steps']}: {why}")
    own = sum(firsts[:calls])
    note = (f"T={params['steps']}: first call to first compiled one {format_time(out['compile_s'] * 1e9)}, less "
            f"kiln eager's first {calls} call(s) in a fresh process, {format_time(own * 1e9)}; " + row.note)  # fmt: skip
    return replace(row, timing=one_shot([(out["compile_s"] - own) * 1e9]), note=note,
                   params={**row.params, "first_call_s": out["compile_s"], "eager_first_calls_s": firsts[:calls]})  # fmt: skip


def rows(name: str, quick: bool, found: dict[str, dict]) -> list[Result]:
    """The table's rows of one program from its processes' measurements."""
    names, sizes = cases(name), sizes_for(name, quick)
    cold, warm = found["cold"], found["warm"]
    results = [_compile_row(names["cold"], cold, sizes), _compile_row(names["warm"], warm, sizes)]
    if "length" in found:
        short = sizes["steps"]
        long = short * LENGTH_FACTOR
        long_eager = found.get("eager_length", {})
        results.append(_length_row(names["length"], KILN, found["length"], long_eager, {**sizes, "steps": long}))
        results.append(_length_row(names["length"], SHORT, cold, found["eager"], sizes))
    results.append(_ragged_row(names["ragged"], warm))
    eager = {EAGER: found["eager"], TORCH: found["torch"]}
    params = {**sizes, "steps_run": RUN_STEPS[quick]}
    extra = [_background_row(names["run"], found, params), _warm_run_row(names["run"], warm, params)]
    extra.append(_eager_row(names["run"], EAGER_WARM, found.get("eager_warm", {}), params))
    return results + _run_rows(names["run"], cold, eager, params) + extra


def _warm_run_row(case: str, warm: dict, params: dict) -> Result:
    """The compiled run in the second process: a user's program run again, its compile from the disk cache."""
    if "run_s" not in warm:
        return skipped(WORKLOAD, case, WARM_RUN, warm.get("error", "error: not measured"))
    note = f"{params['steps_run']} steps from the first call, the warm compile included"
    return Result(WORKLOAD, case, WARM_RUN, one_shot([warm["run_s"] * 1e9]), note, params)


def _background_row(case: str, found: dict[str, dict], params: dict) -> Result:
    """The run in kiln's default mode (compiles in the background), its losses checked against eager's."""
    out = found.get("background", {})
    if "run_s" not in out:
        return skipped(WORKLOAD, case, BACKGROUND, out.get("error", "error: not measured"))
    check = "unchecked: kiln eager did not run"
    if "losses" in found["eager"]:
        check = close(out["losses"], found["eager"]["losses"], rtol=1e-4, atol=1e-6) + " on losses vs kiln eager"
    note = f"{params['steps_run']} steps, kiln.compile's default: {out['compiles']} compile(s) in the background"
    return Result(WORKLOAD, case, BACKGROUND, one_shot([out["run_s"] * 1e9]), note, {**params, "events": out["events"]},
                  check)  # fmt: skip


def _ragged_row(case: str, warm: dict) -> Result:
    if "ragged" not in warm:
        return skipped(WORKLOAD, case, KILN, warm.get("error", "error: no epochs measured"))
    ragged = warm["ragged"]
    first, second = ragged["compiles"]
    verdict = "met" if first <= MAX_COMPILES and second == first else "MISSED"
    note = (f"compiles: {first} over epoch 1, {second - first} more over epoch 2 (target <= {MAX_COMPILES}, "
            f"then none: {verdict}); batches of {ragged['rows']} rows")  # fmt: skip
    params = {"compiles": ragged["compiles"], "rows": ragged["rows"], "events": ragged["events"]}
    return Result(WORKLOAD, case, KILN, one_shot([ragged["epoch_s"][0] * 1e9]), note, params)


def _run_rows(case: str, cold: dict, eager: dict[str, dict], params: dict) -> list[Result]:
    """The compiled run (from the cold process: its compile included), then kiln eager's and
    PyTorch's (``eager``: their processes' outputs by implementation)."""
    steps = params["steps_run"]
    compiled = skipped(WORKLOAD, case, KILN, cold.get("error", "error: not measured"))
    if "run_s" in cold:
        check = "unchecked: kiln eager did not run"
        if "losses" in eager[EAGER]:
            check = close(cold["losses"], eager[EAGER]["losses"], rtol=1e-4, atol=1e-6) + " on losses vs kiln eager"
        note = f"{steps} steps from the first call, {cold['compiles']} compile(s) included"
        compiled = Result(WORKLOAD, case, KILN, one_shot([cold["run_s"] * 1e9]), note, params, check)
    return [compiled] + [_eager_row(case, impl, out, params) for impl, out in eager.items()]


def _eager_row(case: str, impl: str, out: dict, params: dict) -> Result:
    """An eager run's row (kiln's or PyTorch's process)."""
    if "run_s" not in out:
        return skipped(WORKLOAD, case, impl, out.get("error", "error: not measured"))
    return Result(WORKLOAD, case, impl, one_shot([out["run_s"] * 1e9]), f"{params['steps_run']} steps", params)


def run(quick: bool = False, programs: tuple[str, ...] | None = None) -> list[Result]:
    """Every program of ORDER (or those named), each in its own fresh processes."""
    results: list[Result] = []
    for name in programs or ORDER:
        results += rows(name, quick, measure(name, quick))
    return results


# ----------------------------------------------------------------------------- the summary
def _verdict(value: float | None, limit: float) -> str:
    return "" if value is None else ("met" if value <= limit else "MISSED")


def summary(results: list[Result]) -> str:
    """One line per program: each number beside the issue's target, met or MISSED."""
    rows_ = [("program", "cold", f"< {COLD_MAX_S:g} s", "warm", f"< {WARM_MAX_S:g} s", "compiles (epoch 1, 2)",
              f"<= {MAX_COMPILES}, then 0", "10x length (beyond the step)", f"<= {LENGTH_MAX:g}x", "run: compiled/eager/torch",
              "compiled fastest", "run: background", "background fastest", "run: warm cache",
              "eager warm/torch", "warm fastest")]  # fmt: skip
    by_key = {(r.case, r.impl): r for r in results if r.workload == WORKLOAD}
    for name in ORDER:
        names = cases(name)
        if (names["cold"], KILN) not in by_key:
            continue
        seconds = {k: _seconds(by_key.get((names[k], KILN))) for k in ("cold", "warm")}
        ragged = by_key.get((names["ragged"], KILN))
        counts = ragged.params.get("compiles") if ragged is not None and ragged.timing else None
        long, short = _seconds(by_key.get((names["length"], KILN))), _seconds(by_key.get((names["length"], SHORT)))
        growth = long / short if long and short else None
        run = [_seconds(by_key.get((names["run"], impl))) for impl in (KILN, EAGER, TORCH)]
        background = _seconds(by_key.get((names["run"], BACKGROUND)))
        warm_run = _seconds(by_key.get((names["run"], WARM_RUN)))
        warm_others = [_seconds(by_key.get((names["run"], impl))) for impl in (EAGER_WARM, TORCH)]
        rows_.append((
            PROGRAMS[name].title,
            _cell(seconds["cold"], "s"), _verdict(seconds["cold"], COLD_MAX_S),
            _cell(seconds["warm"], "s"), _verdict(seconds["warm"], WARM_MAX_S),
            "" if counts is None else f"{counts[0]}, +{counts[1] - counts[0]}",
            "" if counts is None else ("met" if counts[0] <= MAX_COMPILES and counts[1] == counts[0] else "MISSED"),
            _cell(growth, "x"), _verdict(growth, LENGTH_MAX),
            " / ".join(_cell(v, "s") or "-" for v in run), _fastest(run[0], run[1:]),
            _cell(background, "s"), _fastest(background, run[1:]),
            _cell(warm_run, "s"), " / ".join(_cell(v, "s") or "-" for v in warm_others),
            _fastest(warm_run, warm_others),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows_) for i in range(len(rows_[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows_)


def _fastest(value: float | None, others: list) -> str:
    """met when ``value`` is below every one of ``others``; empty where any is unmeasured."""
    if value is None or None in others:
        return ""
    return "met" if value < min(others) else "MISSED"


def _seconds(result: Result | None) -> float | None:
    return None if result is None or result.median_ns is None else result.median_ns / 1e9


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    return format_time(value * 1e9) if unit == "s" else f"{value:.2f}x"


def _child_main(argv: list[str]) -> int:
    def option(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv else None

    common.OPTIONS.kiln_backend = option("--kiln-backend")
    if option("--threads"):
        common.configure_threads(int(option("--threads")))
    steps = option("--steps")
    mode, name = argv[argv.index("--child") + 1 : argv.index("--child") + 3]
    print(json.dumps(child(mode, name, "--quick" in argv, int(steps) if steps else None)))
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.exit(_child_main(sys.argv))
    from .run import main

    sys.exit(main([*sys.argv[1:], WORKLOAD]))
