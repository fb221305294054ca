"""The on-disk compile cache: object code keyed by everything that decides it, run only if this user's kiln wrote it.

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

Loading an entry means running its machine code, so the cache never uses a file that this
user's kiln did not write, and never makes a compile fail:

- the root directory is made absolute once, when the cache is made (a later ``os.chdir`` does not
  move it; a symbolic link in the configured path is resolved then), created 0o700, and refused
  if someone else owns it or can write to it;
- every directory and file on the way from the root to an entry is checked each time it is used:
  owned by this user, not writable by group or others, not a symbolic link;
- entries are bound to this user: each carries its full key and an HMAC-SHA256 of its header,
  key and payload, keyed by a secret of 32 random bytes kept in the root (``secret``, mode 0o600,
  created atomically). An entry that does not verify, or stored under another key, is a miss: it
  is deleted and rebuilt;
- writes go to a temporary file renamed into place, so a concurrent reader sees a whole entry or
  none; an I/O error is a miss.

A refused directory or file is logged once per cache (a warning naming it and why); the compile
goes on without it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import logging
import os
import secrets
import stat
import struct
import tempfile
from pathlib import Path

__all__ = ["DiskCache", "cache_key", "default_cache", "default_directory", "kernels_of"]

logger = logging.getLogger("kiln")
_REFUSALS_WARNED: set[Path] = set()  # cache directories whose refusal was said (a warning once, then debug)

MAGIC = b"KILNOBJ\0"
FORMAT_VERSION = 2
# magic, format version, key length, payload length; then the MAC, the key and the payload
_FIELDS = struct.Struct("<8sIIQ")
_MAC_BYTES = 32
HEADER_BYTES = _FIELDS.size + _MAC_BYTES
SECRET_NAME = "secret"
_SECRET_BYTES = 32
_TEMP_PREFIX = ".tmp-"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


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


@functools.cache
def source_digest(*folders: str) -> str:
    """A digest of the Python source under those folders of the kiln package (``"ir"``,
    ``"codegen"``, ...): what a cache key needs to change whenever the code deciding an entry does
    (the source says more than a version number would). Each folder is read once a process
    (``_folder_digest``), whatever sets of folders the keys name: a warm DCGAN process's keys (its
    program's, its product kernels', the native pool's) read ``codegen`` three times and ``ir`` and
    ``runtime`` twice, 5.5 ms of CPU more, beside its traced call."""
    return cache_key(*(part for folder in folders for part in (folder, _folder_digest(folder))))


@functools.cache
def _folder_digest(folder: str) -> str:
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted((root / folder).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def default_cache() -> DiskCache:
    """The process's cache in ``default_directory()``, made (and its path made absolute) at first use:
    the driver's programs are stored here and the LLVM backend's kernels in ``kernels_of`` it."""
    return DiskCache()


@functools.cache
def kernels_of(cache: DiskCache) -> DiskCache:
    """The cache of compiled kernels kept beside ``cache``'s programs, in its folder ``kernels``."""
    return DiskCache(cache.directory / "kernels")


