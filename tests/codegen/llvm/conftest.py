"""Fixtures of the LLVM backend's tests."""

from __future__ import annotations

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
