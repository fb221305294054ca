"""Compile latency and compiled-call overhead: ``kiln.compile`` next to ``torch.compile`` and ``jax.jit``.

Two workloads:

- ``compile``: the time until the MLP 784-512-512-10 training step (batch 128, Adam) runs compiled.
  kiln's first call runs eagerly and creates Adam's moments (state created by a traced call is
  never baked in), its second call traces and builds the program: kiln's latency is calls 1 + 2
  (call 2 alone is in the note), against the first call of ``torch.compile`` (in this process,
  its caches disabled, its one-time start-up excluded) and of ``jax.jit``. "cold" is a fresh
  process with an empty ``KILN_CACHE_DIR``; "warm" is a second fresh process on the same
  directory, whose compile should load the program from the disk cache. Import time and each
  process's first eager steps (of a tiny model: BLAS threads, first dispatch of each op) are
  excluded from both, and kiln's bytecode is written first, as an install writes it. The cold
  process also checks the compiled losses against eager ones.
- ``overhead``: the per-call time of a compiled trivial function, ``x + 1`` on a 1-element
  float32 tensor, next to ``torch.compile``'s and ``jax.jit``'s, and the same statement eagerly.
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import kiln

from . import common
from .common import KILN, Result, Target, compare, error_note, kiln_compile, one_shot, optional_import, skipped

COLD = "MLP step: compile, cold cache"
WARM = "MLP step: compile, warm cache (2nd process)"
TRIVIAL = "x + 1, 1 element: per call"
KILN_EAGER = "kiln eager"
SAMPLES = {True: 1, False: 3}  # cold/warm process pairs, by `quick`
ROOT = Path(__file__).resolve().parent.parent

TARGETS = [
    Target("compile", COLD, None, max_ns=1e9),
    Target("compile", COLD, "torch.compile", max_ratio=0.2),
    Target("compile", WARM, None, max_ns=1e8),
    Target("overhead", TRIVIAL, "torch.compile", max_ratio=0.5),
]


def once_ns(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return float(time.perf_counter_ns() - start)


# ----------------------------------------------------------------------------- kiln, in fresh processes
def _latency_child(backend: str | None, check: bool) -> dict:
    """Run in a fresh process: kiln's first calls of the MLP step, one by one (printed as JSON)."""
    from . import training  # noqa: PLC0415 - imported after the clock started in __main__

    common.OPTIONS.kiln_backend = backend
    _eager_warmup()
    step, _ = training.kiln_train_step("mlp")
    calls = [once_ns(step) for _ in range(3)]
    out = {"calls_ns": calls, "events": [f"{e.kind}: {e.detail}" for e in step.state.events]}
    if check:  # compiled losses against eager ones, from the same weights
        compiled, _ = training.kiln_train_step("mlp")
        eager, _ = training.kiln_train_step("mlp", compiled=False)
        ours = [float(compiled().numpy()) for _ in range(4)]
        theirs = [float(eager().numpy()) for _ in range(4)]
        out["check"] = common.close(ours, theirs, rtol=1e-4, atol=1e-6) + " on losses vs kiln eager"
    return out


def _eager_warmup() -> None:
    """A few eager steps of a tiny MLP: the process's one-time start-up (BLAS threads, first
    dispatch of each op) is not the compile's cost, as torch.compile's start-up is excluded too."""
    kiln.manual_seed(1)
    nn = kiln.nn
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-3)
    x, y = kiln.from_numpy(np.ones((4, 8), dtype=np.float32)), kiln.from_numpy(np.zeros(4, dtype=np.int64))
    for _ in range(2):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def _spawn(cache: str, check: bool) -> dict:
    env = {**os.environ, "KILN_CACHE_DIR": cache}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "benchmarks.compile_latency", "--latency-child"]
    command += ["--check"] if check else []
    command += ["--threads", str(common.OPTIONS.threads)] if common.OPTIONS.threads else []
    command += ["--kiln-backend", common.OPTIONS.kiln_backend] if common.OPTIONS.kiln_backend else []
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"latency process exited with status {proc.returncode}: {last[:200]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _entries(cache: str) -> int:
    return sum(len(files) for _, _, files in os.walk(cache))


