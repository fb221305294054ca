"""The CUDA code generator under Numba's CUDA simulator, against eager and the LLVM backend.

The cases live in ``sim_cases.py`` and run in one child process (the simulator is a process-wide
choice made when ``numba.cuda`` is first imported; this keeps it away from the rest of the suite
and from the GPU tests). Each test reports one case's result.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[3]
# the names only: importing the module would switch this process to the simulator
CASES = sorted(re.findall(r"^def case_(\w+)\(", (Path(__file__).parent / "sim_cases.py").read_text(), re.M))


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "tests.codegen.cuda.sim_cases"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith('{"case"'):
            record = json.loads(line)
            out[record["case"]] = record["error"]
    if not out:
        pytest.fail(f"the simulator cases did not run:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return out


@pytest.mark.parametrize("case", CASES)
def test_cuda_backend_under_the_simulator(results, case):
    assert case in results, f"case {case} did not report (the child process stopped early)"
    assert results[case] is None, results[case]
