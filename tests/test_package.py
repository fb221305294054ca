"""Package-level promises: import time, the logger, the public names."""

from __future__ import annotations

import logging
import subprocess
import sys


def test_import_is_fast_and_lazy():
    # CPU time, not wall time: the budget is about what kiln's import does, not how busy the machine is.
    code = (
        "import time, sys; t = time.process_time(); import kiln; dt = time.process_time() - t; "
        "heavy = [m for m in ('numba', 'llvmlite', 'cupy', 'torch') if m in sys.modules]; print(dt, heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    seconds, heavy = float(out[0]), out[1].strip()
    assert heavy == "[]", f"import kiln pulled in {heavy}"
    assert seconds < 1.0, f"import kiln took {seconds:.2f} s of CPU time"


def test_kiln_logs_under_its_own_logger():
    import kiln  # noqa: F401

    assert logging.getLogger("kiln").handlers or logging.getLogger("kiln").propagate


def test_public_names_follow_pytorch():
    import kiln

    for name in ("tensor", "zeros", "ones", "float32", "int64", "bool", "no_grad", "Tensor", "device", "autograd",
                 "matmul", "cat", "stack", "manual_seed", "Generator", "from_numpy", "from_dlpack", "nn", "cuda"):  # fmt: skip
        assert hasattr(kiln, name), name
    assert kiln.cuda.is_available() in (True, False)
