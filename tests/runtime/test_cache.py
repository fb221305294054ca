"""The on-disk compile cache: hits, misses, bad entries, refused directories, concurrent writers."""

import hashlib
import hmac
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


# ----------------------------------------------------------------------------- only this user's entries
def refusals_of(caplog) -> list[str]:
    return [m for m in warnings_of(caplog) if "refused" in m]


def test_entries_carry_their_key_and_a_signature(disk):
    key = cache_key("graph")
    disk.put(key, PAYLOAD)
    data = disk.path(key).read_bytes()
    header = cache_module.HEADER_BYTES
    assert data[header : header + len(key)] == key.encode() and data.endswith(PAYLOAD)
    # HMAC-SHA256 keyed by the private secret, over the header's fields, the key and the payload.
    fields = header - 32
    secret = (disk.directory / "secret").read_bytes()
    expected = hmac.new(secret, data[:fields] + key.encode() + PAYLOAD, hashlib.sha256).digest()
    assert data[fields:header] == expected


def test_secret_is_private_made_once_and_shared_by_later_caches(tmp_path):
    first = DiskCache(tmp_path / "cache")
    secret = first.directory / "secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and len(secret.read_bytes()) == 32
    first.put("k", PAYLOAD)
    before = secret.read_bytes()
    second = DiskCache(tmp_path / "cache")
    assert secret.read_bytes() == before
    assert second.get("k") == PAYLOAD
    assert DiskCache(tmp_path / "other").directory.joinpath("secret").read_bytes() != before


def test_an_entry_signed_by_another_secret_is_a_miss_and_rebuilt(tmp_path, kiln_warnings):
    # Another user's kiln (or a copied cache) writes a well-formed entry for the same key.
    mine, theirs = DiskCache(tmp_path / "mine"), DiskCache(tmp_path / "theirs")
    theirs.put("k", b"their machine code")
    mine.path("k").parent.mkdir(mode=0o700)
    mine.path("k").write_bytes(theirs.path("k").read_bytes())
    assert mine.get("k") is None
    assert not mine.path("k").exists()
    assert any("does not verify" in r.getMessage() for r in kiln_warnings.records)
    mine.put("k", PAYLOAD)
    assert mine.get("k") == PAYLOAD


def test_an_entry_moved_under_another_key_is_a_miss(disk):
    disk.put("a", b"code of a")
    disk.put("b", b"code of b")
    disk.path("b").write_bytes(disk.path("a").read_bytes())  # correctly signed, for another key
    assert disk.get("b") is None
    assert disk.get("a") == b"code of a"


def test_a_forged_key_field_does_not_verify(disk):
    disk.put("a", b"code of a")
    data = disk.path("a").read_bytes()
    header = cache_module.HEADER_BYTES
    forged = data[:header] + b"b" + data[header + 1 :]  # same length, claims key "b"
    disk.put("b", b"code of b")
    disk.path("b").write_bytes(forged)
    assert disk.get("b") is None


def test_a_shard_directory_others_can_write_is_refused(disk, kiln_warnings):
    key = cache_key("graph")
    disk.put(key, PAYLOAD)
    shard = disk.path(key).parent
    shard.chmod(0o777)
    assert disk.get(key) is None
    assert disk.get(key) is None
    (message,) = refusals_of(kiln_warnings)  # said once
    assert str(shard) in message and "writable by group or others" in message
    disk.put(key, b"new")  # nothing is written where others could replace it
    assert disk.path(key).read_bytes().endswith(PAYLOAD)
    shard.chmod(0o700)
    assert disk.get(key) == PAYLOAD


def test_an_entry_others_can_write_is_refused_and_rebuilt(disk, kiln_warnings):
    disk.put("k", PAYLOAD)
    disk.path("k").chmod(0o666)
    assert disk.get("k") is None
    assert not disk.path("k").exists()
    (message,) = refusals_of(kiln_warnings)
    assert "writable by group or others (mode 666)" in message
    disk.put("k", PAYLOAD)
    assert disk.get("k") == PAYLOAD


def test_the_root_is_checked_on_every_use(disk, kiln_warnings):
    disk.put("k", PAYLOAD)
    disk.directory.chmod(0o777)
    assert disk.get("k") is None
    disk.put("j", PAYLOAD)
    assert not disk.path("j").exists()
    (message,) = refusals_of(kiln_warnings)
    assert str(disk.directory) in message
    disk.directory.chmod(0o700)
    assert disk.get("k") == PAYLOAD


def test_symbolic_links_are_never_followed(disk, tmp_path, kiln_warnings):
    # A link at an entry's place pointing at a valid entry outside the cache; a shard that is a link.
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    disk.put("k", PAYLOAD)
    entry = disk.path("k")
    (outside / "entry").write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(outside / "entry")
    assert disk.get("k") is None
    assert not entry.is_symlink() and (outside / "entry").exists()  # the link removed, its target kept
    assert "symbolic link" in refusals_of(kiln_warnings)[0]

    other = next(disk.path(k) for k in map(str, range(1000)) if not disk.path(k).parent.exists())
    (outside / "shard").mkdir(mode=0o700)
    (outside / "shard" / other.name).write_bytes(b"")
    other.parent.symlink_to(outside / "shard")
    key = next(k for k in map(str, range(1000)) if disk.path(k) == other)
    assert disk.get(key) is None
    disk.put(key, PAYLOAD)
    assert (outside / "shard" / other.name).read_bytes() == b""  # nothing written through the link
    disk.clear()
    assert (outside / "shard" / other.name).exists() and (outside / "entry").exists()