def _compile_bytecode() -> None:
    """Write kiln's bytecode (``__pycache__``) before the processes run, as installing a package
    does: with ``PYTHONDONTWRITEBYTECODE`` set, or a checkout edited since its last import, every
    fresh process would otherwise compile the changed modules from source again (20-40 ms)."""
    compileall.compile_dir(str(ROOT / "kiln"), quiet=1)


def _kiln_latencies(quick: bool) -> list[Result]:
    cold, warm, cache_notes, check = [], [], [], ""
    try:
        _compile_bytecode()
        for i in range(SAMPLES[quick]):
            with tempfile.TemporaryDirectory(prefix="kiln-cache-") as cache:
                cold.append(_spawn(cache, check=i == 0))
                after_cold = _entries(cache)
                warm.append(_spawn(cache, check=False))
                cache_notes.append((after_cold, _entries(cache) - after_cold))
    except Exception as error:  # noqa: BLE001 - report it, go on with the references
        return [skipped("compile", COLD, KILN, error_note(error)), skipped("compile", WARM, KILN, error_note(error))]
    check = cold[0].get("check", "")
    written, added = cache_notes[0]
    cache_note = f"cache: {written} files after cold" + (f", warm added {added} (a miss?)" if added else "")
    if not written:
        cache_note = "cache dir empty after the cold process: no disk cache used"
    results = []
    for case, runs in ((COLD, cold), (WARM, warm)):
        totals = [r["calls_ns"][0] + r["calls_ns"][1] for r in runs]
        second = float(np.median([r["calls_ns"][1] for r in runs]))
        third = float(np.median([r["calls_ns"][2] for r in runs]))
        note = f"calls 1+2; call 2 (trace+build) {common.format_time(second)}, call 3 {common.format_time(third)}"
        params = {"events": runs[0]["events"], "samples": len(runs), "cache": cache_note}
        results.append(Result("compile", case, KILN, one_shot(totals), f"{note}; {cache_note}", params, check))
    return results


# ----------------------------------------------------------------------------- references
@contextlib.contextmanager
def _cold_torch_compile(torch):
    """torch.compile with a fresh dynamo cache and inductor's on-disk caches off, so every
    compile measured here does the whole work whatever ran before."""
    import torch._inductor.config as inductor_config  # noqa: PLC0415 - only when measuring torch.compile

    torch._dynamo.reset()
    previous = inductor_config.force_disable_caches
    inductor_config.force_disable_caches = True
    try:
        yield
    finally:
        inductor_config.force_disable_caches = previous


def _torch_latency(torch) -> Result:
    from . import training  # noqa: PLC0415

    why = common.torch_compile_or_why(torch)
    if why:
        return skipped("compile", COLD, "torch.compile", why)
    try:
        with _cold_torch_compile(torch):
            # Compile something else first: the one-time start-up (imports, workers) is not the step's cost.
            startup = once_ns(lambda: torch.compile(lambda t: t * 3)(torch.ones(2)))
            step = training.torch_train_step(torch, "mlp", compiled=True)
            calls = [once_ns(step) for _ in range(2)]
    except Exception as error:  # noqa: BLE001 - no C++ compiler, say: cannot measure
        return skipped("compile", COLD, "torch.compile", "failed: " + error_note(error)[7:])
    note = f"call 1, caches disabled; start-up before it {startup / 1e9:.2g} s; call 2 {common.format_time(calls[1])}"
    return Result("compile", COLD, "torch.compile", one_shot(calls[:1]), note, {"calls_ns": calls})


def _jax_latency() -> Result:
    from . import models, training  # noqa: PLC0415

    jax = optional_import("jax")
    if jax is None:
        return skipped("compile", COLD, "jax.jit", "jax is not installed")
    try:
        _, model = training.kiln_train_step("mlp", compiled=False)
        x, y = training._classifier_data("mlp")
        run = models.jax_mlp_step(jax, [p.detach().numpy().copy() for p in model.parameters()], x, y)
        calls = [once_ns(run) for _ in range(2)]
    except Exception as error:  # noqa: BLE001
        return skipped("compile", COLD, "jax.jit", "failed: " + error_note(error)[7:])
    return Result("compile", COLD, "jax.jit", one_shot(calls[:1]), f"call 1; call 2 {common.format_time(calls[1])}")


