"""Floats that change at every step (issue 33, item 5: fewer needless specializations).

    python -m benchmarks.run changing_floats [--quick] [--no-torch-compile]

A training step as a user writes one with schedules: an autoencoder whose learning rate comes in as
a float argument (a cosine schedule, ``step(x, lr)``) and whose sparsity weight lives in a scheduler
object the loop anneals before every call (``sched.beta``, as KL annealing does). Before, each new
value made a trace and a compile, and after the recompile limit every call ran eagerly; now both
floats become inputs of one program (``jit/scalar_args.py``, ``jit/state_floats.py``).

Each implementation runs ``STEPS`` steps in a fresh process (kiln on an empty cache directory):
kiln compiled as a user writes it (in the background), kiln compiled waiting for each compile, kiln
eager, PyTorch eager and, unless ``--no-torch-compile``, ``torch.compile``. The table gives the wall
time of the whole run, compiles included, and the specializations made; the first losses of each run
are checked against kiln eager's.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import common
from .common import KILN, Result, Target, close, format_time, one_shot, skipped

WORKLOAD = "changing_floats"
ROOT = Path(__file__).resolve().parent.parent
STEPS = {False: 300, True: 8}
SIZES = {False: {"batch": 256, "features": 512, "code": 256}, True: {"batch": 4, "features": 8, "code": 4}}
CHILD_LIMIT_S = 600
CHILD_TIMEOUT_S = {True: 600, False: 3600}
CASE = "autoencoder step, lr argument and annealed loss weight"
WAIT, EAGER, TORCH, TORCH_COMPILE = "kiln, waiting for compiles", "kiln eager", "torch", "torch.compile"
MODES = {KILN: "background", WAIT: "wait", EAGER: "eager", TORCH: "torch", TORCH_COMPILE: "torch.compile"}
CHECK_STEPS = 4
TARGETS = [Target(WORKLOAD, CASE, EAGER, max_ratio=1.0), Target(WORKLOAD, CASE, TORCH, max_ratio=1.0)]


# ----------------------------------------------------------------------------- in the fresh process
def _program(lib, sizes: dict):
    """(step, sched): the step of an autoencoder trained with a learning rate passed in and a sparsity
    weight read from ``sched.beta``; kiln's weights seeded, torch's copied from them."""
    import kiln  # noqa: PLC0415

    kiln.manual_seed(0)
    layers = [kiln.nn.Linear(sizes["features"], sizes["code"]), kiln.nn.Linear(sizes["code"], sizes["features"])]
    weights = [(layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy()) for layer in layers]
    if lib is not kiln:
        layers = [lib.nn.Linear(sizes["features"], sizes["code"]), lib.nn.Linear(sizes["code"], sizes["features"])]
        with lib.no_grad():
            for layer, (w, b) in zip(layers, weights, strict=True):
                layer.weight.copy_(lib.from_numpy(w))
                layer.bias.copy_(lib.from_numpy(b))
    encoder, decoder = layers
    params = [*encoder.parameters(), *decoder.parameters()]
    sched = type("Schedule", (), {})()
    sched.beta = 0.0

    def step(x, lr):
        code = encoder(x).tanh()
        loss = ((decoder(code) - x) ** 2).mean() + sched.beta * code.abs().mean()
        for p in params:
            p.grad = None
        loss.backward()
        with lib.no_grad():
            for p in params:
                p -= lr * p.grad
        return loss.detach()

    return step, sched


def child(mode: str, quick: bool) -> dict:
    """``STEPS`` steps of the program in ``mode``: the wall time, specializations and first losses."""
    sizes, steps = SIZES[quick], STEPS[quick]
    if mode.startswith("torch"):
        import torch as lib  # noqa: PLC0415
    else:
        import kiln as lib  # noqa: PLC0415
    step, sched = _program(lib, sizes)
    fn = step
    if mode in ("background", "wait"):
        fn = lib.compile(step, wait=mode == "wait")
    elif mode == "torch.compile":
        fn = lib.compile(step)
    rng = np.random.default_rng(0)
    batches = [lib.from_numpy(rng.standard_normal((sizes["batch"], sizes["features"]), dtype=np.float32))
               for _ in range(4)]  # fmt: skip
    losses = []
    start = time.perf_counter()
    for i in range(steps):
        sched.beta = min(1.0, i / (steps / 2)) * 0.01  # annealed in, then held
        lr = 0.05 * 0.5 * (1 + math.cos(math.pi * i / steps))  # cosine
        loss = fn(batches[i % len(batches)], lr)
        if i < CHECK_STEPS:
            losses.append(float(loss))
    seconds = time.perf_counter() - start
    compiles = len(fn.state.specializations) if hasattr(fn, "state") else None
    if mode == "torch.compile":
        compiles = _torch_frames()
    return {"run_s": seconds, "losses": losses, "compiles": compiles}


def _torch_frames() -> int | None:
    try:
        from torch._dynamo.utils import counters  # noqa: PLC0415

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a count is a courtesy
        return None


# ----------------------------------------------------------------------------- the parent
def _spawn(mode: str, quick: bool, cache: str) -> dict:
    env = {**os.environ, "KILN_CACHE_DIR": cache, "KILN_EAGER_KERNELS": "1", "KILN_COMPILE_WAIT": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "benchmarks.changing_floats", "--child", mode, *(["--quick"] if quick else [])]
    command += ["--threads", str(common.OPTIONS.threads)] if common.OPTIONS.threads else []
    try:
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=CHILD_LIMIT_S, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"error: {mode} process timed out after {CHILD_LIMIT_S} s"}
    lines = [line for line in done.stdout.decode(errors="replace").splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return {"error": f"error: {mode} process exited with status {done.returncode}: {last[:200]}"}
    return json.loads(lines[-1])


def run(quick: bool = False) -> list[Result]:
    found: dict[str, dict] = {}
    for impl, mode in MODES.items():
        if impl == TORCH_COMPILE and not common.OPTIONS.torch_compile:
            continue
        common.progress(f"{WORKLOAD}: {impl}")
        with tempfile.TemporaryDirectory(prefix="kiln-cache-") as cache:
            found[impl] = _spawn(mode, quick, cache)
    reference = found.get(EAGER, {}).get("losses")
    results = []
    for impl in MODES:
        out = found.get(impl)
        if out is None:
            results.append(skipped(WORKLOAD, CASE, impl, "--no-torch-compile"))
            continue
        if "error" in out:
            results.append(skipped(WORKLOAD, CASE, impl, out["error"]))
            continue
        check = close(out["losses"], reference, rtol=1e-4, atol=1e-6) if reference and impl != EAGER else ""
        params = {"steps": STEPS[quick], **SIZES[quick], "compiles": out.get("compiles")}
        results.append(Result(WORKLOAD, CASE, impl, one_shot([out["run_s"] * 1e9]), params=params, check=check))
    return results


def summary(results: list[Result]) -> str:
    """The run's wall times beside kiln eager's, and the specializations each compiled run made."""
    lines = []
    eager = next((r.median_ns for r in results if r.impl == EAGER and r.timing), None)
    for r in results:
        if r.timing is None:
            continue
        ratio = f"{r.median_ns / eager:.2f}x kiln eager" if eager else ""
        made = r.params.get("compiles")
        made = (
            "" if made is None else f", {made} specialization(s)" if r.impl != TORCH_COMPILE else f", {made} graph(s)"
        )
        lines.append(f"{r.impl:<28} {format_time(r.median_ns):>8}  {ratio}{made}")
    return "\n".join(lines)


def _child_main(argv: list[str]) -> int:
    if "--threads" in argv:
        common.configure_threads(int(argv[argv.index("--threads") + 1]))
    mode = argv[argv.index("--child") + 1]
    print(json.dumps(child(mode, "--quick" in argv)))
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.exit(_child_main(sys.argv))
    from .run import main

    sys.exit(main([*sys.argv[1:], WORKLOAD]))
