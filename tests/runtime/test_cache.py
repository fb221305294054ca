"""The on-disk compile cache: hits, misses, bad entries, refused directories, concurrent writers."""

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.runtime import cache as cache_module
from kiln.runtime.cache import DiskCache, cache_key, default_directory

REPO = Path(__file__).resolve().parents[2]
PAYLOAD = bytes(range(256)) * 40


@pytest.fixture
def disk(tmp_path):
    return DiskCache(tmp_path / "cache")


@pytest.fixture
def kiln_warnings(caplog):
    caplog.set_level(logging.DEBUG, logger="kiln")
    return caplog


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kiln" and r.levelno == logging.WARNING]


def test_hit_after_put_and_miss_for_unknown_key(disk):
    key = cache_key("graph", "options")
    assert disk.get(key) is None
    disk.put(key, PAYLOAD)
    assert disk.get(key) == PAYLOAD
    assert disk.get(cache_key("another graph", "options")) is None
    assert (disk.hits, disk.misses) == (1, 2)
    disk.put(key, b"")  # an empty payload is a valid entry, and put replaces
    assert disk.get(key) == b""


def test_entry_layout_and_permissions(disk):
    key = cache_key("k")
    disk.put(key, PAYLOAD)
    path = disk.path(key)
    assert path.parent.parent == disk.directory and len(path.parent.name) == 2
    data = path.read_bytes()
    assert data.startswith(cache_module.MAGIC) and data.endswith(PAYLOAD)
    assert stat.S_IMODE(disk.directory.stat().st_mode) & 0o077 == 0
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def corrupt_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x40
    path.write_bytes(bytes(data))


def corrupt_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


def corrupt_header(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:20])


def corrupt_magic(path: Path) -> None:
    path.write_bytes(b"ELF\0\0\0\0\0" + path.read_bytes()[8:])


def corrupt_version(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8] += 1
    path.write_bytes(bytes(data))


def corrupt_foreign(path: Path, disk: DiskCache) -> None:
    # A valid entry of another key copied over this one.
    other = cache_key("other")
    disk.put(other, PAYLOAD)
    path.write_bytes(disk.path(other).read_bytes())


@pytest.mark.parametrize(
    "corrupt", [corrupt_flip, corrupt_truncate, corrupt_header, corrupt_magic, corrupt_version, corrupt_foreign]
)
def test_bad_entry_is_a_miss_removed_and_rebuilt(disk, kiln_warnings, corrupt):
    key = cache_key("graph")
    disk.put(key, PAYLOAD)
    path = disk.path(key)
    if corrupt is corrupt_foreign:
        corrupt(path, disk)
    else:
        corrupt(path)
    assert disk.get(key) is None
    assert not path.exists()
    assert any("dropping cache entry" in r.getMessage() for r in kiln_warnings.records if r.levelno == logging.DEBUG)
    assert warnings_of(kiln_warnings) == []
    disk.put(key, PAYLOAD)
    assert disk.get(key) == PAYLOAD


def test_directory_writable_by_others_is_refused(tmp_path, kiln_warnings, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("KILN_CACHE_DIR", str(shared))
    disk = DiskCache()
    assert disk.directory == shared and not disk.enabled
    (message,) = warnings_of(kiln_warnings)
    assert "writable by group or others" in message and "chmod 700" in message and "KILN_CACHE_DIR" in message
    disk.put("key", PAYLOAD)
    assert disk.get("key") is None
    assert list(shared.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="changing a directory's owner needs root")
def test_directory_owned_by_someone_else_is_refused(tmp_path, kiln_warnings):
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 12345, 12345)
    assert not DiskCache(foreign).enabled
    (message,) = warnings_of(kiln_warnings)
    assert "owned by uid 12345" in message


def test_directory_that_cannot_be_created_is_refused(tmp_path, kiln_warnings):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    disk = DiskCache(blocker / "cache")
    assert not disk.enabled
    (message,) = warnings_of(kiln_warnings)
    assert "cannot be created" in message
    assert disk.get("key") is None


def test_directory_is_created_private(tmp_path):
    disk = DiskCache(tmp_path / "a" / "b")
    assert disk.enabled and disk.directory.is_dir()
    assert stat.S_IMODE(disk.directory.stat().st_mode) & 0o077 == 0


def test_default_locations(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == tmp_path / "xdg" / "kiln"
    disk = DiskCache()
    assert disk.enabled and disk.directory == tmp_path / "xdg" / "kiln" and disk.directory.is_dir()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_directory() == tmp_path / "home" / ".cache" / "kiln"
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_directory() == tmp_path / "explicit"


def test_io_errors_degrade_to_a_miss_with_one_warning(disk, kiln_warnings, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_module.os, "replace", disk_full)
    disk.put("a", PAYLOAD)
    disk.put("b", PAYLOAD)
    (message,) = warnings_of(kiln_warnings)
    assert "No space left on device" in message
    assert disk.get("a") is None
    assert [p for p in disk.directory.rglob("*") if p.is_file()] == [disk.directory / "secret"]  # no temporary file
    monkeypatch.undo()
    disk.put("a", PAYLOAD)
    assert disk.get("a") == PAYLOAD


def test_unreadable_entry_is_a_miss(disk, kiln_warnings, monkeypatch):
    disk.put("a", PAYLOAD)

    def failing_read(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(cache_module.os, "fdopen", failing_read)
    assert disk.get("a") is None
    assert disk.get("a") is None
    (message,) = warnings_of(kiln_warnings)
    assert "could not read" in message and "Input/output error" in message
    monkeypatch.undo()
    assert disk.get("a") == PAYLOAD


def test_clear_removes_entries_only(disk):
    for key in ("a", "b", "c"):
        disk.put(key, PAYLOAD)
    (disk.directory / "README").write_text("kept")
    disk.clear()
    assert all(disk.get(key) is None for key in ("a", "b", "c"))
    assert sorted(p.name for p in disk.directory.iterdir()) == ["README", "secret"]


def test_cache_key_parts_are_unambiguous():
    assert cache_key("ab", "c") != cache_key("a", "bc")
    assert cache_key("abc") != cache_key("ab", "c") != cache_key("abc", "")
    assert cache_key("x") != cache_key(b"x")
    assert cache_key("a", b"\x00") == cache_key("a", b"\x00")
    assert len(cache_key()) == 64 and int(cache_key("k"), 16) >= 0
    with pytest.raises(TypeError, match="must be str or bytes, but got int"):
        cache_key("a", 1)


WRITER = """
import sys
from kiln.runtime.cache import DiskCache
cache = DiskCache(sys.argv[1])
payload = bytes(range(256)) * 4096
sys.stdin.readline()  # start together
for _ in range(40):
    cache.put("shared key", payload)
    assert cache.get("shared key") == payload, "read a partial or corrupt entry"
print("ok")
"""


def test_two_processes_writing_the_same_key(tmp_path):
    directory = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for _ in range(2)
    ]
    for writer in writers:
        writer.stdin.write("go\n")
        writer.stdin.flush()
    for writer in writers:
        out, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err
        assert out.strip() == "ok"
    disk = DiskCache(directory)
    assert disk.get("shared key") == bytes(range(256)) * 4096
    assert [p.name for p in disk.path("shared key").parent.iterdir()] == [disk.path("shared key").name]
