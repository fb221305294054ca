"""Identical kernels compile once: within a program (an unrolled loop's steps share one function),
and across specializations and processes (the kernel cache, one entry per kernel). Compiled
results are compared with eager over several calls."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import engine, kernel_cache, pool
from kiln.runtime.cache import DiskCache


def _unrolled(steps: int):
    def step(h, w, b):
        for _ in range(steps):
            h = (h @ w + b).tanh() * 0.5 + h  # the same kernels at every step
        return h.sum(-1)

    return step


def _args(seed: int = 0, rows: int = 4):
    rng = np.random.default_rng(seed)
    return [kiln.from_numpy(rng.standard_normal(s).astype(np.float32) * 0.3) for s in ((rows, 8), (8, 8), (8,))]


def _matches_eager(fn, compiled, calls: int = 3, rows: int = 4) -> None:
    for call in range(calls):
        args = _args(call, rows)
        np.testing.assert_allclose(compiled(*args).numpy(), fn(*args).numpy(), rtol=1e-5, atol=1e-6)


def test_an_unrolled_loop_compiles_as_many_kernels_for_4_steps_as_for_16(caches, tmp_path, monkeypatch):
    _, compiled = caches
    modules = []
    for steps in (4, 16):
        empty = DiskCache(tmp_path / f"kernels-{steps}")  # else the second loop finds every kernel cached
        monkeypatch.setattr(kernel_cache, "kernel_cache", lambda empty=empty: empty)
        compiled.clear()
        fn = _unrolled(steps)
        program = kiln.compile(fn, options=kiln.CompileOptions(loops=False))  # unrolled: not one loop node
        _matches_eager(fn, program)
        report = program.state.specializations[-1].report
        modules.append(len(compiled))
        assert report.kernels >= steps  # a kernel per step, all calling one function
    assert modules[0] == modules[1] > 0
    assert modules[1] <= 3  # the steps' kernel, the last step's (its result is also summed), the sum


def test_a_second_specialization_takes_the_kernels_it_shares_from_the_cache(caches):
    kernels, compiled = caches
    fn = _unrolled(3)
    program = kiln.compile(fn)
    _matches_eager(fn, program)
    first, hits = len(compiled), kernels.hits
    assert first > 0
    program(*_args(rows=4, seed=5)[:1], *(t * 2 for t in _args()[1:]))  # same shapes: no new specialization
    assert len(compiled) == first
    compiled.clear()
    # a new kiln.compile of the same code: every kernel from the kernel cache, none compiled
    again = kiln.compile(_unrolled(3))
    _matches_eager(fn, again)
    assert compiled == [] and kernels.hits > hits


def test_a_new_batch_size_compiles_only_its_new_kernels(caches):
    kernels, compiled = caches

    def two_parts(x, y):
        return (x * 2.0 + 1.0).exp(), (y - 1.0).tanh() * 3.0  # two kernels: x's does not change below

    rng = np.random.default_rng(0)
    x = kiln.from_numpy(rng.standard_normal((5, 7)).astype(np.float32))
    program = kiln.compile(two_parts)
    for rows in (3, 4):  # the second size of y is a second specialization, sharing x's kernel
        compiled.clear()
        y = kiln.from_numpy(rng.standard_normal((rows, 2)).astype(np.float32))
        for _ in range(3):
            for ours, theirs in zip(program(x, y), two_parts(x, y), strict=True):
                np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
        assert len(compiled) == (2 if rows == 3 else 1)
    assert len(program.state.specializations) == 2 and kernels.hits >= 1


def _entries(kernels: DiskCache) -> list[Path]:
    return [p for p in kernels.directory.glob("??/*") if p.is_file()]


def _module_texts(monkeypatch) -> list[str]:
    """The module texts LLVM is asked to compile, several kernels' each (``engine.join_modules``)."""
    texts: list[str] = []
    compile_many = engine.compile_many
    monkeypatch.setattr(
        engine, "compile_many", lambda some, timeout=None: texts.extend(some) or compile_many(some, timeout)
    )
    return texts


