"""kiln's own loader of relocatable ELF objects (``kiln.runtime.elf``) against llvmlite's MCJIT.

Objects come from LLVM (``engine.compile_ir``), so they hold what kiln's kernels can hold: constant
pools (PC-relative), calls between functions (PLT32), a call into the C library (``memset``, which
LLVM makes of a zeroing loop), a global reached through the GOT, and a pointer in writable data
(64-bit absolute). Each runs the same under both loaders. Objects the loader cannot take --
another machine, an unknown relocation, a symbol the process lacks -- raise ``Unsupported``, and
the backend then loads through LLVM with the same results.
"""

from __future__ import annotations

import ctypes
import gc
import struct

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import backend as llvm_backend
from kiln.codegen.llvm import engine, host
from kiln.runtime import elf

from ..codegen.llvm.test_mathlib import F32, kernel_ir
from ..conftest import assert_close

pytestmark = pytest.mark.skipif(not elf.supported(), reason="kiln loads ELF objects itself on x86-64 Linux only")

MIXED = """
@table = global [4 x float] [float 1.0, float 2.0, float 3.0, float 4.0]
@pointer = global ptr @table

define void @zero(ptr %p, i64 %n) {
entry:
  %any = icmp sgt i64 %n, 0
  br i1 %any, label %loop, label %done
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %at = getelementptr inbounds float, ptr %p, i64 %i
  store float 0.0, ptr %at
  %next = add nuw nsw i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done
done:
  ret void
}

define float @get(i64 %i) noinline {
  %t = load ptr, ptr @pointer
  %at = getelementptr inbounds float, ptr %t, i64 %i
  %v = load float, ptr %at
  ret float %v
}

define float @twice(i64 %i) {
  %v = call float @get(i64 %i)
  %w = fadd float %v, %v
  ret float %w
}
"""

CALLS_MISSING = """
declare void @kiln_no_such_function(ptr)
define void @f(ptr %p) {
  call void @kiln_no_such_function(ptr %p)
  ret void
}
"""


def _object(text: str) -> bytes:
    return engine.compile_ir(f'target triple = "{engine.triple()}"\n{text}')


def _relocation_types(obj: bytes) -> set[int]:
    """The relocation types of an object (parsed here independently of the loader)."""
    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    types = set()
    for i in range(shnum):
        _, kind, _, _, offset, size, _, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize)
        if kind == 4:  # SHT_RELA
            types |= {
                struct.unpack_from("<Q", obj, offset + j * entsize + 8)[0] & 0xFFFFFFFF for j in range(size // entsize)
            }
    return types


@pytest.mark.parametrize("name", ["tanh", "exp", "pow", "erf", "sin"])
def test_a_math_kernel_runs_the_same_as_under_mcjit(name):
    from kiln.codegen import mathlib

    arity, _ = mathlib.ROUTINES[name]
    obj = engine.compile_ir(kernel_ir(name, F32))
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(1003).astype(np.float32) * 4 for _ in range(arity)]
    outputs = []
    for library in (elf.LoadedObjects([obj]), engine.Library([obj])):
        kernel = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (arity + 1), ctypes.c_int64)(library.address("kernel"))
        out = np.full(1003, np.nan, np.float32)
        kernel(*[a.ctypes.data for a in inputs], out.ctypes.data, out.size)
        outputs.append(out)
    np.testing.assert_array_equal(outputs[0], outputs[1])  # the same machine code: the same bits


def test_calls_a_c_library_function_a_got_global_and_writable_data():
    obj = _object(MIXED)
    assert {1, 4, 41, 42} & _relocation_types(obj) >= {1, 4}  # 64-bit absolute and PLT32 at least
    library = elf.LoadedObjects([obj])
    zero = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(library.address("zero"))
    data = np.ones(1000, np.float32)
    zero(data.ctypes.data, 999)
    assert data[:999].tolist() == [0.0] * 999 and data[999] == 1.0
    twice = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(library.address("twice"))
    assert [twice(i) for i in range(4)] == [2.0, 4.0, 6.0, 8.0]


def test_an_unknown_name_is_a_key_error():
    library = elf.LoadedObjects([_object(MIXED)])
    with pytest.raises(KeyError, match="no function 'nope'"):
        library.address("nope")
    with pytest.raises(KeyError):
        library.address("zer")


