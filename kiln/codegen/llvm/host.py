"""The host signature (what decides the machine code besides the IR), remembered so that a cache
hit needs no LLVM.

``engine.host_signature()`` asks LLVM for its version, the triple, the CPU's name and features:
that loads the 180 MB ``libllvmlite`` (25 to 50 ms of a fresh process), although a program found
in the disk cache needs nothing else of LLVM (``kiln.runtime.elf`` loads its code). What LLVM's
answer depends on is known without it: llvmlite's version, the platform, and the CPU as the
kernel describes it in ``/proc/cpuinfo`` (vendor, family, model, stepping and feature flags). The
signature is stored in the disk cache under a key of those, and read back by the next process on
the same host. Where any of them is unknown (no ``/proc/cpuinfo``), or the cache is off, LLVM is
asked every time.
"""

from __future__ import annotations

import functools
import os
import sys

import llvmlite  # the package alone: its version, not the LLVM library

from ...runtime.cache import DiskCache, cache_key

# cpuinfo fields that change from one read or one core to the next, not with the CPU
_VOLATILE = frozenset({"processor", "cpu MHz", "bogomips", "BogoMIPS", "core id", "apicid", "initial apicid",
                       "physical id", "siblings", "cpu cores"})  # fmt: skip


@functools.cache
def signature() -> str:
    key = memo_key()
    cache = DiskCache() if key is not None else None
    if key is None or cache is None or not cache.enabled:
        return _from_llvm()
    stored = cache.get(key)
    if stored is not None:
        return stored.decode("utf-8")
    text = _from_llvm()
    cache.put(key, text.encode("utf-8"))
    return text


def memo_key() -> str | None:
    """The disk-cache key the signature is remembered under on this host; None where it is not."""
    fingerprint = cpu_fingerprint()
    if fingerprint is None:
        return None
    return cache_key("kiln llvm host signature", llvmlite.__version__, sys.platform, os.uname().machine, fingerprint)


def cpu_fingerprint() -> str | None:
    """The first processor's ``/proc/cpuinfo`` entry without its volatile fields; None without one."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
            first = file.read().split("\n\n", 1)[0]
    except OSError:
        return None
    fields = []
    for line in first.splitlines():
        name, colon, value = line.partition(":")
        if colon and name.strip() not in _VOLATILE:
            fields.append(f"{name.strip()}: {value.strip()}")
    return "\n".join(fields) if fields else None


def _from_llvm() -> str:
    from . import engine  # noqa: PLC0415 - loads LLVM

    return engine.host_signature()


#: Rows of ``A`` a register tile of kiln's matrix product takes where the host has AVX-512 (``tile_rows``).
ROWS = 8


@functools.cache
def tile_rows() -> int:
    """``ROWS`` on a host with AVX-512 (32 vector registers); 2 elsewhere, where a tile's vectors are
    pairs of AVX2 registers and 16 of those must hold its accumulators and ``B``'s vectors. Here, from
    the remembered signature: a product kernel loaded from the cache (``product_call``) needs no LLVM."""
    return ROWS if "+avx512f" in signature() else 2
