"""Eager overhead: what kiln's Python layer costs per op, next to PyTorch (CPU) and numpy.

Every implementation is timed in this one process on the same data:

- ``x + y`` on 1-element float32 tensors without grad: almost pure per-op overhead;
- the same with ``x.requires_grad=True``: forward only, so the cost of building the graph;
- ``x + y`` on 4M float32 elements: a memory-bound kernel, where the overhead must vanish;
- a 1024x1024 float32 matmul: BLAS-bound;
- a 16x128 @ 128x512 float32 matmul (an LSTM step's size) while two busy-looping processes keep
  the cores busy: too small to gain from a second BLAS thread, which then waits for a time slice.

PyTorch runs with as many threads as kiln (recorded with each result). Run it alone with
``python -m benchmarks.eager_overhead [--quick]`` or through ``python -m benchmarks.run``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np

import kiln

from .common import KILN, Result, Target, compare, skipped, torch_with_kiln_threads

WORKLOAD = "eager_overhead"
ADD_TINY = "add, 1 element"
ADD_TINY_GRAD = "add, 1 element, x.requires_grad"
ADD_LARGE = "add, 4M elements"
MATMUL = "matmul, 1024x1024"
SMALL_MATMUL_BUSY = "matmul, 16x128 @ 128x512, cores busy"
CASES = (ADD_TINY, ADD_TINY_GRAD, ADD_LARGE, MATMUL, SMALL_MATMUL_BUSY)
# Single-threaded, overhead-bound cases: their repeats are interleaved (see common.compare).
TINY = (ADD_TINY, ADD_TINY_GRAD)
BUSY_PROCESSES = 2  # busy-looping processes while SMALL_MATMUL_BUSY runs (this machine's 2 cores)

TARGETS = [
    Target(WORKLOAD, ADD_TINY, "torch", 1.0),  # issue 34: at most PyTorch's time
    Target(WORKLOAD, ADD_TINY_GRAD, "torch", 1.0),
    Target(WORKLOAD, ADD_LARGE, "numpy", 1.2),
    Target(WORKLOAD, MATMUL, "numpy", 1.2),
    Target(WORKLOAD, SMALL_MATMUL_BUSY, None, max_ns=50_000),
]


def _inputs(case: str) -> tuple[np.ndarray, np.ndarray, str]:
    """Both operands as float32 arrays, and the statement that computes the case."""
    rng = np.random.default_rng(0)
    if case == MATMUL:
        shape_x = shape_y = (1024, 1024)
        stmt = "x @ y"
    elif case == SMALL_MATMUL_BUSY:
        shape_x, shape_y = (16, 128), (128, 512)
        stmt = "x @ y"
    else:
        shape_x = shape_y = (1,) if case in TINY else (4 * 1024 * 1024,)
        stmt = "x + y"
    x = rng.standard_normal(shape_x, dtype=np.float32)
    y = rng.standard_normal(shape_y, dtype=np.float32)
    return x, y, stmt


def _runs(stmt: str, namespace: dict) -> str:
    """Why ``stmt`` cannot run (an op kiln lacks, say), or "" when it runs."""
    try:
        eval(stmt, namespace)
    except Exception as error:  # noqa: BLE001 - any failure means "cannot measure": say which
        return f"failed: {type(error).__name__}: {error}"
    return ""


def _case(case: str, quick: bool, torch, threads: int) -> list[Result]:
    """kiln, PyTorch and numpy on one case; repeats interleaved for the single-threaded tiny ops."""
    x, y, stmt = _inputs(case)
    grad = case == ADD_TINY_GRAD
    params = {"shape": list(x.shape), "dtype": "float32", "requires_grad": grad, "threads": threads}
    namespaces = {KILN: {"x": kiln.from_numpy(x.copy()).requires_grad_(grad), "y": kiln.from_numpy(y.copy())}}
    if torch is not None:
        namespaces["torch"] = {"x": torch.from_numpy(x.copy()).requires_grad_(grad), "y": torch.from_numpy(y.copy())}
    if not grad:  # numpy has no autograd: no reference for the graph-building case
        namespaces["numpy"] = {"x": x, "y": y}

    failures = {impl: why for impl, ns in namespaces.items() if (why := _runs(stmt, ns))}
    busy = _busy_cores(BUSY_PROCESSES) if case == SMALL_MATMUL_BUSY else contextlib.nullcontext()
    with busy:
        timings = compare(
            {impl: (stmt, ns) for impl, ns in namespaces.items() if impl not in failures},
            quick=quick,
            interleave=case in TINY,
        )
    if case == SMALL_MATMUL_BUSY:
        params["busy_processes"] = BUSY_PROCESSES
    results = [
        Result(WORKLOAD, case, impl, timings[impl], params=params)
        if impl in timings
        else skipped(WORKLOAD, case, impl, failures[impl])
        for impl in namespaces
    ]
    if torch is None:
        results.append(skipped(WORKLOAD, case, "torch", "torch is not installed"))
    return results


@contextlib.contextmanager
def _busy_cores(processes: int) -> Iterator[None]:
    """``processes`` busy-looping Python processes for the duration (another program's load)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        time.sleep(0.2)  # running before the first repeat
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def run(quick: bool = False, cases: tuple[str, ...] = CASES) -> list[Result]:
    """Every case (or those named), kiln first, then PyTorch (same thread count as kiln) and numpy."""
    with torch_with_kiln_threads() as (torch, threads):
        results = []
        for case in cases:
            results.extend(_case(case, quick, torch, threads))
        return results


if __name__ == "__main__":
    from .run import main

    sys.exit(main([*sys.argv[1:], WORKLOAD]))
