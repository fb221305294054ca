"""The on-disk compile cache seen from ``kiln.compile``: a second process hits it, a corrupted entry
is rebuilt, concurrent processes both succeed, and a directory others can write to is refused.

Each process runs ``SCRIPT``: it compiles a small function (a reduction kernel and an elementwise
kernel around a matmul), calls it three times and prints the specialization's ``report.cache``
and the result's bytes as hex, so results compare exactly across processes (the same object code
on the same inputs gives the same bits).
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.runtime import lowering

from ..conftest import assert_close

SCRIPT = """
import numpy as np
import kiln

def f(x, w):
    h = kiln.softmax(x, -1) @ w
    return RESULT

cf = kiln.compile(f)
rng = np.random.default_rng(0)
x = kiln.tensor(rng.standard_normal((32, 48)).astype(np.float32))
w = kiln.tensor(rng.standard_normal((48, 16)).astype(np.float32))
for _ in range(3):
    out = cf(x, w)
spec = cf.state.specializations[-1]
assert spec.calls == 2, spec.calls
expected = f(x, w).numpy()
assert np.allclose(out.numpy(), expected, rtol=1e-4, atol=1e-5), "compiled result differs from eager"
print(spec.report.cache)
print(out.numpy().tobytes().hex())
"""

#: The function's result: no scalar constant (so kernel bodies hold none), or some.
PLAIN = "h.tanh() * h - h.sigmoid()"
WITH_CONSTANTS = "(h.tanh() + 1) * 0.5"

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, result: str) -> Path:
    path = tmp_path / "compile_once.py"
    path.write_text(SCRIPT.replace("RESULT", result))
    return path


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return _write(tmp_path, WITH_CONSTANTS)


def _env(cache: Path) -> dict:
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), KILN_JIT_STRICT="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _start(script: Path, cache: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script)], env=_env(cache), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _finish(process: subprocess.Popen) -> tuple[str, str]:
    """``(report.cache, result hex)`` of a finished run; fails with its stderr if it failed."""
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    cache, checksum = stdout.split()
    return cache, checksum


def _run(script: Path, cache: Path) -> tuple[str, str]:
    return _finish(_start(script, cache))


def _entries(cache: Path) -> list[Path]:
    """The entry files (in the two-digit shard directories; the root also holds the secret)."""
    return [p for p in cache.glob("??/*") if p.is_file()]


# WITH_CONSTANTS: kernel bodies hold 0-d constants, which the entry must give back 0-d (safetensors
# alone loads them as shape (1,) and the entry then never loaded: every process recompiled).
@pytest.mark.parametrize("result", [PLAIN, WITH_CONSTANTS], ids=["plain", "constants"])
def test_a_second_process_hits_the_disk_cache(tmp_path, result):
    script = _write(tmp_path, result)
    cache = tmp_path / "cache"
    first, result = _run(script, cache)
    assert first == "miss"
    assert _entries(cache), "nothing was written to the cache"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700  # created private to the user
    second, again = _run(script, cache)
    assert second == "hit"
    assert again == result


def test_a_corrupted_cache_file_is_rebuilt(script, tmp_path):
    cache = tmp_path / "cache"
    first, result = _run(script, cache)
    assert first == "miss"
    entries = _entries(cache)
    assert entries
    for path in entries:  # flip payload bytes only (past the header): the signature must catch it
        data = bytearray(path.read_bytes())
        assert len(data) > 1000
        for i in (len(data) // 2, len(data) - 1):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    second, rebuilt = _run(script, cache)
    assert second == "miss"
    assert rebuilt == result
    third, again = _run(script, cache)
    assert third == "hit"
    assert again == result


def test_two_processes_compiling_at_once_both_succeed(script, tmp_path):
    cache = tmp_path / "cache"
    processes = [_start(script, cache), _start(script, cache)]
    runs = [_finish(p) for p in processes]
    assert all(state in ("miss", "hit") for state, _ in runs), runs
    assert runs[0][1] == runs[1][1]
    third, result = _run(script, cache)
    assert third == "hit"
    assert result == runs[0][1]
    assert not [p for p in _entries(cache) if p.name.startswith(".tmp-")], "a temporary file was left behind"


@pytest.fixture
def fresh_disk_cache():
    """``lowering``'s DiskCache is made once per process: rebuild it for this test and after it."""
    lowering._disk_cache.cache_clear()
    yield
    lowering._disk_cache.cache_clear()


def test_a_cache_directory_others_can_write_is_refused(tmp_path, monkeypatch, caplog, fresh_disk_cache):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))

    def f(x):
        return (x * 3).exp() - 1

    x = kiln.tensor(np.linspace(-2, 2, 60, dtype=np.float32).reshape(6, 10))
    cf = kiln.compile(f)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(3):
            out = cf(x)
    spec = cf.state.specializations[-1]
    assert spec.calls == 2 and spec.report.kernels == 1
    assert spec.report.cache == "off"
    assert_close(out, f(x), rtol=1e-5, atol=1e-6)
    assert any("writable by group or others" in r.getMessage() for r in caplog.records), caplog.text
    assert _entries(cache) == []  # nothing written where others could replace it
