"""Several kernels compiled as one LLVM module (``engine.join_modules``, ``backend.modules``): each
module's set-up is paid once. Grouped by tier, linked with their internal names kept apart, stored in
the kernel cache per kernel and loaded once per module; compiled programs equal eager."""

from __future__ import annotations

import ctypes

import numpy as np

import kiln
from kiln.codegen.llvm import backend, engine, kernel_modules

# Two kernels' modules: each defines an internal helper of the same name and a table of the same name,
# as kiln's generator does (``kiln.math.exp.f32``, ``.first`` tables): linked, they must stay apart.
_TWICE = """
@table = internal constant [2 x i64] [i64 2, i64 7]
define internal i64 @helper(i64 %x) {
  %t = getelementptr inbounds [2 x i64], ptr @table, i64 0, i64 0
  %f = load i64, ptr %t
  %r = mul i64 %x, %f
  ret i64 %r
}
define i64 @twice(i64 %x) {
  %r = call i64 @helper(i64 %x)
  ret i64 %r
}
"""
_PLUS_SEVEN = (
    _TWICE.replace("@twice", "@plus_seven").replace("mul i64", "add i64").replace("i64 0, i64 0\n", "i64 0, i64 1\n")
)


def test_joined_modules_link_into_one_object_and_keep_their_internal_names_apart():
    code = engine.compile_here(engine.join_modules([_TWICE, engine.LIGHT + _PLUS_SEVEN]))
    library = backend.load_objects([code])
    signature = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
    assert signature(library.address("twice"))(5) == 10
    assert signature(library.address("plus_seven"))(5) == 12
    assert engine.compile_here(engine.join_modules([_TWICE])) == engine.compile_here(_TWICE)


def test_kernels_go_to_modules_by_tier_a_few_to_each():
    texts = [engine.LIGHT + f"; light {k}" * (k + 1) for k in range(20)]
    texts += [engine.TINY + "; tiny", "; ModuleID\n; full", engine.TINY + "; tiny too"]
    groups = kernel_modules.grouped(texts)
    assert sorted(k for group in groups for k in group) == list(range(len(texts)))  # each kernel once
    tiers = [{texts[k].split("\n")[0] for k in group} for group in groups]
    assert all(len(tier) == 1 for tier in tiers)  # a module's kernels share their tier
    assert all(len(group) <= kernel_modules.KERNELS_PER_MODULE for group in groups)
    light = [group for group, tier in zip(groups, tiers, strict=True) if tier == {engine.LIGHT[:-1]}]
    assert len(light) == 3  # 20 kernels, 8 at most to a module
    lengths = [sum(len(texts[k]) for k in group) for group in light]
    assert max(lengths) < 1.3 * min(lengths)  # about equally long: the workers share them by modules
    tiny = [group for group, tier in zip(groups, tiers, strict=True) if tier == {engine.TINY[:-1]}]
    assert sorted(map(len, tiny)) == [1, 1]  # two kernels: two modules, one for each worker
    assert kernel_modules.grouped([]) == []


def _step(x, w, b):
    h = (x @ w + b).relu() * 0.5 + x.tanh()
    scale = (b * b).sum().sqrt() + 1.0
    return (h * h).mean(-1) / scale, h.max(0).values, b * 0.9 - scale, (x - 1.0).exp().sum(0)


def test_a_program_compiles_its_kernels_in_fewer_modules_and_loads_each_module_once(caches, monkeypatch):
    _, compiled = caches
    requests: list[int] = []
    counted = engine.compile_many
    monkeypatch.setattr(
        engine, "compile_many", lambda texts, timeout=None: requests.append(len(texts)) or counted(texts, timeout)
    )
    loaded: list[list[bytes]] = []
    load_objects = backend.load_objects
    monkeypatch.setattr(backend, "load_objects", lambda objects: loaded.append(objects) or load_objects(objects))
    rng = np.random.default_rng(5)
    w = kiln.from_numpy(rng.standard_normal((16, 16)).astype(np.float32) * 0.3)
    b = kiln.from_numpy(rng.standard_normal(16).astype(np.float32))
    for attempt in range(2):  # compiled, then every kernel from the kernel cache
        program = kiln.compile(_step)
        for _ in range(3):
            x = kiln.from_numpy(rng.standard_normal((8, 16)).astype(np.float32))
            for ours, theirs in zip(program(x, w, b), _step(x, w, b), strict=True):
                np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-5)
        assert loaded and len(set(loaded[-1])) == len(loaded[-1])  # a module's object once, for all its kernels
        if attempt == 0:
            assert len(compiled) > sum(requests) == len(loaded[-1]) > 0  # fewer modules than kernels
            first = len(requests)
    assert len(requests) == first  # the second program compiled nothing
    code, _ = program.state.specializations[-1].report.generate_seconds[0]
    assert (
        code == f"kernel code ({len(compiled)} distinct, {len(compiled)} from the kernel cache)"
    )  # kernels, not modules
