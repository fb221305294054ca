"""kiln's benchmarks: workloads timed against references, run with ``python -m benchmarks.run``.

Benchmarks report ratios; they assert nothing. Correctness lives in ``tests/``.
"""

import os

# Timed calls run compiled programs: each compile is waited for (kiln compiles in the background
# by default, and a timed call that ran eagerly meanwhile would measure eager code). A workload that
# times the background mode itself says so.
os.environ.setdefault("KILN_COMPILE_WAIT", "1")
# Likewise eager ops' compiled kernels compile at an op's first call ("sync"), not in the background
# while the warm-up runs: the timed calls measure the steady state a long run reaches.
os.environ.setdefault("KILN_EAGER_KERNELS", "sync")

# kiln before numpy, as a kiln program starts: `import kiln` sets OpenBLAS's spin time, which
# OpenBLAS reads when numpy loads it (kiln/runtime/threads.py)
import kiln
