"""The CPU thread pool that splits a large compiled kernel over several cores.

Every compiled kernel has the ABI ``void kernel(ptr args, i64 begin, i64 end)`` over a range of
*parallel units*; disjoint ranges may run at once. ``parallel_for(kernel, args, extent,
work_bytes)`` cuts ``[0, extent)`` into ``CHUNKS_PER_THREAD`` contiguous chunks per thread (up to
``get_num_threads()`` threads), which the calling thread and persistent worker threads claim as
they come, and returns when all are done. ctypes releases the GIL around a foreign call, so the
chunks really run in parallel.
``set_num_threads(n)`` also limits the BLAS libraries loaded in the process to ``n`` threads
(threadpoolctl), so matmuls and the other libraries of a benchmark use the same count.
Between two matmuls those threads and kiln's share the cores: OpenBLAS's idle threads spin for
``2 ** OPENBLAS_THREAD_TIMEOUT`` cycles after a call, 2^28 (about 0.1 s) by default, which kept
preempting the threads of kiln's kernels (ResNet-18's step: about 400 involuntary context
switches a step, 54 at 2^20, 12 at 2^4). ``import kiln`` sets ``OPENBLAS_THREAD_TIMEOUT=20``
(about 0.4 ms, still enough for back-to-back matmuls) unless the user set it, which OpenBLAS
reads when numpy loads it: only when kiln is imported before numpy. Full benchmark runs, kiln /
fastest PyTorch, default against 20: ResNet-18 0.882, 0.852 -> 0.796, 0.777, 0.792; MLP 0.998,
1.059 -> 0.817, 0.897, 0.761; LeNet-5 0.940, 0.975 -> 0.904, 0.923, 1.016; GPT 0.986 -> 0.961.

>>> import kiln
>>> kiln.get_num_threads() >= 1
True

Compiled kernels and kiln's product kernel (ctypes function pointers, ``parallel_for(..., spin=True)``)
run on the native pool the LLVM code generator installs (``codegen.llvm.pool``: spinning workers take
a chunk in microseconds) where it exists, on Linux; other callables and every kernel elsewhere, on a
pool of Python threads. A step that may run on other threads (a BLAS call, whose threads want the
cores) parks the spinning workers first (``park``; the executor's ``ExternCall.parks``). Waking a
sleeping thread costs tens of microseconds, so small kernels run serially: see
``PARALLEL_MIN_WORK_BYTES``. A kernel called from inside a chunk (nested parallelism) also runs
serially, which keeps the pools free of deadlocks: a worker never waits for another worker.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import math
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "BLAS_MIN_PARALLEL_MACS", "PARALLEL_MIN_WORK_BYTES", "SmallProducts", "get_num_threads", "matmul_macs", "parallel_for", "park",
    "product_work", "blas_product", "run_blas_product", "set_num_threads",
]  # fmt: skip

# Below this many bytes read + written, a kernel runs on the calling thread alone.
# Measured on this project's 2-core x86-64 (AMD EPYC, AVX-512, 2 MiB L2 per core, a Firecracker
# VM) with a streaming float32 kernel out[i] = 2 * in[i] (8 bytes per element, units of 4096
# elements) compiled through kiln.codegen.llvm.engine; median of 50-3000 calls per size, data warm
# in cache as in a compiled function called in a loop. Times in us:
#   work bytes   1 thread   2 threads (fast wake)   2 threads (slow wake)
#      256 KiB      2.0            7.7                    20.1
#        1 MiB      8.6            9.9                    19.8
#     1.25 MiB     12.1           11.7                    28.4
#        2 MiB     21.5           16.8                    29.7
#        4 MiB     45.0           30.5                    44.0
#       16 MiB    180             98                     110
# Dispatching a no-op kernel to one worker costs 7 us per call in most processes and 18 us in
# some (the VM's wake-up latency for the other vCPU; pinning threads does not change it); a plain
# ctypes call costs 0.4 us, the serial path of parallel_for 0.6 us. 4 MiB (about 45 us of
# single-core work) is where two threads never lose and usually win by 1.5x. An OS-level
# alternative (libgomp's GOMP_parallel through an LLVM trampoline) costs 6 us with
# OMP_WAIT_POLICY=passive -- no better -- and 0.8 us with its default spin-wait, which moves the
# break-even down to about 512 KiB but keeps the other core spinning after every region.
PARALLEL_MIN_WORK_BYTES = 4 << 20
# With the native pool (``codegen.llvm.pool``) a spinning worker takes a chunk in 1-4 us: the same
# kernel, same machine, in us, 1 thread / 2 threads: 256 KiB 3.4 / 4.0, 512 KiB 5.6 / 5.5, 1 MiB
# 13.7 / 9.4, 2 MiB 25.6 / 18.6, 4 MiB 54.6 / 33.9, 16 MiB 238 / 106. A sleeping worker is woken
# only for WAKE_MIN_WORK_BYTES or more (the table above's break-even for a wake-up); smaller
# kernels run on the caller until a large one wakes the workers.
NATIVE_MIN_WORK_BYTES = 1 << 20
WAKE_MIN_WORK_BYTES = 4 << 20
# Both pools' threads claim chunks of a kernel as they come: this many per thread, so that a thread
# the OS runs late (the other vCPU taken by the hypervisor) leaves most of its share to the others.
CHUNKS_PER_THREAD = 4

Kernel = Callable[[object, int, int], object]

logger = logging.getLogger("kiln")


def _default_num_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux: no affinity mask
        return max(1, os.cpu_count() or 1)


_num_threads = _default_num_threads()
_local = threading.local()  # .busy: this thread is running a chunk (worker, or caller inside parallel_for)


def set_num_threads(n: int) -> None:
    """Use up to ``n`` threads (the caller included) for a large kernel, like ``torch.set_num_threads``;
    the BLAS libraries loaded in the process are limited to ``n`` threads as well."""
    global _num_threads
    # RuntimeError with PyTorch's wording, as torch.set_num_threads raises.
    if isinstance(n, bool) or not isinstance(n, int):
        raise RuntimeError(f"set_num_threads expects an int, but got {type(n).__name__}")
    if n < 1:
        raise RuntimeError(f"set_num_threads expects a positive integer, but got {n}")
    _num_threads = n
    _limit_blas_threads(n)


def _limit_blas_threads(n: int) -> None:
    """Give every BLAS library loaded in the process (numpy's, and PyTorch's once imported) ``n``
    threads too, so a benchmark's libraries all run on the same count; a BLAS loaded later keeps
    its own default until the next call. kiln's matmuls call numpy's BLAS, so this is also what
    ``n`` means for them."""
    # lazily: threadpoolctl scans the loaded shared libraries, which `import kiln` need not pay for
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    threadpool_limits(limits=n, user_api="blas")  # not a `with`: the limit stays until changed


def get_num_threads() -> int:
    """The number of threads a large kernel is split over (default: the CPUs this process may use)."""
    return _num_threads


class _Pool:
    """Persistent daemon workers pulling chunks from one shared queue.

    One queue shared by all workers keeps concurrent callers independent: each call enqueues its
    own chunks with its own locks, and any idle worker takes the next chunk, whoever it
    belongs to. Workers are started on demand and never stopped (they sleep in ``get``).
    """

    def __init__(self) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.workers: list[threading.Thread] = []
        self.lock = threading.Lock()

    def ensure(self, count: int) -> None:
        with self.lock:
            while len(self.workers) < count:
                worker = threading.Thread(
                    target=_work, args=(self.tasks,), name=f"kiln-worker-{len(self.workers)}", daemon=True
                )
                worker.start()
                self.workers.append(worker)


def mark_worker() -> None:
    """This thread is a pool worker: a kernel it runs never splits again (nested calls run serially)."""
    _local.busy = True


class _Task:
    """One ``parallel_for`` call on the Python pool: its chunks, which the caller and the workers the
    call enqueued it for claim as they come (``next`` on an ``itertools.count`` is one step under
    the GIL). The caller waits on ``done``, released by whichever thread completes the last chunk,
    not on each worker: a worker that takes the task from the queue late finds no chunk left and
    touches nothing of the call's."""

    __slots__ = ("kernel", "args", "extent", "chunks", "claims", "completions", "done", "errors")

    def __init__(self, kernel: Kernel, args: object, extent: int, chunks: int) -> None:
        self.kernel, self.args, self.extent, self.chunks = kernel, args, extent, chunks
        self.claims = itertools.count()
        self.completions = itertools.count(1)
        self.done = threading.Lock()
        self.done.acquire()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        kernel, args, extent, chunks = self.kernel, self.args, self.extent, self.chunks
        for chunk in self.claims:
            if chunk >= chunks:
                return
            try:
                kernel(args, extent * chunk // chunks, extent * (chunk + 1) // chunks)
            except BaseException as error:  # noqa: BLE001 - the caller re-raises it once every chunk is done
                self.errors.append(error)
            if next(self.completions) == chunks:
                self.done.release()


def _work(tasks: queue.SimpleQueue) -> None:
    mark_worker()
    get = tasks.get
    while True:
        get().run()


_pool = _Pool()


# A native pool (``codegen.llvm.pool``: microsecond dispatch while its workers spin) for compiled
# kernels, installed by the code generator -- this layer does not import it -- and built on first use
# or before it (``prepare_native_pool``).
_native_factory: Callable[[], Any] | None = None
_FUNCTION_POINTER = ctypes._CFuncPtr  # type: ignore[attr-defined]  # what CFUNCTYPE(...)(address) makes
_native: Any = None
_native_building = threading.Lock()  # held while the native pool is built


def install_native_pool(factory: Callable[[], Any]) -> None:
    """Let ``parallel_for(..., spin=True)`` run ctypes kernels on the pool ``factory()`` builds
    (once, when first needed)."""
    global _native_factory
    _native_factory = factory


def min_work_bytes(spin: bool) -> int:
    """The work from which ``parallel_for(..., spin=spin)`` splits a kernel."""
    native = _native is not None or _native_factory is not None
    return NATIVE_MIN_WORK_BYTES if spin and native else PARALLEL_MIN_WORK_BYTES


def product_work(macs: int) -> int:
    """The ``work_bytes`` to give ``parallel_for(..., spin=True)`` for a matrix product of ``macs``
    multiply-adds (kiln's product kernel, ``codegen/llvm/product_call.py``): one byte per multiply-add
    where the native pool splits it, a quarter where the Python pool would. On this project's 2-core
    VM, quiet, float32, us serial / native pool with its workers spinning / woken from sleep / Python
    pool: 512x128 @ 128x128 (8.4M) 161 / 78 / 98 / 136; 512x128 @ 128x512 (34M) 588 / 324 / 315 /
    416; 16x128 @ 128x512 (1M) 18.7 / 12.8 / 23.7 / 33. So the native pool splits a spinning
    product from 1M multiply-adds (``NATIVE_MIN_WORK_BYTES``) and wakes its workers from 4M
    (``WAKE_MIN_WORK_BYTES``); the Python pool, whose hand-offs cost tens of microseconds more, from 16M."""
    native = _native is not None or _native_factory is not None
    return macs if native else macs // 4


def _native_pool() -> Any:
    global _native, _native_factory
    if _native is None and _native_factory is not None:
        with _native_building:  # a build under way on another thread (``prepare_native_pool``) is waited for
            if _native is None and _native_factory is not None:
                try:
                    _native = _native_factory()
                except Exception as error:  # noqa: BLE001 - any failure to build it: the Python pool still works
                    logger.warning("kiln: the native thread pool could not be built (%s); using Python threads", error)
                finally:
                    _native_factory = None  # one attempt: a failure leaves the Python pool
    return _native


def native_pool_unbuilt() -> bool:
    """Whether a native pool is installed but not built yet (``prepare_native_pool`` would build it)."""
    return _native is None and _native_factory is not None


def prepare_native_pool() -> None:
    """Build the installed native pool now if it is not built (its code compiled or read from the disk
    cache, and loaded; no worker starts): where kiln's product kernels, which run on it, are built, and
    while LLVM compiles a program (``codegen.llvm.backend``). Otherwise the first split kernel built it --
    in a cold process, the second call of a compiled DCGAN or CNN step, whose products are the first to split."""
    _native_pool()


class _State:
    spinning = False  # the native pool's workers may be spinning (a task ran since the last park)


_state = _State()


def park() -> None:
    """Send the native pool's spinning workers to sleep now: the caller is about to run something
    else on the cores (a BLAS call, an eager kernel). Cheap when they are not spinning."""
    if _state.spinning:
        _state.spinning = False
        if _native is not None:
            _native.park()


def _reset_after_fork() -> None:
    # The child process inherits the pools' bookkeeping but none of their threads.
    global _pool, _native_building
    _pool = _Pool()
    _native_building = threading.Lock()
    if _native is not None:
        _native.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def parallel_for(kernel: Kernel, args: object, extent: int, work_bytes: int, spin: bool = False) -> None:
    """Run ``kernel(args, begin, end)`` over ``[0, extent)``, split across threads when worth it.

    ``kernel`` is a ctypes function ``CFUNCTYPE(None, c_void_p, c_int64, c_int64)`` (any callable
    with that signature works); ``work_bytes`` is the bytes it reads and writes over the whole
    extent. Re-raises the first exception a chunk raised, after every chunk has finished (the
    kernel's buffers must outlive every chunk). ``spin``: the caller runs nothing but kernels
    around this one (no BLAS, whose threads want the same cores), so a ctypes kernel may go to the
    native pool, whose workers spin between tasks.
    """
    threads = min(_num_threads, extent)
    nested = getattr(_local, "busy", False)
    native = None
    if spin and threads >= 2 and not nested and isinstance(kernel, _FUNCTION_POINTER):
        native = _native_pool()
        if native is not None and not native.lock.acquire(blocking=False):  # another caller's task
            native = None
    if threads < 2 or nested or work_bytes < (PARALLEL_MIN_WORK_BYTES if native is None else NATIVE_MIN_WORK_BYTES):
        if native is not None:
            native.lock.release()
        if extent > 0:
            kernel(args, 0, extent)
        return
    chunks = min(extent, threads * CHUNKS_PER_THREAD)
    if native is not None:
        _local.busy = True
        try:
            native.ensure(threads - 1)
            entry = ctypes.cast(kernel, ctypes.c_void_p)  # type: ignore[arg-type]
            native.run(entry, args, extent, chunks, threads, work_bytes >= WAKE_MIN_WORK_BYTES)
            _state.spinning = True
        finally:
            _local.busy = False
            native.lock.release()
        return
    pool = _pool
    if len(pool.workers) < threads - 1:
        pool.ensure(threads - 1)
    task = _Task(kernel, args, extent, chunks)
    for _ in range(threads - 1):
        pool.tasks.put(task)
    _local.busy = True
    try:
        task.run()
    finally:
        _local.busy = False
    task.done.acquire()  # the workers write into the caller's buffers: wait for them even on error
    if task.errors:
        raise task.errors[0]


# ----------------------------------------------------------------------------- BLAS threads per product
# A matrix product of fewer multiply-adds (per BLAS call) than this runs on one BLAS thread, eager or
# compiled, as PyTorch's grain sizes keep small work on one thread. numpy's OpenBLAS splits every
# product over 256K multiply-adds over all its threads. On this project's 2-core VM (shared, so
# the gains vary), min of medians in us, 1 thread / 2 threads:
#   16x128 @ 128x512    1M MACs   23.7 / 20.0-22.0   (1.08-1.18x)
#   128x128 @ 128x128   2M        33   / 21-40       (0.8-1.6x)
#   64x256 @ 256x256    4M        69   / 37-52       (1.3-1.9x)
#   32x256 @ 256x1024   8M        153  / 85-107      (1.4-1.8x)
#   64x512 @ 512x512    16M       270  / 145-165     (1.6-1.9x)
# A second thread gains a few microseconds below 4M and costs a scheduler time slice whenever another
# process holds the other core: 16x128 @ 128x512 with other processes busy took 0.4-15 ms a call on
# average on 2 threads (median 14-22 us: most calls are fine, a few wait 30-300 ms for the second
# thread; PyTorch's MKL on 2 threads 1-15 ms), 0.09-0.29 ms on one (median 24 us, p99 41-70 us).
# Reading and setting OpenBLAS's thread count around a small product costs 0.4 us (ctypes): under
# 2% of the 24 us product.
BLAS_MIN_PARALLEL_MACS = 4 << 20


#: numpy's OpenBLAS runs a matrix product (gemm) of at most this many multiply-adds on one thread by
#: itself (interface/gemm.c: SMP_THRESHOLD_MIN 65536 x GEMM_MULTITHREAD_THRESHOLD 4), and a
#: matrix-vector product (gemv: a product with one row or one column) over a matrix of fewer than
#: ``BLAS_SERIAL_GEMV`` elements (2304 x 4): around those, reading and setting its thread count only
#: costs time. 16x51 @ 51x204 on 2 threads, medians: 4.04 us as it is, 4.88 us set to one thread.
BLAS_SERIAL_GEMM = 1 << 18
BLAS_SERIAL_GEMV = 9216


def blas_splits(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """Whether numpy's OpenBLAS may split one BLAS call of the matmul primitive on operands of these
    shapes over its threads (``run_blas_product`` then has a thread count to choose; else the product
    runs on one thread anyway)."""
    macs = matmul_macs(a_shape, b_shape)
    vector = (a_shape[-2] if len(a_shape) > 1 else 1) == 1 or b_shape[-1] == 1
    return macs >= BLAS_SERIAL_GEMV if vector else macs > BLAS_SERIAL_GEMM


def matmul_macs(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
    """The multiply-adds of one BLAS call of the matmul primitive on operands of these shapes (the
    batch of a stack times a matrix is one product there, other batches one product per matrix)."""
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    rows = m if len(b_shape) > 2 else math.prod(a_shape[:-1])
    return rows * k * n


class _Blas:
    """numpy's OpenBLAS thread-count functions (ctypes), found on first use; None where numpy's BLAS
    is not an OpenBLAS that threadpoolctl finds (products then keep the BLAS's own choice)."""

    found = False
    get_threads: Callable[[], int] | None = None
    set_threads: Callable[[int], None] | None = None
    library: ctypes.CDLL | None = None


_blas = _Blas()


def _find_blas() -> None:
    _blas.found = True
    import numpy  # noqa: PLC0415 - this layer imports numpy only when it needs its BLAS
    from threadpoolctl import ThreadpoolController  # noqa: PLC0415 - scans the loaded libraries (~3 ms)

    libraries = [c.filepath for c in ThreadpoolController().select(internal_api="openblas").lib_controllers]
    home = os.path.dirname(numpy.__file__)  # numpy's own copy lives in numpy/ or numpy.libs/ (wheels)
    ours = [path for path in libraries if path.startswith(home)] or libraries[:1]
    if not ours:
        return
    try:
        library = ctypes.CDLL(ours[0])  # already loaded by numpy: this only finds it
    except OSError as error:
        logger.debug("kiln: numpy's OpenBLAS could not be opened (%s); products keep its thread count", error)
        return
    for prefix, suffix in itertools.product(("", "scipy_"), ("", "64_", "_64")):
        get = getattr(library, f"{prefix}openblas_get_num_threads{suffix}", None)
        set_ = getattr(library, f"{prefix}openblas_set_num_threads{suffix}", None)
        if get is not None and set_ is not None:
            get.restype, get.argtypes = ctypes.c_int, []
            set_.restype, set_.argtypes = None, [ctypes.c_int]
            _blas.get_threads, _blas.set_threads = get, set_
            _blas.library = library
            return


class SmallProducts:
    """``with SmallProducts(macs): ...``: ``run_blas_product``'s rule for a block of code whose BLAS
    products (a recurrence's per-step ones) have ``macs`` multiply-adds each."""

    __slots__ = ("macs", "restore")

    def __init__(self, macs: int) -> None:
        self.macs, self.restore = macs, 0

    def __enter__(self) -> SmallProducts:
        if self.macs < BLAS_MIN_PARALLEL_MACS:
            if not _blas.found:
                _find_blas()
            get, set_ = _blas.get_threads, _blas.set_threads
            threads = get() if get is not None else 1
            if threads >= 2 and set_ is not None:
                set_(1)
                self.restore = threads
        return self

    def __exit__(self, *exc: object) -> None:
        if self.restore and _blas.set_threads is not None:
            _blas.set_threads(self.restore)
        self.restore = 0


def blas_product(kernel: Callable[..., Any], a_shape: tuple[int, ...], b_shape: tuple[int, ...], *args: Any) -> Any:
    """``kernel(*args)``, a matmul of operands of these shapes, under ``run_blas_product``'s rule -- or
    called as it is where OpenBLAS keeps it on one thread by itself (``blas_splits``): reading and
    setting the thread count around such a product only costs time (0.8 us of a 4 us product)."""
    if not blas_splits(a_shape, b_shape):
        return kernel(*args)
    return run_blas_product(kernel, matmul_macs(a_shape, b_shape), *args)


def run_blas_product(kernel: Callable[..., Any], macs: int, *args: Any, **kwargs: Any) -> Any:
    """``kernel(*args, **kwargs)``, a BLAS matrix product of ``macs`` multiply-adds per BLAS call, on
    one BLAS thread when it is too small to gain from more (``BLAS_MIN_PARALLEL_MACS``); OpenBLAS's
    thread count is restored after. (The count is the process's: a product another Python thread
    runs meanwhile gets one thread too, which costs it time, never a wrong result.)"""
    if macs >= BLAS_MIN_PARALLEL_MACS:
        return kernel(*args, **kwargs)
    if not _blas.found:
        _find_blas()
    get, set_ = _blas.get_threads, _blas.set_threads
    threads = get() if get is not None else 1
    if threads < 2 or set_ is None:
        return kernel(*args, **kwargs)
    set_(1)
    try:
        return kernel(*args, **kwargs)
    finally:
        set_(threads)
