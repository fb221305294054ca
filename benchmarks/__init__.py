"""kiln's benchmarks: workloads timed against references, run with ``python -m benchmarks.run``.

Benchmarks report ratios; they assert nothing. Correctness lives in ``tests/``.
"""
