"""Cold compile time of long programs: how the compiler scales with the size of the graph.

Programs (each built here, each compiled by ``kiln.compile`` in a fresh process with an empty
``KILN_CACHE_DIR``, so nothing comes from the disk cache):

- ``chain N``: ``N`` elementwise ops in one chain on a 1,000-element vector (one fused kernel);
- ``resnet``: a ResNet-18-shaped training step (stem, 4 stages of 2 basic blocks of conv / batch
  norm / relu with residual adds, average pool, linear, cross-entropy, backward, SGD with
  momentum), narrow (8 to 64 channels) and on 16x16 inputs so that eager work stays small;
- ``lstm``: an LSTM (2 layers, 12 steps) regression step with Adam.

A case's time is the call that traces and compiles (the first call for the chain, the second
for the training steps, whose first call creates the optimizer's state), measured around the
call; the compiled results are checked against eager ones over several calls. Run::

    python -m benchmarks.run long_programs          # or: python -m benchmarks.long_programs [case ...]

``python -m benchmarks.long_programs --profile CASE`` prints a cProfile of the compiling call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import kiln

from .common import KILN, Result, one_shot, skipped
from .models import train_step

ROOT = Path(__file__).resolve().parent.parent
CASES = {True: ("chain 1000", "chain 10000", "resnet"), False: ("chain 1000", "chain 10000", "resnet", "lstm")}
CHECK_CALLS = 3


# ----------------------------------------------------------------------------- the programs
def chain_program(n: int):
    """``(step, eager)``: ``n`` elementwise ops on one vector (mul, add, max, sub in turn)."""
    x = kiln.from_numpy(np.linspace(-1, 1, 1000, dtype=np.float32))

    def fn(t):
        for i in range(n):
            k = i % 4
            if k == 0:
                t = t * 0.999
            elif k == 1:
                t = t + 0.001
            elif k == 2:
                t = kiln.maximum(t, t * 0.5)
            else:
                t = t - 0.0005
        return t

    compiled = kiln.compile(fn)
    return (lambda: compiled(x)), (lambda: fn(x))


def _resnet(nn, blocks: int = 2):
    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = nn.functional.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return nn.functional.relu(out + (x if self.down is None else self.down(x)))

    widths = (8, 16, 32, 64)
    layers = [nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()]
    cin = widths[0]
    for stage, width in enumerate(widths):
        for block in range(blocks):
            layers.append(Block(cin, width, 2 if stage and not block else 1))
            cin = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers)


def resnet_program(seed: int = 0, blocks: int = 2):
    """A ResNet-18-shaped training step (SGD with momentum) on a batch of 4 16x16 images
    (``blocks`` basic blocks per stage: 2 is ResNet-18's depth)."""
    kiln.manual_seed(seed)
    model = _resnet(kiln.nn, blocks)
    rng = np.random.default_rng(seed)
    x = kiln.from_numpy(rng.standard_normal((4, 3, 16, 16), dtype=np.float32))
    y = kiln.from_numpy(rng.integers(0, 10, 4))
    optimizer = kiln.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return train_step(kiln, model, optimizer, x, y)


class _Recurrent(kiln.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = kiln.nn.LSTM(8, 32, num_layers=2)
        self.head = kiln.nn.Linear(32, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[-1])


def lstm_program(seed: int = 0):
    """An LSTM regression step (12 steps, batch 4, 2 layers of 32) with Adam."""
    kiln.manual_seed(seed)
    model = _Recurrent()
    rng = np.random.default_rng(seed)
    x = kiln.from_numpy(rng.standard_normal((12, 4, 8), dtype=np.float32))
    y = kiln.from_numpy(rng.standard_normal((4, 1), dtype=np.float32))
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-3)
    return train_step(kiln, model, optimizer, x, y, kiln.nn.functional.mse_loss)


def build(case: str):
    """``(compiled step, eager step, index of the compiling call)`` for a case name."""
    if case.startswith("chain "):
        step, eager = chain_program(int(case.split()[1]))
        return step, eager, 0
    program = {"resnet": resnet_program, "lstm": lstm_program}[case]
    return kiln.compile(program()), program(), 1


# ----------------------------------------------------------------------------- one case, in a fresh process
def measure_case(case: str) -> dict:
    """Time each call of the compiled step (the compiling one among them) and check it against eager."""
    step, eager, compiling = build(case)
    times, ours = [], []
    for _ in range(compiling + CHECK_CALLS):
        start = time.perf_counter()
        ours.append(step().numpy())
        times.append(time.perf_counter() - start)
    theirs = [eager().numpy() for _ in range(compiling + CHECK_CALLS)]
    error = max(float(np.max(np.abs(a - b) / (1e-5 + np.abs(b)))) for a, b in zip(ours, theirs, strict=True))
    compiled_fn = getattr(step, "__self__", step)
    spec = specialization(step)
    return {
        "compile_s": times[compiling],
        "traced_nodes": len(spec.traced_graph.nodes) if spec is not None else None,
        "kernels": spec.report.kernels if spec is not None and spec.report is not None else None,
        "declined": len(spec.report.declined) if spec is not None and spec.report is not None else None,
        "backend": type(spec.program).__name__ if spec is not None else None,
        "max_rel_error": error,
        "events": [f"{e.kind}: {e.detail}" for e in _state(compiled_fn).events] if _state(compiled_fn) else [],
    }


def _state(fn):
    state = getattr(fn, "state", None)
    if state is None and getattr(fn, "__closure__", None):  # the chain's lambda around the compiled function
        for cell in fn.__closure__:
            state = getattr(cell.cell_contents, "state", None) or state
    return state


def specialization(fn):
    """The last specialization of a compiled step (or of the compiled function a chain step calls)."""
    state = _state(fn)
    return state.specializations[-1] if state is not None and state.specializations else None


def _child(case: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, KILN_CACHE_DIR=cache)
        done = subprocess.run([sys.executable, "-m", "benchmarks.long_programs", "--child", case], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{case}: the child process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[Result]:
    """One result per case: the cold compile time, with the graph's size and the check in the note."""
    results = []
    for case in CASES[quick]:
        try:
            out = _child(case)
        except Exception as error:  # noqa: BLE001 - one failed case is reported, the rest still run
            results.append(skipped("long_programs", case, KILN, str(error)[-400:]))
            continue
        ok = out["max_rel_error"] < 1e-3 and out["backend"] == "CompiledProgram"
        note = (f"{out['traced_nodes']} traced nodes, {out['kernels']} kernels, {out['declined']} declined; "
                f"vs eager: max rel error {out['max_rel_error']:.1e} ({'ok' if ok else 'MISMATCH'})")  # fmt: skip
        results.append(Result("long_programs", f"{case}: cold compile", KILN, one_shot([out["compile_s"] * 1e9]),
                              note=note))  # fmt: skip
    return results


def _profile(case: str) -> None:
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    step, _, compiling = build(case)
    for _ in range(compiling):
        step()
    profiler = cProfile.Profile()
    profiler.enable()
    step()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--child"]:
        print(json.dumps(measure_case(args[1])))
    elif args[:1] == ["--profile"]:
        _profile(args[1])
    else:
        for result in run(quick="--quick" in args):
            print(result.case, f"{result.median_ns / 1e9:.2f} s" if result.median_ns else "", result.note)
