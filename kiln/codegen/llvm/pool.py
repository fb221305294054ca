"""A native thread pool for compiled kernels: dispatch in a few microseconds while the workers spin.

``runtime.threads`` splits a large kernel over threads. Its Python pool wakes a sleeping worker
through a lock, which costs 7-18 us on this project's 2-vCPU VM in good hours and 60-75 us in bad
ones (the VM's latency for waking an idle vCPU): more than a 1 MiB kernel takes. Here the workers
are native loops (LLVM IR, compiled once per process) that watch a generation counter:

- ``kiln_pool_run(fn, args, extent, chunks, threads, wake)`` publishes the task, bumps the generation, and
  claims and runs chunks of it like any worker, then spins until every chunk has completed -- or,
  when a worker sleeps and ``wake`` is 0, runs the whole extent itself: a kernel between
  ``runtime.threads``' ``NATIVE_MIN_WORK_BYTES`` and ``WAKE_MIN_WORK_BYTES`` is worth splitting over
  spinning workers (1.5x at 1 MiB) but not worth a wake-up (tens of us);
- chunks are claimed, not assigned: a worker the OS has not scheduled (the other vCPU taken by the
  hypervisor) leaves its share to the threads that run, where a static split made the caller wait
  for it. A ticket (the task's generation and its unclaimed chunks in one 64-bit word, taken by
  compare-and-swap) keeps a worker that saw a task late from taking chunks of the next one;
- a worker that sees a new generation claims chunks until none is left. After ``SPIN_NS`` of
  spinning without work (the clock, ``clock_gettime(CLOCK_MONOTONIC)``, is read every
  ``CLOCK_EVERY`` rounds) it sleeps in ``futex(FUTEX_WAIT)`` on the generation; ``kiln_pool_run``
  wakes sleepers with ``FUTEX_WAKE`` only when there are any. A spin counted in ``pause`` rounds
  lasted as long as the CPU's ``pause`` takes (a few cycles on some CPUs, over a hundred on others):
  about 100 us here, and on the CI machine the workers were asleep before the next kernel came.
  Announcing the sleep (``sleepers += 1``) before re-reading the generation, both sequentially
  consistent, means either the worker sees the new task or the caller sees a sleeper: no lost wake-up;
- both spin loops yield the CPU now and then (``sched_yield``), so a spinning worker does not
  keep a BLAS thread or another process off its core for long; and ``kiln_pool_park`` sends
  spinning workers to sleep at once. Only programs of kernels alone use this pool (the executor
  decides: with it, an MLP training step, BLAS-bound, measured 0.96x torch against 0.83x on the
  Python pool, medians of 7 runs), and any other program's first eager step parks the workers a
  kernel-only program left spinning.

Workers are Python threads whose target is the native loop (ctypes releases the GIL for the call,
which returns only when ``kiln_pool_stop`` asks it to). Linux only (futex); elsewhere
``runtime.threads`` keeps its Python pool. Kernels run here cannot raise: the Python pool serves
Python callables (the tests' failing kernels) and keeps its error handling.
"""

from __future__ import annotations

import atexit
import ctypes
import platform
import sys
import threading

from ...runtime import threads

#: how long a worker spins without work before it sleeps (like OpenMP's KMP_BLOCKTIME), nanoseconds
SPIN_NS = 100_000
#: spin rounds between two reads of the clock (a vDSO call, tens of ns)
CLOCK_EVERY = 32
#: spin rounds between two sched_yield calls
YIELD_EVERY = 256

_FUTEX = {"x86_64": 202, "aarch64": 98}  # the futex syscall's number
#: The pool's module is compiled as cheaply as LLVM can (``engine.TINY``, spelled here: importing the
#: engine loads LLVM, which a cache hit does without): LLVM's O2 pipeline took 30-40 ms of CPU on it,
#: the tiny tier 4 ms, and that compile was most of a cold process's second call of a compiled step
#: (DCGAN's, the CNN's: ~40 ms, 3 ms later). Its code waits and hands out chunks; dispatching a small
#: kernel to the spinning worker took 2.76-2.84 us (medians of 8 blocks of 3,000 calls) built either way.
TIER = "; kiln: tiny\n"
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129


def supported() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in _FUTEX