def default_directory() -> Path:
    """``$KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln``; always absolute."""
    explicit = os.environ.get("KILN_CACHE_DIR")
    if explicit:
        return _absolute(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore a relative value
        return Path(xdg) / "kiln"
    return _absolute(Path.home() / ".cache" / "kiln")


def _absolute(path: str | os.PathLike) -> Path:
    return Path(os.path.abspath(os.path.expanduser(path)))


class Refused(Exception):
    """``path`` in the cache must not be used (the message says why); ``remove``: it is an entry
    file in a sound directory, which may be deleted so that the entry is rebuilt."""

    def __init__(self, reason: str, path: Path | None = None, *, remove: bool = False) -> None:
        super().__init__(reason)
        self.path = path
        self.remove = remove


def _check_owner_and_mode(info: os.stat_result, forbidden: int = _GROUP_OTHER_WRITE) -> None:
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise Refused(f"it is owned by uid {info.st_uid}, not by the current user (uid {os.getuid()})")
    if info.st_mode & forbidden:
        # Someone else could plant object code that kiln would then run.
        who = "writable by group or others" if forbidden == _GROUP_OTHER_WRITE else "readable or writable by others"
        raise Refused(f"it is {who} (mode {stat.S_IMODE(info.st_mode):o})")


def _check_directory(path: Path) -> None:
    """Raise ``Refused`` unless ``path`` is a real directory (no symlink) of this user that no one
    else can write to; ``FileNotFoundError`` when it does not exist."""
    info = os.lstat(path)
    try:
        if stat.S_ISLNK(info.st_mode):
            raise Refused("it is a symbolic link")
        if not stat.S_ISDIR(info.st_mode):
            raise Refused("it is not a directory")
        _check_owner_and_mode(info)
    except Refused as why:
        raise Refused(str(why), path) from None


def _open_file(path: Path, forbidden: int = _GROUP_OTHER_WRITE) -> int:
    """A read-only descriptor of the regular file ``path`` of this user (never through a symlink)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Refused("it is a symbolic link", path, remove=True) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused("it is not a regular file")
        _check_owner_and_mode(info, forbidden)
    except Refused as why:
        os.close(fd)
        raise Refused(str(why), path, remove=True) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _root(directory: Path) -> tuple[Path, str | None]:
    """``directory`` with symbolic links resolved, created private if missing, and why it must not
    hold a cache (None when it is fine)."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        resolved = Path(os.path.realpath(directory))
        _check_directory(resolved)
    except Refused as why:
        return directory, str(why)
    except OSError as error:
        return directory, f"it cannot be created ({error.strerror or error})"
    return resolved, None


def _secret(directory: Path) -> bytes:
    """The secret that signs entries, made on first use; ``Refused`` if the file is not private."""
    path = directory / SECRET_NAME
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    # Written whole into a private temporary file, then linked into place: a concurrent process
    # sees no secret or a complete one, and the first link wins (the loser reads the winner's).
    temp = directory / f"{_TEMP_PREFIX}secret-{os.getpid()}-{secrets.token_hex(8)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(secrets.token_bytes(_SECRET_BYTES))
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: a rename is atomic too
            if not os.path.lexists(path):
                os.replace(temp, path)
    finally:
        _unlink_quietly(temp)
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    with os.fdopen(_open_file(path, forbidden=0o077), "rb") as file:
        data = file.read(_SECRET_BYTES + 1)
    if len(data) != _SECRET_BYTES:
        raise Refused(f"it holds {len(data)} bytes, not {_SECRET_BYTES}")
    return data


class DiskCache:
    """Entries ``key -> bytes`` under ``directory`` (default: ``default_directory()``).

    ``get`` returns None on a miss, on a bad or refused entry and on any I/O error; ``put`` never
    raises for I/O errors. ``enabled`` is False when the directory was refused (a warning says why).
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, fsync: bool = False) -> None:
        configured = _absolute(directory) if directory is not None else default_directory()
        # Resolved once, here: below the root, no symbolic link is ever followed.
        self.directory, reason = _root(configured)
        self.fsync = fsync
        self.hits = 0
        self.misses = 0
        self._io_warned = False
        self._signing_key = b""
        if reason is not None:
            logger.warning(
                "kiln: the compile cache is disabled: %s is refused because %s. Make it private "
                "(mkdir -p DIR && chmod 700 DIR, owned by you) or point KILN_CACHE_DIR at such a directory.",
                configured, reason,
            )  # fmt: skip
        else:
            try:
                self._signing_key = _secret(self.directory)
            except Refused as why:
                reason = str(why)
            except OSError as error:
                reason = f"it cannot be made or read ({error.strerror or error})"
            if reason is not None:
                logger.warning(
                    "kiln: the compile cache is disabled: its secret file %s is refused because %s. "
                    "Delete it (kiln makes a new one, and rebuilds the entries).",
                    self.directory / SECRET_NAME, reason,
                )  # fmt: skip
        self.enabled = reason is None

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return f"DiskCache({str(self.directory)!r}, {state}, hits={self.hits}, misses={self.misses})"

    def path(self, key: str) -> Path:
        """Where ``key``'s entry lives: sha256 of the key, sharded by its first two hex digits."""
        name = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return self.directory / name[:2] / name[2:]

    def get(self, key: str) -> bytes | None:
        """The payload stored for ``key``, or None (missing, corrupt, foreign, refused, unreadable)."""
        if not self.enabled:
            return None
        path = self.path(key)
        try:
            _check_directory(self.directory)
            _check_directory(path.parent)
            with os.fdopen(_open_file(path), "rb") as file:
                identity = os.fstat(file.fileno())
                data = file.read()
        except FileNotFoundError:
            self.misses += 1
            return None
        except Refused as why:
            self._refuse(why)
            self.misses += 1
            return None
        except OSError as error:
            self._warn_io("read", path, error)
            self.misses += 1
            return None
        payload, problem = _decode(self._signing_key, data, key)
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
            _check_directory(self.directory)
            try:
                path.parent.mkdir(mode=0o700)
            except FileExistsError:
                pass
            _check_directory(path.parent)
            fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=path.parent)  # created 0o600
            with os.fdopen(fd, "wb") as file:
                file.write(_encode(self._signing_key, key, payload))
                if self.fsync:
                    file.flush()
                    os.fsync(file.fileno())
            os.replace(temp, path)
        except Refused as why:
            self._refuse(why)
        except OSError as error:
            self._warn_io("write", path, error)
            if temp is not None:
                _unlink_quietly(Path(temp))

    def clear(self) -> None:
        """Delete every entry (and leftover temporary file); other files in the directory are left alone."""
        if not self.enabled:
            return
        for shard in self.directory.glob("[0-9a-f][0-9a-f]"):
            if shard.is_symlink() or not shard.is_dir():  # never delete through a link out of the cache
                continue
            for entry in shard.iterdir():
                if _is_entry_name(entry.name):
                    _unlink_quietly(entry)
            try:
                shard.rmdir()
            except OSError:  # not empty (foreign files) or removed concurrently: leave it
                pass

    def _refuse(self, why: Refused) -> None:
        if why.remove and why.path is not None:  # an entry kiln cannot trust, in a directory it owns
            _unlink_quietly(why.path)  # so that it is rebuilt
        if self.directory not in _REFUSALS_WARNED:  # once per directory: host.py keeps a DiskCache of its own
            _REFUSALS_WARNED.add(self.directory)
            logger.warning(
                "kiln: the compile cache refused %s because %s; compiling without it. Only files and "
                "directories that you own and that no one else can write to are used.", why.path, why,
            )  # fmt: skip
        else:
            logger.debug("kiln: the compile cache refused %s because %s", why.path, why)

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


