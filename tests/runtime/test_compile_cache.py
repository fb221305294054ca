"""The on-disk compile cache seen from ``kiln.compile``: a second process hits it, a corrupted entry
is rebuilt, concurrent processes both succeed, and a directory others can write to is refused.

Each process runs ``SCRIPT``: it compiles a small function (a reduction kernel and an elementwise
kernel around a matmul), calls it three times and prints the specialization's ``report.cache``
and the result's bytes as hex, so results compare exactly across processes (the same object code
on the same inputs gives the same bits).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import host
from kiln.compiler import program_cache
from kiln.runtime import elf

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
    """The programs' entry files (in the two-digit shard directories; the root also holds the
    secret, and one more entry remembers the host's LLVM signature: ``kiln.codegen.llvm.host``)."""
    key = host.memo_key()
    memo = None if key is None else hashlib.sha256(key.encode()).hexdigest()
    return [p for p in cache.glob("??/*") if p.is_file() and p.parent.name + p.name != memo]


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


def test_a_hit_loads_without_the_code_generator(tmp_path):
    # A hit needs no generator (IR builders, math library) and no compile worker (subprocess), and
    # where kiln loads the objects itself (x86-64 Linux) no LLVM: those are most of a second
    # process's compile latency.
    script = tmp_path / "hit_imports.py"
    unimported = ["kiln.codegen.llvm.kernels", "kiln.codegen.llvm.worker", "kiln.codegen.llvm.emitter"]
    if elf.supported():
        unimported.append("llvmlite.binding")
    script.write_text(_write(tmp_path, PLAIN).read_text().replace(
        "print(spec.report.cache)",
        f"import sys\nprint(spec.report.cache + ','.join(m for m in {unimported!r} if m in sys.modules))",
    ))  # fmt: skip
    cache = tmp_path / "cache"
    first, result = _run(script, cache)
    assert first.startswith("miss") and "kiln.codegen.llvm.kernels" in first  # the miss generated code
    second, again = _run(script, cache)
    assert (second, again) == ("hit", result)


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
    """The driver's DiskCache is made once per process: rebuild it for this test and after it."""
    program_cache.disk_cache.cache_clear()
    yield
    program_cache.disk_cache.cache_clear()


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


# ----------------------------------------------------------------------------- what a hit may use
# Each process imports ``model.py`` from a folder, compiles its ``f``, calls it three times and
# prints the cache state, the result's bytes, the source lines the compiled graph names and
# whether ``kiln.explain`` names the same lines.
MODULE_RUNNER = """
import logging, os, sys
import numpy as np
import kiln

logging.basicConfig(level=logging.WARNING)
sys.path.insert(0, sys.argv[1])
x = kiln.tensor(np.linspace(-2, 2, 60, dtype=np.float32).reshape(6, 10))
if len(sys.argv) > 2:  # a first compile, then a chdir that a relative KILN_CACHE_DIR must not follow
    kiln.compile(lambda t: t - 1)(x)
    os.chdir(sys.argv[2])
import model

def lines(graph):
    found = set()
    for node in graph.nodes:
        if node.loc is not None:
            assert node.loc.filename.endswith("model.py"), node.loc
            found.add(node.loc.line)
        for body in node.bodies:
            found |= lines(body)
    return found

cf = kiln.compile(model.f)
for _ in range(3):
    out = cf(x)
spec = cf.state.specializations[-1]
assert spec.calls == 2, spec.calls
assert np.allclose(out.numpy(), model.f(x).numpy(), rtol=1e-5, atol=1e-6), "compiled result differs from eager"
report = str(kiln.explain(cf))
named = lines(cf.graph)
assert named and all(f'model.py":{line}' in report for line in named), report
print(spec.report.cache, out.numpy().tobytes().hex(), ",".join(map(str, sorted(named))))
"""


def _module(folder: Path, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "model.py").write_text("import kiln\n\n\n" + body)
    return folder


def _run_module(tmp_path: Path, folder: Path, cache: Path | str, *args: str, cwd: Path = ROOT):
    """``(report.cache, result hex, the sorted source lines named)`` of one process."""
    runner = tmp_path / "run_module.py"
    runner.write_text(MODULE_RUNNER)
    process = subprocess.run([sys.executable, str(runner), str(folder), *args], env=_env(cache), cwd=cwd,
                             text=True, capture_output=True, timeout=120)  # fmt: skip
    assert process.returncode == 0, process.stderr
    state, result, lines = process.stdout.split()
    return state, result, [int(n) for n in lines.split(",")], process.stderr


F = """def f(x):
    h = x.exp() * 0.5
    return (h.tanh() + 1) * x
"""


def test_a_comment_above_the_function_is_a_hit_with_the_new_lines(tmp_path):
    folder, cache = tmp_path / "mod", tmp_path / "cache"
    _module(folder, F)
    first, result, lines, _ = _run_module(tmp_path, folder, cache)
    assert (first, lines) == ("miss", [5, 6])
    _module(folder, "# a comment\n# and another\n" + F)
    second, again, moved, _ = _run_module(tmp_path, folder, cache)
    assert second == "hit" and again == result
    assert moved == [7, 8]  # this trace's lines, not those stored with the entry
    assert len(_entries(cache)) == 1