def test_corrupt_kernel_entries_are_compiled_again(caches, monkeypatch):
    kernels, compiled = caches
    modules = _module_texts(monkeypatch)
    fn = _unrolled(2)
    _matches_eager(fn, kiln.compile(fn))
    entries = _entries(kernels)
    assert entries and len(entries) == len(compiled) + len(modules)  # a kernel's entry each, a module's each
    for path in entries:  # flipped bytes: the entry's MAC fails, it is a miss, deleted and rebuilt
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    kernel_count = len(compiled)
    compiled.clear()
    _matches_eager(fn, kiln.compile(_unrolled(2)))  # a new function: compiled again, not reused
    assert len(compiled) == kernel_count
    # entries that verify (this user's) but hold no kernel: rebuilt too, never loaded
    monkeypatch.setattr(kernels, "get", lambda key: b"\x03\x00\x00\x00\x00\x00\x00\x00[1]")
    compiled.clear()
    _matches_eager(fn, kiln.compile(_unrolled(2)))
    assert len(compiled) == kernel_count


def _several_kernels(x, w):
    h = (x @ w).relu() + x.tanh()
    return h.sum(-1), (h * h).mean(0), (x - 1.0).exp().max(-1).values


def test_a_modules_object_is_stored_once_and_its_kernels_need_it(caches, monkeypatch):
    kernels, compiled = caches
    modules = _module_texts(monkeypatch)
    stored: dict[str, bytes] = {}
    put = kernels.put
    monkeypatch.setattr(kernels, "put", lambda key, payload: stored.setdefault(key, payload) and put(key, payload))
    rng = np.random.default_rng(3)
    x, w = (kiln.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((6, 8), (8, 8)))
    expected = [t.numpy() for t in _several_kernels(x, w)]
    for _ in kiln.compile(_several_kernels)(x, w):
        pass
    assert len(modules) < len(compiled)  # several kernels to a module
    assert len(_entries(kernels)) == len(compiled) + len(modules)  # each module's object once, not per kernel
    # every module entry gone: the kernel entries naming them are misses, and every kernel is compiled again
    module_keys = [key for key, payload in stored.items() if kernel_cache.module_of(payload, key) is not None]
    assert len(module_keys) == len(modules)
    for key in module_keys:
        kernels.path(key).unlink()
    kernel_count, compiled[:] = len(compiled), []
    results = kiln.compile(_several_kernels)(x, w)
    assert len(compiled) == kernel_count
    for ours, theirs in zip(results, expected, strict=True):
        np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-5, atol=1e-6)


def test_a_kernel_entry_round_trips_and_refuses_what_is_not_one():
    info, module = kernel_cache.KernelInfo("kiln_kabc", 12, 3456), kernel_cache.module_key(b"\x7fELF...")
    assert kernel_cache.from_entry(kernel_cache.to_entry(info, module)) == (info, module)
    for bad in (b"", b"\x02\x00\x00\x00\x00\x00\x00\x00[]", kernel_cache.to_entry(info, ""),
                kernel_cache.to_entry(info, module[:-1]), kernel_cache.to_entry(info, module) + b"\x7fELF"):  # fmt: skip
        with pytest.raises(ValueError):
            kernel_cache.from_entry(bad)
    with pytest.raises(ValueError, match="not kiln_k"):  # stored under another kernel's key
        kernel_cache.from_entry(kernel_cache.to_entry(info, module), "f" * 64)
    # a module's entry is its object code, taken only under the digest of those bytes
    assert kernel_cache.module_of(b"\x7fELF...", module) == b"\x7fELF..."
    assert kernel_cache.module_of(b"\x7fELF..!", module) is None and kernel_cache.module_of(None, module) is None


def _over_a_sequence(xs, w, u, b):
    """An RNN over ``xs`` [T, B, H]: the bias is added to the whole input projection, each step
    reads its row (``proj[t]``: a slice that would otherwise be part of each step's kernel)."""
    proj = xs @ w + b
    h = kiln.zeros(xs.shape[1], xs.shape[2])
    for t in range(xs.shape[0]):
        h = (proj[t] + h @ u).tanh()
    return h.sum()


