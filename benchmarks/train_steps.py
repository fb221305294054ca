"""Training steps per second: the digits MLP and CNN, kiln eager next to PyTorch eager.

One step is ``zero_grad(); cross_entropy(model(x), y).backward(); Adam.step()`` on a batch of
64 rows of 64 features (the 8x8 digits' shape; the values are random, since only speed is
measured here), with the models of ``examples/train_digits.py``:

- MLP: Linear(64, 128) - ReLU - Linear(128, 10);
- CNN: 1x8x8 -> Conv2d(1, 16, 3, pad 1) - ReLU - MaxPool2d(2) - Conv2d(16, 32, 3, pad 1) - ReLU -
  MaxPool2d(2) - Flatten - Linear(128, 10).

Both libraries start from the same weights and run in this one process, their repeats
interleaved; PyTorch uses as many threads as kiln. The note gives each one's steps per second.
Run it alone with ``python -m benchmarks.train_steps [--quick]`` or through ``python -m benchmarks.run``.
"""

from __future__ import annotations

import sys

import numpy as np

import kiln

from .common import KILN, Result, compare, skipped, torch_with_kiln_threads

WORKLOAD = "train_steps"
MLP = "digits MLP, batch 64, Adam"
CNN = "digits CNN, batch 64, Adam"
BATCH, FEATURES, CLASSES = 64, 64, 10


def build(nn, case: str):
    """The case's model from ``nn`` (``kiln.nn`` or ``torch.nn``: the constructors are the same)."""
    if case == MLP:
        return nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, CLASSES),
    )  # fmt: skip


def make_step(lib, model, x, y):
    """A no-argument callable running one training step of ``model`` with ``lib``'s Adam."""
    optimizer = lib.optim.Adam(model.parameters(), lr=1e-3)
    cross_entropy = lib.nn.functional.cross_entropy

    def step():
        optimizer.zero_grad()
        loss = cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def setups(case: str, torch) -> dict:
    """``{impl: (step, model)}`` with the same initial weights and batch for every implementation."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, BATCH)
    kiln.manual_seed(0)
    model = build(kiln.nn, case)
    out = {KILN: (make_step(kiln, model, kiln.from_numpy(x.copy()), kiln.from_numpy(y.copy())), model)}
    if torch is not None:
        reference = build(torch.nn, case)
        with torch.no_grad():
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                q.copy_(torch.from_numpy(p.detach().numpy().copy()))
        out["torch"] = (make_step(torch, reference, torch.from_numpy(x.copy()), torch.from_numpy(y.copy())), reference)
    return out


def _case(case: str, quick: bool, torch, threads: int) -> list[Result]:
    steps = {impl: step for impl, (step, _) in setups(case, torch).items()}
    timings = compare({impl: (step, None) for impl, step in steps.items()}, quick=quick)
    params = {"batch": BATCH, "optimizer": "Adam", "dtype": "float32", "threads": threads}
    results = [
        Result(WORKLOAD, case, impl, t, note=f"{1e9 / t.median_ns:.0f} steps/s", params=params)
        for impl, t in timings.items()
    ]
    if torch is None:
        results.append(skipped(WORKLOAD, case, "torch", "torch is not installed"))
    return results


def run(quick: bool = False) -> list[Result]:
    """Both models, kiln then PyTorch (with kiln's thread count)."""
    with torch_with_kiln_threads() as (torch, threads):
        return [r for case in (MLP, CNN) for r in _case(case, quick, torch, threads)]


if __name__ == "__main__":
    from .run import main

    sys.exit(main([*sys.argv[1:], WORKLOAD]))