def test_a_statement_split_in_two_is_rebuilt_with_its_lines(tmp_path):
    # The stored graph's line 6 now stands for lines 6 and 7: a hit could not tell which, so rebuild.
    folder, cache = tmp_path / "mod", tmp_path / "cache"
    _module(folder, F)
    assert _run_module(tmp_path, folder, cache)[0] == "miss"
    _module(folder, F.replace("    return (h.tanh() + 1) * x\n", "    h = h.tanh() + 1\n    return h * x\n"))
    state, _, lines, _ = _run_module(tmp_path, folder, cache)
    assert (state, lines) == ("miss", [5, 6, 7])
    state, _, lines, _ = _run_module(tmp_path, folder, cache)
    assert (state, lines) == ("hit", [5, 6, 7])


def test_two_entries_swapped_are_rebuilt_not_run(tmp_path):
    # Same shapes, different programs: each entry put where the other's key leads.
    cache = tmp_path / "cache"
    plus = _module(tmp_path / "plus", "def f(x):\n    return x + 1\n")
    times = _module(tmp_path / "times", "def f(x):\n    return x * 3\n")
    results = {}
    for folder in (plus, times):
        state, results[folder], _, _ = _run_module(tmp_path, folder, cache)
        assert state == "miss"
    first, second = _entries(cache)
    data = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(data)
    for folder in (plus, times):
        state, result, _, _ = _run_module(tmp_path, folder, cache)  # the runner checks against eager
        assert (state, result) == ("miss", results[folder])
    for folder in (plus, times):
        assert _run_module(tmp_path, folder, cache)[:2] == ("hit", results[folder])


def test_entries_of_another_secret_are_rebuilt(tmp_path):
    folder, cache = _module(tmp_path / "mod", F), tmp_path / "cache"
    _, result, _, _ = _run_module(tmp_path, folder, cache)
    (cache / "secret").unlink()  # as if the entries came from another user's kiln
    state, again, _, stderr = _run_module(tmp_path, folder, cache)
    assert (state, again) == ("miss", result)
    assert "WARNING" not in stderr
    assert _run_module(tmp_path, folder, cache)[:2] == ("hit", result)


def test_an_entry_in_a_directory_others_can_write_is_not_run(tmp_path):
    folder, cache = _module(tmp_path / "mod", F), tmp_path / "cache"
    _, result, _, _ = _run_module(tmp_path, folder, cache)
    (entry,) = _entries(cache)
    entry.parent.chmod(0o777)
    state, again, _, stderr = _run_module(tmp_path, folder, cache)
    assert (state, again) == ("miss", result)  # compiled anew, the planted entry left unread
    assert stderr.count("refused") == 1 and "writable by group or others" in stderr, stderr


def test_a_relative_cache_directory_does_not_follow_chdir(tmp_path):
    folder = _module(tmp_path / "mod", F)
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    state, result, _, _ = _run_module(tmp_path, folder, "rel/cache", str(elsewhere), cwd=start)
    assert state == "miss"
    assert len(_entries(start / "rel" / "cache")) == 2 and list(elsewhere.iterdir()) == []
    assert _run_module(tmp_path, folder, "rel/cache", str(elsewhere), cwd=start)[:2] == ("hit", result)


@pytest.mark.parametrize("damage", ["truncated", "newer format"])
def test_a_signed_entry_whose_graph_does_not_read_is_rebuilt(tmp_path, monkeypatch, fresh_disk_cache, damage):
    """The signature proves who wrote an entry, not that it reads: graph bytes that do not read
    (cut short, or of a compact format this kiln does not know) are a miss, rebuilt, never run."""
    from kiln.ir import compact

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    written = compact.graph_to_bytes

    def damaged(graph):
        data = written(graph)
        if damage == "truncated":
            return data[: len(data) - 5]
        return data[:8] + (compact.COMPACT_VERSION + 1).to_bytes(4, "little") + data[12:]

    def f(x, w):
        return (kiln.softmax(x, -1) @ w).tanh() * 0.5

    rng = np.random.default_rng(0)
    x = kiln.tensor(rng.standard_normal((8, 12)).astype(np.float32))
    w = kiln.tensor(rng.standard_normal((12, 4)).astype(np.float32))
    expected = f(x, w).numpy()
    states = []
    for writer in (damaged, written, written):
        monkeypatch.setattr(program_cache, "graph_to_bytes", writer)
        compiled = kiln.compile(f)
        for _ in range(2):
            out = compiled(x, w)
        assert_close(out.numpy(), expected, rtol=1e-5, atol=1e-6)
        states.append(compiled.state.specializations[-1].report.cache)
    assert states == ["miss", "miss", "hit"]  # the damaged entry was rebuilt (and stored whole)