def test_the_steps_of_a_loop_over_a_sequence_share_their_kernels(caches, tmp_path, monkeypatch):
    _, compiled = caches
    rng = np.random.default_rng(0)
    modules = []
    for steps in (4, 16):
        empty = DiskCache(tmp_path / f"kernels-{steps}")
        monkeypatch.setattr(kernel_cache, "kernel_cache", lambda empty=empty: empty)
        compiled.clear()
        program = kiln.compile(_over_a_sequence)
        for _ in range(3):
            args = [kiln.from_numpy(rng.standard_normal(s).astype(np.float32) * 0.3)
                    for s in ((steps, 3, 8), (8, 8), (8, 8), (8,))]  # fmt: skip
            np.testing.assert_allclose(program(*args).numpy(), _over_a_sequence(*args).numpy(), rtol=1e-5, atol=1e-5)
        modules.append(len(compiled))
    assert modules[0] == modules[1] > 0


POOL_SCRIPT = """
import sys
from kiln.codegen.llvm import pool
native = pool.NativePool()
native.ensure(2)
native.stop()
print("llvm" if "llvmlite.binding" in sys.modules else "no llvm")
"""


@pytest.mark.skipif(not pool.supported(), reason="no native pool on this platform")
def test_the_native_pool_loads_from_the_cache_without_llvm_in_a_second_process(second_process):
    """The native thread pool's object code is compiled once per host: a warm process (its programs
    from the cache) then loads no LLVM at its first split kernel."""
    assert second_process(POOL_SCRIPT) == ["llvm", "no llvm"]


@pytest.mark.skipif(not pool.supported(), reason="no native pool on this platform")
def test_the_native_pool_is_compiled_at_the_tiny_tier(monkeypatch, tmp_path):
    """The pool's module costs LLVM what a tiny kernel costs (its O2 pipeline took 30-40 ms of a cold
    process's second step): a cache miss compiles it at ``engine.TINY``, and the pool built from it runs."""
    texts = []
    compile_here = engine.compile_here
    monkeypatch.setattr(engine, "compile_here", lambda text: texts.append(text) or compile_here(text))
    monkeypatch.setattr(kernel_cache, "kernel_cache", lambda: DiskCache(tmp_path))  # empty: a miss
    native = pool.NativePool()
    assert [text.startswith(engine.TINY) for text in texts] == [True]
    try:
        native.ensure(1)
        seen = []
        kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
            lambda args, begin, end: seen.append((begin, end))
        )
        native.run(ctypes.cast(kernel, ctypes.c_void_p), None, 8, 4, 2, 1)
        assert sorted(seen) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    finally:
        native.stop()


def test_an_entry_made_at_another_optimization_level_is_not_taken(monkeypatch):
    """The key names both levels: the code generator's and the optimization pipeline's."""
    text = "a kernel's canonical text"
    key = kernel_cache.kernel_key(text)
    assert kernel_cache.kernel_key(text) == key
    monkeypatch.setattr(engine, "PIPELINE_LEVEL", engine.PIPELINE_LEVEL + 1)
    assert kernel_cache.kernel_key(text) != key
    monkeypatch.undo()
    monkeypatch.setattr(engine, "OPT_LEVEL", engine.OPT_LEVEL - 1)
    assert kernel_cache.kernel_key(text) != key


def test_a_kernel_is_renamed_without_a_pattern_where_its_references_are_quoted(monkeypatch):
    info = kernel_cache.KernelInfo("kiln_k1", 4, 64)
    text = ('@"kiln_k1.table" = internal constant [1 x i64] [i64 3]\n'
            'define void @"kiln_k1"(ptr %"args") {\n  call void @"kiln_k12"()\n  ret void\n}\n'
            'declare void @"kiln_k12"()\n')  # fmt: skip
    expected = text.replace('@"kiln_k1"', "@kiln_kNEW")
    patterns: list = []
    compile_pattern = kernel_cache.re.compile
    monkeypatch.setattr(kernel_cache.re, "compile", lambda *a: patterns.append(a) or compile_pattern(*a))
    renamed, new = kernel_cache.renamed(text, info, "kiln_kNEW")
    monkeypatch.undo()
    assert renamed == expected and new.symbol == "kiln_kNEW" and new.fixed_extent == 4
    assert not patterns  # a pattern compiled per kernel was ~5% of the code generator's time
    unquoted = text.replace('define void @"kiln_k1"', "define void @kiln_k1")  # written by hand: the pattern
    assert kernel_cache.renamed(unquoted, info, "kiln_kNEW")[0] == expected
