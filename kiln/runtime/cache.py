"""The on-disk compile cache: object code keyed by everything that decides it.

A compiled function's object code is stored under a key built with ``cache_key`` from the traced
graph's canonical text, kiln's version, the code generator's source hash, the compile options
and the host signature (LLVM version, CPU name and features); a second process with the same key
loads the object instead of compiling.

>>> import tempfile
>>> cache = DiskCache(tempfile.mkdtemp())
>>> key = cache_key("graph text", "kiln 0.1.0")
>>> cache.get(key) is None
True
>>> cache.put(key, b"object code")
>>> cache.get(key)
b'object code'

The cache never makes a compile fail or run wrong code: the directory is private to the user
(created 0o700, refused if someone else owns it or can write to it); every entry carries a
checksum of its payload and a hash of its full key, so a corrupt, truncated or foreign entry is
a miss (and is deleted, to be rebuilt); writes go to a temporary file renamed into place, so a
concurrent reader sees a whole entry or none; an I/O error is a miss with one warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import struct
import tempfile
from pathlib import Path

__all__ = ["DiskCache", "cache_key", "default_directory"]

logger = logging.getLogger("kiln")

MAGIC = b"KILNOBJ\0"
FORMAT_VERSION = 1
# magic, format version, payload length, sha256(payload), sha256(key text)
_HEADER = struct.Struct("<8sIQ32s32s")
_TEMP_PREFIX = ".tmp-"


def cache_key(*parts: str | bytes) -> str:
    """A sha256 hex digest over ``parts``, each length-prefixed so ``("ab", "c") != ("a", "bc")``."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            tag, data = b"s", part.encode("utf-8")
        elif isinstance(part, bytes):
            tag, data = b"b", part
        else:
            raise TypeError(f"cache_key parts must be str or bytes, but got {type(part).__name__}")
        digest.update(tag + len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def default_directory() -> Path:
    """``$KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln``."""
    explicit = os.environ.get("KILN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore a relative value
        return Path(xdg) / "kiln"
    return Path.home() / ".cache" / "kiln"


def _refusal(directory: Path) -> str | None:
    """Why ``directory`` must not hold a cache (None when it is fine), creating it private if missing."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.stat()
    except OSError as error:
        return f"it cannot be created ({error.strerror or error})"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"it is owned by uid {info.st_uid}, not by the current user (uid {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        # Someone else could plant object code that kiln would then run.
        return f"it is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


class DiskCache:
    """Entries ``key -> bytes`` under ``directory`` (default: ``default_directory()``).

    ``get`` returns None on a miss, on a bad entry and on any I/O error; ``put`` never raises
    for I/O errors. ``enabled`` is False when the directory was refused (a warning says why).
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, fsync: bool = False) -> None:
        self.directory = Path(directory).expanduser() if directory is not None else default_directory()
        self.fsync = fsync
        self.hits = 0
        self.misses = 0
        self._io_warned = False
        reason = _refusal(self.directory)
        self.enabled = reason is None
        if reason is not None:
            logger.warning(
                "kiln: the compile cache is disabled: %s is refused because %s. Make it private "
                "(mkdir -p DIR && chmod 700 DIR, owned by you) or point KILN_CACHE_DIR at such a directory.",
                self.directory, reason,
            )  # fmt: skip

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return f"DiskCache({str(self.directory)!r}, {state}, hits={self.hits}, misses={self.misses})"

    def path(self, key: str) -> Path:
        """Where ``key``'s entry lives: sha256 of the key, sharded by its first two hex digits."""
        name = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return self.directory / name[:2] / name[2:]

    def get(self, key: str) -> bytes | None:
        """The payload stored for ``key``, or None (missing, corrupt, foreign, unreadable)."""
        if not self.enabled:
            return None
        path = self.path(key)
        try:
            with open(path, "rb") as file:
                identity = os.fstat(file.fileno())
                data = file.read()
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as error:
            self._warn_io("read", path, error)
            self.misses += 1
            return None
        payload, problem = _decode(data, key)
        if problem is not None:
            logger.debug("kiln: dropping cache entry %s: %s", path, problem)
            self._remove_if_same(path, identity)
            self.misses += 1
            return None
        self.hits += 1
        return payload

    def put(self, key: str, payload: bytes) -> None:
        """Store ``payload`` for ``key`` atomically (readers see the old entry, the new one, or none)."""
        if not self.enabled:
            return
        path = self.path(key)
        temp = None
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=path.parent)  # created 0o600
            with os.fdopen(fd, "wb") as file:
                file.write(_encode(key, payload))
                if self.fsync:
                    file.flush()
                    os.fsync(file.fileno())
            os.replace(temp, path)
        except OSError as error:
            self._warn_io("write", path, error)
            if temp is not None:
                _unlink_quietly(Path(temp))

    def clear(self) -> None:
        """Delete every entry (and leftover temporary file); other files in the directory are left alone."""
        if not self.enabled:
            return
        for shard in self.directory.glob("[0-9a-f][0-9a-f]"):
            if not shard.is_dir():
                continue
            for entry in shard.iterdir():
                if _is_entry_name(entry.name):
                    _unlink_quietly(entry)
            try:
                shard.rmdir()
            except OSError:  # not empty (foreign files) or removed concurrently: leave it
                pass

    def _warn_io(self, action: str, path: Path, error: OSError) -> None:
        if not self._io_warned:
            self._io_warned = True
            logger.warning(
                "kiln: could not %s the compile cache entry %s (%s); compiling without the cache", action, path, error
            )
        else:
            logger.debug("kiln: could not %s the compile cache entry %s (%s)", action, path, error)

    @staticmethod
    def _remove_if_same(path: Path, identity: os.stat_result) -> None:
        # Another process may have just replaced the bad entry with a good one: keep that.
        try:
            now = path.stat()
        except OSError:
            return
        if (now.st_ino, now.st_dev) == (identity.st_ino, identity.st_dev):
            _unlink_quietly(path)


def _encode(key: str, payload: bytes) -> bytes:
    key_hash = hashlib.sha256(key.encode("utf-8")).digest()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest(), key_hash)
    return header + payload


def _decode(data: bytes, key: str) -> tuple[bytes | None, str | None]:
    """``(payload, None)`` for a valid entry of ``key``, else ``(None, what is wrong)``."""
    if len(data) < _HEADER.size:
        return None, f"truncated header ({len(data)} of {_HEADER.size} bytes)"
    magic, version, length, payload_hash, key_hash = _HEADER.unpack_from(data)
    if magic != MAGIC:
        return None, f"not a kiln cache entry (magic {magic!r})"
    if version != FORMAT_VERSION:
        return None, f"format version {version}, expected {FORMAT_VERSION}"
    payload = data[_HEADER.size :]
    if len(payload) != length:
        return None, f"payload of {len(payload)} bytes, the header says {length}"
    if key_hash != hashlib.sha256(key.encode("utf-8")).digest():
        return None, "the entry belongs to another key"
    if hashlib.sha256(payload).digest() != payload_hash:
        return None, "payload checksum mismatch"
    return payload, None


def _is_entry_name(name: str) -> bool:
    if name.startswith(_TEMP_PREFIX):
        return True
    return len(name) == 62 and all(c in "0123456789abcdef" for c in name)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
