"""kiln's benchmarks: workloads timed against references, run with ``python -m benchmarks.run``.

Benchmarks report ratios; they assert nothing. Correctness lives in ``tests/``.
"""

# kiln before numpy, as a kiln program starts: `import kiln` sets OpenBLAS's spin time, which
# OpenBLAS reads when numpy loads it (kiln/runtime/threads.py)
import kiln
