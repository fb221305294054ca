"""The native pool is built before the first kernel that splits needs it: where kiln's product kernels
(which run on it) are built, and while LLVM compiles a program; a split kernel that comes while it is
being built waits for it rather than taking the Python pool. In a cold process the first split kernel
built it, in the second call of a compiled DCGAN or CNN step (~35 ms of its ~40)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kiln.codegen.llvm import pool
from kiln.runtime import threads

pytestmark = pytest.mark.skipif(not pool.supported(), reason="no native pool on this platform")

ROOT = Path(__file__).resolve().parents[3]

PRODUCT = """
import numpy as np
from kiln.codegen.llvm.product_call import Product
from kiln.runtime import threads
assert threads.native_pool_unbuilt()
Product.build(np.float32, 48, False)
print("built" if not threads.native_pool_unbuilt() else "unbuilt", len(threads._native.workers))
"""

PROGRAM = """
import numpy as np
import kiln
from kiln.runtime import threads

def step(x, w):
    return ((x @ w).tanh() * 2.0 + 1.0).sum(-1)

compiled = kiln.compile(step, wait=True)
rng = np.random.default_rng(0)
x, w = (kiln.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((16, 32), (32, 32)))
out = compiled(x, w)  # traced and compiled: its kernels are small, none splits
np.testing.assert_allclose(out.numpy(), step(x, w).numpy(), rtol=1e-5, atol=1e-5)
print("built" if not threads.native_pool_unbuilt() else "unbuilt")
"""


def _run(script: str, cache: Path) -> str:
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), KILN_NATIVE_POOL="1", KILN_EAGER_KERNELS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_building_a_product_kernel_builds_the_native_pool_it_runs_on(tmp_path):
    assert _run(PRODUCT, tmp_path / "cache") == "built 0"  # its code loaded; no worker started yet


def test_a_cold_compile_builds_the_native_pool_while_llvm_compiles_the_program(tmp_path):
    assert _run(PROGRAM, tmp_path / "cache") == "built"


def test_a_split_kernel_waits_for_the_pool_another_thread_builds(monkeypatch):
    built = threading.Event()

    def slow_factory():
        time.sleep(0.3)
        built.set()
        return "the pool"

    monkeypatch.setattr(threads, "_native", None)
    monkeypatch.setattr(threads, "_native_factory", slow_factory)
    building = threading.Thread(target=threads.prepare_native_pool)
    building.start()
    time.sleep(0.05)  # the build is under way
    assert threads.native_pool_unbuilt()
    assert threads._native_pool() == "the pool" and built.is_set()
    building.join()
    assert not threads.native_pool_unbuilt()
