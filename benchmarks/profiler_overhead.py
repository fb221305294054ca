"""What kiln.profiler's hook costs eager ops when no profile records, as ratios in one process.

``dispatch.apply`` starts with one flag check (``if profiling_ops:``, a global of its module).
This script builds a copy of ``apply`` without those lines (same code otherwise, same module
globals) and times both on small tensors, interleaved, reporting the median per-op times and
their ratio; then the cost of an op while a profile records. Run: ``python -m benchmarks.profiler_overhead``.
"""

from __future__ import annotations

import inspect
import statistics
import textwrap
import time

import kiln
from kiln.frontend import dispatch
from kiln.ir.primitives import PRIMITIVES


def apply_without_hook():
    """``dispatch.apply`` with its profiler hook removed, compiled against the module's own globals."""
    source = textwrap.dedent(inspect.getsource(dispatch.apply))
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if "profiling_ops" in line)
    kept = lines[:start] + lines[start + 4 :]
    assert "profiling" not in "\n".join(kept), "the hook is not the four lines this script removes"
    namespace: dict = {}
    exec(compile("\n".join(kept), "<apply without the profiler hook>", "exec"), dispatch.__dict__, namespace)  # noqa: S102
    return namespace["apply"]


def per_call_ns(fn, args, calls: int = 20_000) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter_ns() - start) / calls


def main(rounds: int = 15) -> dict:
    add = PRIMITIVES["add"]
    a, b = kiln.ones(4), kiln.ones(4)
    plain = apply_without_hook()
    with_hook, without = [], []
    for _ in range(rounds):  # interleaved, so drifts of a shared machine hit both alike
        without.append(per_call_ns(plain, (add, a, b)))
        with_hook.append(per_call_ns(dispatch.apply, (add, a, b)))
    with kiln.profiler.profile():
        recording = [per_call_ns(dispatch.apply, (add, a, b), 5_000) for _ in range(3)]
    result = {
        "apply without hook (ns)": statistics.median(without),
        "apply with hook, profiler off (ns)": statistics.median(with_hook),
        "ratio off/without": statistics.median(w / o for w, o in zip(with_hook, without, strict=True)),
        "apply while recording (ns)": statistics.median(recording),
    }
    for key, value in result.items():
        print(f"{key:40s} {value:10.3f}")
    return result


if __name__ == "__main__":
    main()