def _mac(secret: bytes, fields: bytes, key: bytes, payload: bytes) -> bytes:
    mac = hmac.new(secret, fields, hashlib.sha256)
    mac.update(key)
    mac.update(payload)
    return mac.digest()


def _encode(secret: bytes, key: str, payload: bytes) -> bytes:
    key_bytes = key.encode("utf-8")
    fields = _FIELDS.pack(MAGIC, FORMAT_VERSION, len(key_bytes), len(payload))
    return fields + _mac(secret, fields, key_bytes, payload) + key_bytes + payload


def _decode(secret: bytes, data: bytes, key: str) -> tuple[bytes | None, str | None]:
    """``(payload, None)`` for a valid entry of ``key`` signed with ``secret``, else ``(None, what is wrong)``."""
    if len(data) < HEADER_BYTES:
        return None, f"truncated header ({len(data)} of {HEADER_BYTES} bytes)"
    magic, version, key_length, length = _FIELDS.unpack_from(data)
    if magic != MAGIC:
        return None, f"not a kiln cache entry (magic {magic!r})"
    if version != FORMAT_VERSION:
        return None, f"format version {version}, expected {FORMAT_VERSION}"
    if len(data) != HEADER_BYTES + key_length + length:
        return None, f"{len(data)} bytes, the header says {HEADER_BYTES + key_length + length}"
    stored_key = data[HEADER_BYTES : HEADER_BYTES + key_length]
    if stored_key != key.encode("utf-8"):
        return None, "the entry belongs to another key"
    payload = data[HEADER_BYTES + key_length :]
    mac = data[_FIELDS.size : HEADER_BYTES]
    if not hmac.compare_digest(mac, _mac(secret, data[: _FIELDS.size], stored_key, payload)):
        return None, "its signature does not verify (corrupt, or not written by this user's kiln)"
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