def run_compile(quick: bool = False) -> list[Result]:
    """kiln cold and warm (fresh processes), then torch.compile and jax.jit in this process."""
    results = _kiln_latencies(quick)
    torch = optional_import("torch")
    torch_result = skipped("compile", COLD, "torch.compile", "torch is not installed")
    if torch is not None:
        torch_result = _torch_latency(torch)
    return results[:1] + [torch_result, _jax_latency()] + results[1:]


# ----------------------------------------------------------------------------- call overhead
def run_overhead(quick: bool = False) -> list[Result]:
    """``x + 1`` on one float32 element, per call: compiled by each library, and eagerly."""
    one = np.ones(1, dtype=np.float32)
    namespaces: dict[str, tuple[str, dict]] = {}
    results: dict[str, Result] = {}
    check = ""
    try:
        f = kiln_compile(lambda x: x + 1)
        x = kiln.from_numpy(one.copy())
        for _ in range(3):
            y = f(x)
        check = common.close(y.numpy(), one + 1, rtol=0, atol=0)
        namespaces[KILN] = ("f(x)", {"f": f, "x": x})
    except Exception as error:  # noqa: BLE001
        results[KILN] = skipped("overhead", TRIVIAL, KILN, error_note(error))
    namespaces[KILN_EAGER] = ("x + 1", {"x": kiln.from_numpy(one.copy())})
    torch = optional_import("torch")
    if torch is None:
        results["torch"] = skipped("overhead", TRIVIAL, "torch", "torch is not installed")
        results["torch.compile"] = skipped("overhead", TRIVIAL, "torch.compile", "torch is not installed")
    else:
        namespaces["torch"] = ("x + 1", {"x": torch.from_numpy(one.copy())})
        why = common.torch_compile_or_why(torch)
        try:
            if why:
                raise RuntimeError(why)
            g = torch.compile(lambda x: x + 1)
            tx = torch.from_numpy(one.copy())
            for _ in range(3):
                g(tx)
            namespaces["torch.compile"] = ("g(x)", {"g": g, "x": tx})
        except Exception as error:  # noqa: BLE001
            results["torch.compile"] = skipped("overhead", TRIVIAL, "torch.compile", why or error_note(error))
    results.update(_jax_overhead(one, namespaces))
    timings = compare(namespaces, quick=quick)  # single-threaded tiny calls: interleaved
    for impl, t in timings.items():
        stmt = namespaces[impl][0]
        results[impl] = Result("overhead", TRIVIAL, impl, t, stmt, {}, check if impl == KILN else "")
    order = [KILN, KILN_EAGER, "torch", "torch.compile", "jax.jit"]
    return [results[impl] for impl in order if impl in results]


def _jax_overhead(one: np.ndarray, namespaces: dict) -> dict[str, Result]:
    jax = optional_import("jax")
    if jax is None:
        return {"jax.jit": skipped("overhead", TRIVIAL, "jax.jit", "jax is not installed")}
    try:
        h = jax.jit(lambda x: x + 1)
        jx = jax.numpy.asarray(one)
        h(jx).block_until_ready()
    except Exception as error:  # noqa: BLE001
        return {"jax.jit": skipped("overhead", TRIVIAL, "jax.jit", "failed: " + error_note(error)[7:])}
    namespaces["jax.jit"] = ("h(x).block_until_ready()", {"h": h, "x": jx})
    return {}


def _child_main(argv: list[str]) -> int:
    backend = argv[argv.index("--kiln-backend") + 1] if "--kiln-backend" in argv else None
    if "--threads" in argv:
        common.configure_threads(int(argv[argv.index("--threads") + 1]))
    print(json.dumps(_latency_child(backend, check="--check" in argv)))
    return 0


if __name__ == "__main__":
    if "--latency-child" in sys.argv:
        sys.exit(_child_main(sys.argv))
    from .run import main

    sys.exit(main([*sys.argv[1:], "compile", "overhead"]))