def _ir() -> str:
    futex = _FUTEX[platform.machine()]
    pause = "call void @llvm.x86.sse2.pause()" if platform.machine() == "x86_64" else "fence seq_cst"
    declare_pause = "declare void @llvm.x86.sse2.pause()" if platform.machine() == "x86_64" else ""
    return f"""
@generation = internal global i32 0, align 64
@ticket = internal global i64 0, align 64
@completed = internal global i32 0, align 64
@sleepers = internal global i32 0, align 64
@stop = internal global i32 0, align 64
@park = internal global i32 0, align 64
@task_fn = internal global ptr null, align 64
@task_args = internal global ptr null
@task_extent = internal global i64 0
@task_chunks = internal global i64 0
@task_threads = internal global i64 0
@spin_ns = internal global i64 {SPIN_NS}

declare i64 @syscall(i64, ...)
declare i32 @sched_yield()
declare i32 @clock_gettime(i32, ptr)
{declare_pause}

; CLOCK_MONOTONIC in nanoseconds
define internal i64 @now_ns(ptr %spec) {{
entry:
  %ignored = call i32 @clock_gettime(i32 1, ptr %spec)
  %s = load i64, ptr %spec
  %nsp = getelementptr i64, ptr %spec, i64 1
  %ns = load i64, ptr %nsp
  %sns = mul i64 %s, 1000000000
  %t = add i64 %sns, %ns
  ret i64 %t
}}

define internal void @relax(i32 %round) {{
entry:
  {pause}
  %r = urem i32 %round, {YIELD_EVERY}
  %y = icmp eq i32 %r, {YIELD_EVERY - 1}
  br i1 %y, label %yield, label %done
yield:
  %ignored = call i32 @sched_yield()
  br label %done
done:
  ret void
}}

; claim chunks of task `gen` and run them until none is left. The ticket holds the generation of
; the task it counts for (high 32 bits) and its chunks not yet claimed (low 32 bits), so a claim is
; a compare-and-swap that fails once the task is no longer `gen`: a thread that saw a task late
; (descheduled between reading the generation and claiming) takes nothing of the next task. A
; claimed chunk keeps its task from completing, so the task's parameters, read after the claim,
; are that task's.
define internal void @work(i32 %gen) {{
entry:
  br label %claim
claim:
  %t = load atomic i64, ptr @ticket seq_cst, align 8
  %high = lshr i64 %t, 32
  %tgen = trunc i64 %high to i32
  %left = trunc i64 %t to i32
  %ours = icmp eq i32 %tgen, %gen
  %some = icmp sgt i32 %left, 0
  %open = and i1 %ours, %some
  br i1 %open, label %cas, label %done
cas:
  %t1 = sub i64 %t, 1
  %pair = cmpxchg ptr @ticket, i64 %t, i64 %t1 seq_cst seq_cst
  %won = extractvalue {{ i64, i1 }} %pair, 1
  br i1 %won, label %call, label %claim
call:
  %left1 = sub i32 %left, 1
  %chunk = zext i32 %left1 to i64
  %fn = load ptr, ptr @task_fn
  %args = load ptr, ptr @task_args
  %extent = load i64, ptr @task_extent
  %chunks = load i64, ptr @task_chunks
  %b0 = mul i64 %extent, %chunk
  %begin = sdiv i64 %b0, %chunks
  %chunk1 = add i64 %chunk, 1
  %e0 = mul i64 %extent, %chunk1
  %end = sdiv i64 %e0, %chunks
  call void %fn(ptr %args, i64 %begin, i64 %end)
  %c = atomicrmw add ptr @completed, i32 1 release
  br label %claim
done:
  ret void
}}

; the loop of worker `index`; `first` is the generation its creator read before starting it (read
; here, a task published while the thread was starting would be taken for an old one and never run)
define void @kiln_pool_worker(i64 %index, i32 %first) {{
entry:
  %spec = alloca [2 x i64], align 8
  br label %wait
wait:
  %seen = phi i32 [ %first, %entry ], [ %seen, %woke ], [ %now, %run ]
  %since = call i64 @now_ns(ptr %spec)
  br label %spin
spin:
  %round = phi i32 [ 0, %wait ], [ %next, %relax ], [ %next, %clock ]
  %now = load atomic i32, ptr @generation acquire, align 4
  %changed = icmp ne i32 %now, %seen
  br i1 %changed, label %check, label %relax
relax:
  call void @relax(i32 %round)
  %next = add i32 %round, 1
  %parking = load atomic i32, ptr @park monotonic, align 4
  %parked = icmp ne i32 %parking, 0
  %r = urem i32 %next, {CLOCK_EVERY}
  %tick = icmp eq i32 %r, 0
  %look = or i1 %parked, %tick
  br i1 %look, label %clock, label %spin
clock:
  %t = call i64 @now_ns(ptr %spec)
  %spent = sub i64 %t, %since
  %budget = load atomic i64, ptr @spin_ns monotonic, align 8
  %young = icmp slt i64 %spent, %budget
  %unparked = xor i1 %parked, true
  %more = and i1 %young, %unparked
  br i1 %more, label %spin, label %sleep
sleep:
  %s0 = atomicrmw add ptr @sleepers, i32 1 seq_cst
  %again = load atomic i32, ptr @generation seq_cst, align 4
  %same = icmp eq i32 %again, %seen
  br i1 %same, label %futex, label %woke
futex:
  %w = call i64 (i64, ...) @syscall(i64 {futex}, ptr @generation, i64 {_FUTEX_WAIT_PRIVATE}, i32 %seen, ptr null)
  br label %woke
woke:
  %s1 = atomicrmw sub ptr @sleepers, i32 1 seq_cst
  br label %wait
check:
  %halt = load atomic i32, ptr @stop acquire, align 4
  %stopping = icmp ne i32 %halt, 0
  br i1 %stopping, label %exit, label %count
count:
  ; the task's thread count: workers beyond it (started for a larger count earlier) sit it out. Read
  ; before a claim it may be the next task's; then the claim fails, and a wrong guess costs nothing.
  %threads = load atomic i64, ptr @task_threads monotonic, align 8
  %rank = add i64 %index, 1
  %mine = icmp slt i64 %rank, %threads
  br i1 %mine, label %work, label %run
work:
  call void @work(i32 %now)
  br label %run
run:
  br label %wait
exit:
  ret void
}}

; a new generation: workers spinning see it, sleeping ones are woken (only when there are any)
define internal void @publish() {{
entry:
  %g = atomicrmw add ptr @generation, i32 1 seq_cst
  %sleeping = load atomic i32, ptr @sleepers seq_cst, align 4
  %any = icmp ne i32 %sleeping, 0
  br i1 %any, label %wake, label %done
wake:
  %w = call i64 (i64, ...) @syscall(i64 {futex}, ptr @generation, i64 {_FUTEX_WAKE_PRIVATE}, i32 2147483647)
  br label %done
done:
  ret void
}}

; run fn(args, begin, end) over [0, extent) in `chunks` chunks that this thread and `threads` - 1
; workers claim as they come (a worker the OS has not scheduled yet takes none, and this thread does its
; share); all on this thread if a worker sleeps and `wake` is 0 (work too small to pay for waking it)
define void @kiln_pool_run(ptr %fn, ptr %args, i64 %extent, i64 %chunks, i64 %threads, i32 %wake) {{
entry:
  %sleeping = load atomic i32, ptr @sleepers seq_cst, align 4
  %asleep = icmp ne i32 %sleeping, 0
  %nowake = icmp eq i32 %wake, 0
  %serial = and i1 %asleep, %nowake
  br i1 %serial, label %alone, label %split
alone:
  call void %fn(ptr %args, i64 0, i64 %extent)
  ret void
split:
  store atomic i32 0, ptr @park monotonic, align 4
  store ptr %fn, ptr @task_fn
  store ptr %args, ptr @task_args
  store i64 %extent, ptr @task_extent
  store i64 %chunks, ptr @task_chunks
  store atomic i64 %threads, ptr @task_threads monotonic, align 8
  store atomic i32 0, ptr @completed monotonic, align 4
  %g0 = load atomic i32, ptr @generation seq_cst, align 4
  %gen = add i32 %g0, 1
  %genwide = zext i32 %gen to i64
  %high = shl i64 %genwide, 32
  %ticket = or i64 %high, %chunks
  store atomic i64 %ticket, ptr @ticket seq_cst, align 8
  call void @publish()
  call void @work(i32 %gen)
  %count = trunc i64 %chunks to i32
  br label %spin
spin:
  %round = phi i32 [ 0, %split ], [ %next, %relax ]
  %finished = load atomic i32, ptr @completed acquire, align 4
  %all = icmp eq i32 %finished, %count
  br i1 %all, label %done, label %relax
relax:
  call void @relax(i32 %round)
  %next = add i32 %round, 1
  br label %spin
done:
  ret void
}}

; spinning workers sleep now (something else, BLAS's threads, wants the cores); the next task wakes them
define void @kiln_pool_park() {{
entry:
  store atomic i32 1, ptr @park monotonic, align 4
  ret void
}}

; every worker returns from kiln_pool_worker
define void @kiln_pool_stop() {{
entry:
  store atomic i32 1, ptr @stop release, align 4
  call void @publish()
  ret void
}}

; how long a worker spins without work before it sleeps, in nanoseconds
define void @kiln_pool_set_spin(i64 %ns) {{
entry:
  store atomic i64 %ns, ptr @spin_ns monotonic, align 8
  ret void
}}

define i32 @kiln_pool_sleepers() {{
entry:
  %n = load atomic i32, ptr @sleepers seq_cst, align 4
  ret i32 %n
}}

define i32 @kiln_pool_generation() {{
entry:
  %g = load atomic i32, ptr @generation seq_cst, align 4
  ret i32 %g
}}

; a forked child: the parent's sleepers and stop flag are not its own
define void @kiln_pool_reset() {{
entry:
  store atomic i32 0, ptr @sleepers seq_cst, align 4
  store atomic i32 0, ptr @stop seq_cst, align 4
  store atomic i64 0, ptr @ticket seq_cst, align 8
  store atomic i32 0, ptr @completed seq_cst, align 4
  ret void
}}
"""


