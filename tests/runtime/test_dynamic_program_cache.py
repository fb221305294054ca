"""A dynamic specialization's program in the disk cache (``frontend/jit/symbolic_cache.py``): a second
process loads it, forward and backward, and computes what eager does; a corrupted entry is rebuilt;
a changed program misses.

Each process runs ``SCRIPT``: a small model's loss over batches of 8, 8 and 13 rows (the 13 makes
the dynamic specialization) and then 5, 21 and 13, each compared with eager (the loss and every
parameter's gradient, fresh each call), and prints the dynamic specialization's forward and
backward ``report.cache`` (and whether the code generator was imported: a hit needs none) and the
dynamic results' bytes as hex (the same object code on the same inputs gives the same bits in
both processes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import kiln
import kiln.nn.functional as F
from kiln.compiler import program_cache

from ..conftest import assert_close

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys

import numpy as np
import kiln
import kiln.nn as nn
import kiln.nn.functional as F

kiln.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

def loss_of(x, y):
    return F.mse_loss(model(x).tanh() * SCALE, y)

compiled = kiln.compile(loss_of, wait=True)
rng = np.random.default_rng(0)
bits = []
for n in (8, 8, 13, 5, 21, 13):
    x = kiln.tensor(rng.standard_normal((n, 6)).astype(np.float32))
    y = kiln.tensor(rng.standard_normal((n, 3)).astype(np.float32))
    results = []
    for fn in (loss_of, compiled):
        for p in model.parameters():
            p.grad = None
        loss = fn(x, y)
        loss.backward()
        results.append([loss.detach().numpy(), *(p.grad.numpy().copy() for p in model.parameters())])
    for expected, actual in zip(*results, strict=True):
        assert np.allclose(actual, expected, rtol=1e-4, atol=1e-5), (n, actual, expected)
    if n in (5, 21):  # run by the dynamic program
        bits += [a.tobytes().hex() for a in results[1]]
spec = compiled.state.specializations[-1]
assert spec.dynamic == [(0, 0), (1, 0)], spec.dynamic
assert len(compiled.state.specializations) == 2
generator = "kiln.codegen.llvm.kernels" in sys.modules  # (a hit needs none)
print(spec.report.cache, spec.backward.program.report.cache, spec.report.kernels, generator)
print("".join(bits))
"""


def _write(tmp_path: Path, scale: str = "2.0") -> Path:
    path = tmp_path / f"dynamic_{scale}.py"
    path.write_text(SCRIPT.replace("SCALE", scale))
    return path


def _run(script: Path, cache: Path) -> tuple[str, str, str]:
    """``(forward's report.cache, backward's report.cache, the results' hex)`` of a run."""
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), KILN_JIT_STRICT="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=ROOT, text=True, capture_output=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    reports, checksum = done.stdout.splitlines()
    forward, backward, kernels, generator = reports.split()
    assert int(kernels) >= 1  # a program of compiled kernels, not of eager ones
    if (forward, backward) == ("hit", "hit"):  # every program from the disk: no code generated
        assert generator == "False"
    return forward, backward, checksum


def _dynamic_entries(cache: Path) -> list[Path]:
    """The entries holding a dynamic program's layouts table (``symbolic_cache.to_entry``)."""
    return [p for p in cache.glob("??/*") if p.is_file() and b'"layouts"' in p.read_bytes()[:4096]]


def test_a_second_process_loads_the_dynamic_programs_from_the_disk_cache(tmp_path):
    script, cache = _write(tmp_path), tmp_path / "cache"
    first = _run(script, cache)
    assert first[:2] == ("miss", "miss")
    assert len(_dynamic_entries(cache)) == 2  # the forward's and the backward's
    second = _run(script, cache)
    assert second == ("hit", "hit", first[2])


def test_a_corrupted_dynamic_entry_is_rebuilt(tmp_path):
    script, cache = _write(tmp_path), tmp_path / "cache"
    *_, result = _run(script, cache)
    entries = _dynamic_entries(cache)
    assert len(entries) == 2
    for path in entries:  # payload bytes past the header: the entry's signature must catch it
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    assert _run(script, cache) == ("miss", "miss", result)
    assert _run(script, cache) == ("hit", "hit", result)


def test_a_dynamic_entry_whose_layouts_do_not_read_is_rebuilt(tmp_path, monkeypatch):
    """Signed but unusable (a layout for a value the graph does not have): a miss, never run."""
    from kiln.frontend.jit import symbolic_cache

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    program_cache.disk_cache.cache_clear()  # made once per process: made again for this directory
    written = symbolic_cache.to_entry

    def damaged(fused, backend, code, report, layouts, traced):
        return written(fused, backend, code, report, {**layouts, 10**6: (4,)}, traced)

    def f(x):
        return F.softmax(x * 2.0, dim=-1) + 1.0

    rng = np.random.default_rng(1)
    states = []
    try:
        for writer in (damaged, written, written):
            monkeypatch.setattr("kiln.frontend.jit.symbolic_program.to_entry", writer)
            compiled = kiln.compile(f, wait=True)
            for n in (4, 4, 7, 9):
                x = kiln.tensor(rng.standard_normal((n, 5)).astype(np.float32))
                assert_close(compiled(x).numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)
            states.append(compiled.state.specializations[-1].report.cache)
    finally:
        program_cache.disk_cache.cache_clear()
    assert states == ["miss", "miss", "hit"]


def test_a_changed_program_misses(tmp_path):
    cache = tmp_path / "cache"
    _run(_write(tmp_path), cache)
    forward, _, _ = _run(_write(tmp_path, "3.0"), cache)  # (the script compares it with eager)
    # the backward may hit: the partition can leave the scale to a value the forward saves
    assert forward == "miss"
    assert len(_dynamic_entries(cache)) >= 3
