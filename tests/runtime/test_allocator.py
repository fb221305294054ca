"""The caching host allocator: reuse of freed blocks, never of live ones (views included, from
several threads), size classes, the cap on cached bytes, stats and empty_cache, and the arrays
it returns (writable, aligned, the right dtype and shape, size 0)."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest

from kiln.ir.dtypes import float32 as kiln_float32
from kiln.runtime import allocator as allocator_module
from kiln.runtime.allocator import ALIGNMENT, CachingAllocator, size_class


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_a_freed_block_is_reused_for_the_next_request_of_its_class():
    alloc = CachingAllocator()
    a = alloc.empty((1000,), np.float32)
    first = address(a)
    del a
    b = alloc.empty((1001,), np.float32)  # 4004 bytes: the same class as 4000
    assert size_class(4000) == size_class(4004)
    assert address(b) == first
    assert (alloc.stats().hits, alloc.stats().misses) == (1, 1)
    c = alloc.empty((3000,), np.float32)  # another class: fresh memory
    assert address(c) != first and alloc.stats().misses == 2


def test_a_live_array_is_never_handed_out_twice_and_views_keep_its_block():
    alloc = CachingAllocator()
    a = alloc.empty((64, 64), np.float64)
    a_address = address(a)
    view = a.T[1:, ::2]
    del a
    gc.collect()
    b = alloc.empty((64, 64), np.float64)  # a's block is still in use by the view
    assert address(b) != a_address
    view[...] = 1.0  # the view's memory is intact and its own
    b[...] = 2.0
    assert (view == 1.0).all()
    del view
    c = alloc.empty((64, 64), np.float64)
    assert address(c) == a_address  # the last view went: the block came back


def test_a_block_is_kept_by_any_derived_array_or_buffer():
    alloc = CachingAllocator()
    a = alloc.empty((256,), np.uint8)
    a_address = address(a)
    derived = [a.reshape(16, 16)[::2], a.view(np.int32), memoryview(a), np.frombuffer(a, np.uint8)]
    del a
    while derived:  # each one alone keeps the block
        assert address(alloc.empty((256,), np.uint8)) != a_address
        derived.pop(0)
    assert address(alloc.empty((256,), np.uint8)) == a_address


def test_concurrent_threads_never_get_the_same_live_block():
    alloc = CachingAllocator()
    errors: list[str] = []
    live: dict[int, int] = {}  # address -> thread holding it
    guard = threading.Lock()

    def work(me: int) -> None:
        rng = np.random.default_rng(me)
        held = []
        for _ in range(400):
            if held and rng.random() < 0.5:
                array = held.pop(int(rng.integers(len(held))))
                with guard:
                    del live[address(array)]
                del array  # frees the block, perhaps while another thread allocates
            else:
                array = alloc.empty((int(rng.choice([100, 120, 1000])),), np.float32)
                array[...] = me  # touch it: a shared block would be overwritten below
                with guard:
                    if address(array) in live:
                        errors.append(f"thread {me} got block {address(array):#x} held by {live[address(array)]}")
                    live[address(array)] = me
                held.append(array)
            for array in held:
                if not (array == me).all():
                    errors.append(f"thread {me}: an array it holds was overwritten")
        for array in held:
            with guard:
                del live[address(array)]
        held.clear()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: inside the allocator too
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    stats = alloc.stats()
    assert stats.bytes_in_use == 0 and stats.hits > 0


def test_blocks_freed_on_another_thread_come_back():
    alloc = CachingAllocator()
    a = alloc.empty((5000,), np.float64)
    a_address = address(a)
    box = [a]
    del a
    t = threading.Thread(target=box.clear)  # the last reference dies on that thread
    t.start()
    t.join()
    assert address(alloc.empty((5000,), np.float64)) == a_address


def test_the_cap_on_cached_bytes_is_respected_and_the_least_recent_blocks_go_first():
    block = size_class(100_000)
    alloc = CachingAllocator(max_cached_bytes=2 * block)
    arrays = [alloc.empty((100_000,), np.uint8) for _ in range(3)]
    addresses = [address(a) for a in arrays]
    assert alloc.stats().bytes_in_use == 3 * block
    for i in range(3):
        arrays[i] = None  # freed in order: the first freed is evicted when the third comes back
        assert alloc.stats().bytes_cached <= 2 * block
    stats = alloc.stats()
    assert (stats.bytes_cached, stats.blocks_cached, stats.bytes_in_use) == (2 * block, 2, 0)
    assert address(alloc.empty((100_000,), np.uint8)) == addresses[2]  # the most recently freed
    big = alloc.empty((3 * block,), np.uint8)  # bigger than the cap: never cached
    del big
    assert alloc.stats().bytes_cached <= 2 * block
    alloc.max_cached_bytes = 0  # lowering the cap frees what is cached
    assert (alloc.stats().bytes_cached, alloc.stats().blocks_cached) == (0, 0)


def test_stats_and_empty_cache():
    alloc = CachingAllocator()
    a, b = alloc.empty((10, 10), np.float32), alloc.empty(1000, np.int64)
    stats = alloc.stats()
    assert (stats.hits, stats.misses, stats.bytes_cached) == (0, 2, 0)
    assert stats.bytes_in_use == size_class(400) + size_class(8000)
    del a, b
    stats = alloc.stats()
    assert (stats.bytes_in_use, stats.bytes_cached, stats.blocks_cached) == (0, size_class(400) + size_class(8000), 2)
    alloc.empty_cache()
    assert (alloc.stats().bytes_cached, alloc.stats().blocks_cached) == (0, 0)
    alloc.empty((10, 10), np.float32)
    assert alloc.stats().misses == 3  # the cache was really emptied


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64, np.bool_, np.float16, np.uint16])
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5, 2), (4096, 3)])
def test_arrays_are_writable_aligned_c_contiguous_with_the_right_type(dtype, shape):
    alloc = CachingAllocator()
    a = alloc.empty(shape, dtype)
    assert a.shape == shape and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    assert address(a) % ALIGNMENT == 0
    a[...] = 1
    assert (a == 1).all()


def test_size_zero_and_other_spellings():
    alloc = CachingAllocator()
    for shape in [(0,), (3, 0), (0, 5, 2)]:
        a = alloc.empty(shape, np.float32)
        assert a.shape == shape and a.dtype == np.float32 and a.size == 0
    assert alloc.stats().misses == 0  # size 0 takes no block
    assert alloc.empty(5, kiln_float32).dtype == np.float32  # an int shape; a kiln dtype
    with pytest.raises(ValueError, match=r"negative dimensions.*\(2, -1\)"):
        alloc.empty((2, -1), np.float32)
    record = np.dtype([("a", np.float32), ("b", np.int64)])
    r = alloc.empty((3,), record)
    assert r.dtype == record and r.shape == (3,)


def test_size_classes_share_near_sizes_and_waste_at_most_an_eighth():
    sizes = [1, 512, 513, 4097, 10**6, 64 << 20, (64 << 20) + 1]
    for n in sizes:
        c = size_class(n)
        assert n <= c and c % 64 == 0 and (c - n) <= max(512, n // 8)
    assert size_class(1000) == size_class(1020)


def test_the_default_allocator():
    a = allocator_module.empty((1024, 1024), np.float32)  # 4 MiB: cached; small requests are numpy's
    assert a.shape == (1024, 1024) and address(a) % ALIGNMENT == 0
    small = allocator_module.empty((8, 8), np.float32)
    assert small.shape == (8, 8) and small.flags.c_contiguous and small.flags.writeable
    assert isinstance(allocator_module.HOST, CachingAllocator)
    assert allocator_module.HOST.max_cached_bytes == allocator_module.DEFAULT_MAX_CACHED_BYTES


def test_arrays_alive_at_interpreter_shutdown_are_released_quietly():
    import subprocess

    code = (
        "import threading, numpy as np\n"
        "from kiln.runtime.allocator import HOST, CachingAllocator\n"
        "kept = [HOST.empty((1000,), np.float32) for _ in range(3)]\n"
        "other = CachingAllocator(); cycle = [other.empty((10,), np.int8)]; cycle.append(cycle)\n"
        "t = threading.Thread(target=lambda: kept.append(HOST.empty(5, np.float64)), daemon=True); t.start()\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "ok", "")