def _object_code() -> bytes:
    """The pool's object code: from the disk cache where this host compiled it before, else compiled
    here (LLVM imported at the first split kernel, not with the backend) and stored. A warm process
    then loads no LLVM for the pool: importing llvmlite and compiling the pool took 70-150 ms of
    the LSTM LM's first call, whose program came from the cache."""
    from ...runtime.cache import cache_key, source_digest  # noqa: PLC0415 - at the first split kernel only
    from . import host, kernel_cache  # noqa: PLC0415

    ir = TIER + _ir()
    cache = kernel_cache.kernel_cache()
    # the code generator's source (the optimization level and passes LLVM runs) and the host decide the code
    key = cache_key("kiln native pool", source_digest("codegen"), host.signature(), ir) if cache.enabled else None
    code = cache.get(key) if key is not None else None
    if code is None:
        from . import engine  # noqa: PLC0415 - loads LLVM

        code = engine.compile_here(ir)
        if key is not None:
            cache.put(key, code)
    return code


_RUN = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32
)
_WORKER = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int32)
_COUNT = ctypes.CFUNCTYPE(ctypes.c_int32)
_SET = ctypes.CFUNCTYPE(None, ctypes.c_int64)
_VOID = ctypes.CFUNCTYPE(None)


class NativePool:
    """The compiled pool and its worker threads (started on demand, stopped at exit)."""

    def __init__(self) -> None:
        from .backend import load_objects  # noqa: PLC0415 - the backend imports this module

        self._library = load_objects([_object_code()])
        self.run = _RUN(self._library.address("kiln_pool_run"))
        self._worker = _WORKER(self._library.address("kiln_pool_worker"))
        self._stop = _VOID(self._library.address("kiln_pool_stop"))
        self._reset = _VOID(self._library.address("kiln_pool_reset"))
        self._generation = _COUNT(self._library.address("kiln_pool_generation"))
        self.park = _VOID(self._library.address("kiln_pool_park"))
        #: the workers asleep in futex now
        self.sleepers = _COUNT(self._library.address("kiln_pool_sleepers"))
        #: how long an idle worker spins before it sleeps, in nanoseconds (SPIN_NS to begin with)
        self.set_spin = _SET(self._library.address("kiln_pool_set_spin"))
        self.workers: list[threading.Thread] = []
        self.lock = threading.Lock()  # one task at a time: a second caller uses the Python pool
        atexit.register(self.stop)

    def ensure(self, count: int) -> None:
        while len(self.workers) < count:
            index, generation = len(self.workers), self._generation()
            worker = threading.Thread(
                target=self._loop, args=(index, generation), name=f"kiln-native-{index}", daemon=True
            )
            worker.start()
            self.workers.append(worker)

    def _loop(self, index: int, generation: int) -> None:
        threads.mark_worker()
        self._worker(index, generation)

    def stop(self) -> None:
        """Return every worker from its native loop (before the interpreter frees the code it runs)."""
        if self.workers:
            self._stop()
            for worker in self.workers:
                worker.join()
            self.workers = []
            self._reset()

    def after_fork(self) -> None:
        """In a forked child: none of the parent's workers exist here."""
        self.workers = []
        self.lock = threading.Lock()
        self._reset()