def test_a_secret_others_can_read_disables_the_cache(tmp_path, kiln_warnings):
    DiskCache(tmp_path / "cache").put("k", PAYLOAD)
    secret = tmp_path / "cache" / "secret"
    secret.chmod(0o644)
    disk = DiskCache(tmp_path / "cache")
    assert not disk.enabled and disk.get("k") is None
    (message,) = warnings_of(kiln_warnings)
    assert str(secret) in message and "readable or writable by others (mode 644)" in message and "Delete it" in message


@pytest.mark.parametrize("problem", ["symlink", "short"])
def test_a_secret_that_is_a_link_or_truncated_disables_the_cache(tmp_path, kiln_warnings, problem):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    if problem == "symlink":
        target = tmp_path / "elsewhere"
        target.write_bytes(bytes(32))
        target.chmod(0o600)
        (root / "secret").symlink_to(target)
    else:
        (root / "secret").write_bytes(b"short")
        (root / "secret").chmod(0o600)
    assert not DiskCache(root).enabled
    (message,) = warnings_of(kiln_warnings)
    assert ("symbolic link" if problem == "symlink" else "holds 5 bytes") in message


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="changing an owner needs root")
def test_entries_and_shards_owned_by_someone_else_are_refused(disk, kiln_warnings):
    disk.put("k", PAYLOAD)
    os.chown(disk.path("k"), 12345, 12345)
    assert disk.get("k") is None
    assert "owned by uid 12345" in refusals_of(kiln_warnings)[0]
    disk.put("k", PAYLOAD)
    os.chown(disk.path("k").parent, 12345, 12345)
    assert disk.get("k") is None
    assert disk.path("k").exists()  # a foreign directory: nothing inside it is touched
    os.chown(disk.path("k").parent, os.getuid(), os.getgid())
    assert disk.get("k") == PAYLOAD


def test_a_relative_directory_is_resolved_once(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    monkeypatch.setenv("KILN_CACHE_DIR", "rel/cache")
    disk = DiskCache()
    assert disk.directory == first / "rel" / "cache" and disk.directory.is_absolute()
    monkeypatch.chdir(second)
    disk.put("k", PAYLOAD)
    assert disk.get("k") == PAYLOAD
    assert disk.path("k").is_relative_to(first) and list(second.iterdir()) == []
    assert DiskCache("rel/cache").directory == second / "rel" / "cache"


def test_a_root_given_through_a_link_is_resolved(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    disk = DiskCache(tmp_path / "link")
    assert disk.enabled and disk.directory == real
    disk.put("k", PAYLOAD)
    assert disk.path("k").is_relative_to(real)


SECRET_RACE = """
import sys
from kiln.runtime.cache import DiskCache
sys.stdin.readline()  # start together
cache = DiskCache(sys.argv[1])
assert cache.enabled
print(cache._signing_key.hex())
"""


def test_processes_making_the_secret_at_once_agree_on_it(tmp_path):
    directory = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    makers = [
        subprocess.Popen([sys.executable, "-c", SECRET_RACE, str(directory)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        for _ in range(4)
    ]  # fmt: skip
    for maker in makers:
        maker.stdin.write("go\n")
        maker.stdin.flush()
    secrets = set()
    for maker in makers:
        out, err = maker.communicate(timeout=60)
        assert maker.returncode == 0, err
        secrets.add(out.strip())
    assert secrets == {(directory / "secret").read_bytes().hex()}
    assert sorted(p.name for p in directory.iterdir()) == ["secret"]  # no temporary file left behind


def test_the_source_digest_reads_each_folder_once_a_process_and_follows_every_file(monkeypatch, tmp_path):
    """Keys name several sets of folders (a program's five, a product kernel's three, the native pool's
    one): each folder's files are read once, and a change to any file changes the digest of every set
    that names its folder, and of no other."""
    root = tmp_path / "kiln"
    for folder, files in {"ir": ["a.py", "sub/b.py"], "codegen": ["c.py"], "runtime": ["d.py"]}.items():
        for name in files:
            (root / folder / name).parent.mkdir(parents=True, exist_ok=True)
            (root / folder / name).write_text(f"# {folder}/{name}\n")
    monkeypatch.setattr(cache_module, "__file__", str(root / "runtime" / "cache.py"))
    reads: list[str] = []
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: reads.append(path.name) or read_bytes(path))

    def fresh(*folders: str) -> str:
        cache_module.source_digest.cache_clear()
        return cache_module.source_digest(*folders)

    cache_module._folder_digest.cache_clear()
    try:
        sets = [("ir", "codegen", "runtime"), ("ir", "codegen"), ("codegen",), ("runtime",)]
        before = [fresh(*folders) for folders in sets]
        assert sorted(reads) == ["a.py", "b.py", "c.py", "d.py"]  # each once, for all four sets
        assert len(set(before)) == len(sets)
        (root / "ir" / "sub" / "b.py").write_text("# changed\n")
        cache_module._folder_digest.cache_clear()  # a new process
        after = [fresh(*folders) for folders in sets]
        assert [b != a for b, a in zip(before, after, strict=True)] == [True, True, False, False]
    finally:
        cache_module.source_digest.cache_clear()
        cache_module._folder_digest.cache_clear()