def test_the_pages_are_unmapped_with_the_library():
    library = elf.LoadedObjects([_object(MIXED)])
    finalizer = library._finalizer
    assert finalizer.alive
    del library
    gc.collect()
    assert not finalizer.alive


def test_the_pages_are_unmapped_after_the_module_globals_are_gone(monkeypatch):
    # At interpreter exit a module's globals become None before the last objects are collected: a
    # finalizer that looked up the C library through them raised (printed as 'Exception ignored').
    library = elf.LoadedObjects([_object(MIXED)])
    monkeypatch.setattr(elf, "_libc", None)
    library._finalizer()
    assert not library._finalizer.alive


def _patched(obj: bytes, at: int, fmt: str, value: int) -> bytes:
    data = bytearray(obj)
    struct.pack_into(fmt, data, at, value)
    return bytes(data)


def _first_relocation_info(obj: bytes) -> int:
    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    for i in range(shnum):
        _, kind, _, _, offset, _, _, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize)
        if kind == 4:
            return offset + 8  # r_info of the first entry
    raise AssertionError("no relocations")


@pytest.mark.parametrize(
    "damage",
    [
        lambda obj: b"\0" * 64,  # not ELF
        lambda obj: _patched(obj, 0x12, "<H", 183),  # another machine: AArch64
        lambda obj: _patched(obj, 5, "<B", 2),  # big-endian
        lambda obj: _patched(obj, _first_relocation_info(obj), "<I", 37),  # R_X86_64_TPOFF64 (thread-local)
        lambda obj: obj[: len(obj) // 2],  # truncated: section headers past the end
    ],
    ids=["not-elf", "aarch64", "big-endian", "tls-relocation", "truncated"],
)
def test_what_the_loader_does_not_take_is_refused(damage):
    with pytest.raises(elf.Unsupported):
        elf.LoadedObjects([damage(_object(MIXED))])


def test_a_section_running_past_the_end_is_refused():
    obj = bytearray(_object(MIXED))
    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    for i in range(shnum):  # the .text section's size made larger than the file
        at = shoff + i * shentsize
        _, kind, flags = struct.unpack_from("<IIQ", obj, at)
        if kind == 1 and flags & 0x4:
            struct.pack_into("<Q", obj, at + 0x20, len(obj))
    with pytest.raises(elf.Unsupported, match="past the end"):
        elf.LoadedObjects([bytes(obj)])


def test_a_symbol_the_process_lacks_is_refused():
    with pytest.raises(elf.Unsupported, match="kiln_no_such_function"):
        elf.LoadedObjects([_object(CALLS_MISSING)])


def test_the_backend_loads_through_llvm_when_the_loader_refuses(monkeypatch, caplog):
    def refuse(objects):
        raise elf.Unsupported("refused for the test")

    x = kiln.tensor(np.linspace(-3, 3, 37, dtype=np.float32))
    expected = (x.tanh() * x).numpy()
    monkeypatch.setattr(elf, "LoadedObjects", refuse)  # a compile or a cache hit: both load here
    with caplog.at_level("DEBUG", logger="kiln"):
        out = kiln.compile(lambda t: t.tanh() * t)(x)
    assert_close(out.numpy(), expected, rtol=0, atol=0)
    assert "through LLVM: refused for the test" in caplog.text
    assert isinstance(llvm_backend.load_objects([_object(MIXED)]), engine.Library)


def test_the_host_signature_is_remembered_per_host(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    host.signature.cache_clear()
    try:
        assert host.signature() == engine.host_signature()  # asked LLVM, stored it
        host.signature.cache_clear()

        def no_llvm():
            raise AssertionError("LLVM was asked again")

        monkeypatch.setattr(host, "_from_llvm", no_llvm)
        assert host.signature() == engine.host_signature()  # read back
        host.signature.cache_clear()
        monkeypatch.setattr(host, "cpu_fingerprint", lambda: "another CPU")
        with pytest.raises(AssertionError, match="asked again"):
            host.signature()  # another host's signature is not this one's
    finally:
        host.signature.cache_clear()


def test_the_cpu_fingerprint_leaves_out_what_changes_between_reads():
    fingerprint = host.cpu_fingerprint()
    if fingerprint is None:
        pytest.skip("no /proc/cpuinfo")
    assert "MHz" not in fingerprint and "bogomips" not in fingerprint.lower()
    assert fingerprint == host.cpu_fingerprint()
