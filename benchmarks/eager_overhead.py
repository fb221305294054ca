"""Eager overhead: what kiln's Python layer costs per op, next to PyTorch (CPU) and numpy.

Four cases, every implementation timed in this one process on the same data:

- ``x + y`` on 1-element float32 tensors without grad: almost pure per-op overhead;
- the same with ``x.requires_grad=True``: forward only, so the cost of building the graph;
- ``x + y`` on 4M float32 elements: a memory-bound kernel, where the overhead must vanish;
- a 1024x1024 float32 matmul: BLAS-bound.

PyTorch runs with as many threads as kiln (recorded with each result). Run it alone with
``python -m benchmarks.eager_overhead [--quick]`` or through ``python -m benchmarks.run``.
"""

from __future__ import annotations

import sys

import numpy as np

import kiln

from .common import KILN, Result, Target, compare, skipped, torch_with_kiln_threads

WORKLOAD = "eager_overhead"
ADD_TINY = "add, 1 element"
ADD_TINY_GRAD = "add, 1 element, x.requires_grad"
ADD_LARGE = "add, 4M elements"
MATMUL = "matmul, 1024x1024"
# Single-threaded, overhead-bound cases: their repeats are interleaved (see common.compare).
TINY = (ADD_TINY, ADD_TINY_GRAD)

TARGETS = [
    Target(WORKLOAD, ADD_TINY, "torch", 4.0),
    Target(WORKLOAD, ADD_TINY_GRAD, "torch", 5.0),
    Target(WORKLOAD, ADD_LARGE, "numpy", 1.2),
    Target(WORKLOAD, MATMUL, "numpy", 1.2),
]


def _inputs(case: str) -> tuple[np.ndarray, np.ndarray, str]:
    """Both operands as float32 arrays, and the statement that computes the case."""
    rng = np.random.default_rng(0)
    if case == MATMUL:
        shape_x = shape_y = (1024, 1024)
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
    timings = compare(
        {impl: (stmt, ns) for impl, ns in namespaces.items() if impl not in failures},
        quick=quick,
        interleave=case in TINY,
    )
    results = [
        Result(WORKLOAD, case, impl, timings[impl], params=params)
        if impl in timings
        else skipped(WORKLOAD, case, impl, failures[impl])
        for impl in namespaces
    ]
    if torch is None:
        results.append(skipped(WORKLOAD, case, "torch", "torch is not installed"))
    return results


def run(quick: bool = False, cases: tuple[str, ...] = (ADD_TINY, ADD_TINY_GRAD, ADD_LARGE, MATMUL)) -> list[Result]:
    """Every case (or those named), kiln first, then PyTorch (same thread count as kiln) and numpy."""
    with torch_with_kiln_threads() as (torch, threads):
        results = []
        for case in cases:
            results.extend(_case(case, quick, torch, threads))
        return results


if __name__ == "__main__":
    from .run import main

    sys.exit(main([*sys.argv[1:], WORKLOAD]))
