"""Fixtures of the LLVM backend's tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.codegen.llvm import engine, kernel_cache
from kiln.compiler import program_cache
from kiln.runtime.cache import DiskCache


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Program and kernel caches of this test's own; the program cache off, so each compile
    reaches the backend. ``(the kernel cache, the module texts LLVM is asked to compile)``: each
    kernel's, also where several are compiled as one module (``engine.join_modules``)."""
    programs, kernels = DiskCache(tmp_path / "programs"), DiskCache(tmp_path / "kernels")
    programs.enabled = False
    monkeypatch.setattr(program_cache, "disk_cache", lambda: programs)
    monkeypatch.setattr(kernel_cache, "kernel_cache", lambda: kernels)
    compile_many, compiled = engine.compile_many, []

    def counted(texts, timeout=None):
        for text in texts:  # each kernel's module, also where several are compiled as one
            compiled.extend(text.split(engine.NEXT_MODULE))
        return compile_many(texts, timeout)

    monkeypatch.setattr(engine, "compile_many", counted)
    return kernels, compiled


@pytest.fixture
def modules(caches):
    """The module texts LLVM is asked to compile (on ``caches``)."""
    return caches[1]


@pytest.fixture
def second_process(tmp_path):
    """``run(script)``: ``script`` run in two fresh processes, one after the other, on one disk cache of
    this test's own; the two processes' printed lines (each asserted to exit 0): what a cold process and
    a warm one do."""
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))

    def run(script: str) -> list[str]:
        runs = [subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                               timeout=120) for _ in range(2)]  # fmt: skip
        assert [r.returncode for r in runs] == [0, 0], [r.stderr[-2000:] for r in runs]
        return [r.stdout.strip() for r in runs]

    return run
