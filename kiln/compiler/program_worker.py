"""The program worker: a kiln process of its own that runs a background compile's passes and code generation.

A background compile (``kiln.compile``'s default, ``frontend/jit/background.py``) ran the pass
pipeline, the building of LLVM IR and the rest of its Python work on a thread of the user's
process, holding the interpreter's lock for about 270 ms of a DCGAN compile: the eager calls running
meanwhile slowed 2x, and a decorated 200-step run took longer than an undecorated one. Here that
work runs in another process, on another core: the compile thread sends the traced graph, waits
for the reply without the lock, and loads the program exactly as a disk-cache hit does
(``driver._from_cache``, a few milliseconds). The reply *is* the cache entry, which the driver
also writes to the disk cache, so a second process gets the program too.

Only threads that compile in the background use it (``on_this_thread``, set by ``background.py``'s
pool): a compile the caller waits for runs in its own process, where nothing competes with it and no
request, start-up or reply is paid. The worker takes what it can rebuild exactly from the message --
a CPU (LLVM) program with the default passes and no ``dump_dir`` (``takes``); anything else, a
worker that cannot start, dies, errs or runs past the compile's deadline, compiles on the thread as
before (the same program), with the reason logged at debug level.

The worker is ``python -c ... PARENT_PID [pdeathsig]`` with kiln's own folder first on its path (so
nothing of the user's ``__main__`` or working directory is imported) and the LLVM worker's guards
against outliving its parent (``codegen/llvm/worker.py``). Unlike the LLVM worker it runs at its
parent's priority -- the priority of the thread whose work it does -- and LLVM runs in it. On a
quiet machine it has a core of its own whatever its priority; on a busy one (a 2-core machine at
load 4-5, 200-step runs in fresh processes, this tree and the one before alternated, ratio of the
background run to the eager run), five steps lower its compile was ready so late that the LSTM LM's
run lost to the tree before (1.05-1.55 against 0.71-1.11, 8 of 10 pairs worse), where at the
parent's priority it won every pair (0.72-1.11 against 0.85-1.39). DCGAN's program was ready within
the run in 6 of 6 runs at the parent's priority, in 0 of 6 five steps lower and 1 of 12 in the tree
before, its ratio as noisy in all three (medians 1.52, 1.48, 1.44).

It is started when ``kiln.compile`` decorates a function that compiles in the background (its
start-up, the compiler's imports, takes about 0.35 s: ``_BOOT``), and replaced when it has died or
asks to be (``_retires``: LLVM keeps memory for good per module a process compiles).

Messages are an 8-byte little-endian length and a payload, never pickles: first the worker's
``b"ok"`` when it is ready; a request is ``program_cache.pack_graph``'s bytes (the traced graph,
its constants, and the options, input strides and write-backs as JSON metadata); a reply is
``b"ok"`` + an 8-byte length + JSON (the stage timings, whether the worker retires) + the cache
entry, or ``b"er"`` + the error's text.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time

logger = logging.getLogger("kiln")

#: ``KILN_PROGRAM_WORKER=0`` compiles in the background on the thread, as before the worker existed.
ENV = "KILN_PROGRAM_WORKER"

_HEADER = struct.Struct("<Q")
_local = threading.local()


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no") and sys.platform != "win32"


@contextlib.contextmanager
def on_this_thread(if_started: bool = False):
    """Within it, this thread's program compiles go to the worker (where it ``takes`` them);
    ``if_started``: only to a worker that is ready and free (eager kernels' compiles: they never
    start one -- a process that only runs eagerly would wait for its start-up before its first
    kernel -- nor wait for one, which a program's compile holds: the program goes first, and an
    LSTM LM's was ready 0.2-0.7 s later when a kernel took the worker's start-up before it)."""
    before = getattr(_local, "on", None)
    _local.on = "if started" if if_started else "always"
    try:
        yield
    finally:
        _local.on = before


def takes(backend, options) -> bool:
    """Whether a compile on this thread, for ``backend`` with ``options``, goes to the worker."""
    on = getattr(_local, "on", None)
    if on is None or (on == "if started" and not (WORKER.ready and WORKER.pid == os.getpid())):
        return False
    return (backend.name == "llvm" and options.passes is None and not options.dump_dir and not WORKER.broken
            and enabled())  # fmt: skip


def compile_entry(traced, options, strides: tuple, requested: tuple, deadline: float | None):
    """``(cache entry, the worker's stage timings)`` of ``traced``'s program, compiled by the worker
    (``driver.compile_entry``); None where it could not (said at debug level): compile it here."""
    from . import program_cache  # noqa: PLC0415

    try:
        request = program_cache.pack_graph(traced, {"request": json.dumps({
            "backend": options.backend, "verify": options.verify, "loops": options.loops,
            "strides": [None if s is None else list(s) for s in strides],
            "requested": [list(pair) for pair in requested],
        })})  # fmt: skip
    except Exception as error:  # noqa: BLE001 - a graph the message cannot carry compiles here
        logger.debug("kiln: the program worker cannot take this graph (%s: %s); compiling on the thread",
                     type(error).__name__, error)  # fmt: skip
        return None
    worker = WORKER
    if not worker.lock.acquire(blocking=getattr(_local, "on", None) != "if started"):
        return None  # busy with a program: this eager kernel compiles on its thread
    try:
        return worker.compile(request, deadline)
    finally:
        worker.lock.release()


def start_soon() -> None:
    """Start the worker now, if none runs, without waiting for it to load (``kiln.compile`` calls
    this when it decorates a function that compiles in the background)."""
    worker = WORKER
    if not enabled() or worker.broken or not worker.lock.acquire(blocking=False):
        return  # a compile holding the lock has a worker running: decorating never waits for it
    try:
        worker.running()
    except OSError as error:
        worker.give_up(f"it could not start ({error})")
    finally:
        worker.lock.release()


# The LLVM worker's framing (codegen/llvm/worker.py), written again: that module runs as a script
# that imports no kiln package, and a disk-cache hit must load without importing the code generator.
def _write(stream, payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _read(stream) -> bytes | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    payload = stream.read(size)
    return payload if len(payload) == size else None


class _TimedOut(Exception):
    pass


class Worker:
    """The one program worker of this process; ``lock`` is held by the thread using it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.pid = os.getpid()  # the process whose worker this is
        self.ready = False  # its ``ok`` came: it imported the compiler
        self.answered = False  # a worker of this process has been ready once
        self.broken = False  # could not start: compile on the thread from then on
        self.started = 0  # processes started, for tests

    def running(self) -> subprocess.Popen:
        if self.pid != os.getpid():  # a forked child: its parent's worker is not its own
            self.process, self.pid, self.ready = None, os.getpid(), False
        if self.process is not None and self.process.poll() is not None:
            self.close()
        if self.process is None:
            self.process, self.ready = _start(), False
            self.started += 1
        return self.process

    def compile(self, request: bytes, deadline: float | None):
        try:
            process = self.running()
        except OSError as error:
            self.give_up(f"it could not start ({error})")
            return None
        try:
            start = time.perf_counter()
            if not self.ready:
                if _read_by(process, deadline) is None:
                    if not self.answered:  # it never worked here: it will not next time either
                        self.give_up("it ended before it was ready")
                        return None
                    raise OSError("a new worker ended before it was ready")
                self.ready = self.answered = True
                logger.debug("kiln: waited %.3f s for the program worker to start", time.perf_counter() - start)
            _write(process.stdin, request)
            _sent(process)
            reply = _read_by(process, deadline)
            logger.debug("kiln: the program worker replied in %.3f s", time.perf_counter() - start)
        except _TimedOut:
            self.close(kill=True)
            logger.debug("kiln: the program worker ran past the compile's deadline; it was stopped")
            return None
        except (OSError, ValueError):  # the pipe broke: the worker died meanwhile
            reply = None
        if reply is None:
            self.close(kill=True)
            logger.debug("kiln: the program worker ended while compiling; compiling on the thread")
            return None
        if reply[:2] != b"ok":
            logger.debug(
                "kiln: the program worker failed (%s); compiling on the thread", reply[2:].decode(errors="replace")
            )
            return None
        (size,) = _HEADER.unpack_from(reply, 2)
        told = json.loads(reply[2 + _HEADER.size : 2 + _HEADER.size + size])
        if told["retire"]:  # replaced now, so that the next compile finds its successor started
            self.close()
            self.running()
        return reply[2 + _HEADER.size + size :], [(name, s) for name, s in told["seconds"]]

    def give_up(self, why: str) -> None:
        """No worker in this process from now on (said once, at debug level: the thread compiles)."""
        self.close(kill=True)
        if not self.broken:
            logger.debug("kiln: no program worker: %s; background compiles run on their thread", why)
        self.broken = True

    def close(self, kill: bool = False) -> None:
        process, self.process, self.ready = self.process, None, False
        if process is None or self.pid != os.getpid():
            return
        if kill:
            process.kill()
        for stream in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _sent(process: subprocess.Popen) -> None:
    """Called when a request was sent (tests replace it to kill the worker mid-compile)."""


def _read_by(process: subprocess.Popen, deadline: float | None) -> bytes | None:
    """The next message, waited for until ``deadline`` (``_TimedOut`` past it); None at end of file."""
    assert process.stdout is not None
    if deadline is not None:
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise _TimedOut
    return _read(process.stdout)


#: The worker's first lines: kiln's folder replaces the working directory on the path, and the
#: package ``kiln`` is made without running its ``__init__`` (the frontend, nn, optim...), whose
#: imports the compiler does not need: the worker is ready in about half the time (0.35 s, not 0.6-1.0).
_BOOT = (
    "import sys, importlib.machinery, importlib.util; sys.path[0] = {root!r}; "
    "sys.modules['kiln'] = importlib.util.module_from_spec(importlib.machinery.PathFinder.find_spec('kiln', [{root!r}])); "
    "from kiln.compiler.program_worker import main; main(sys.argv[1:])"
)


def _start() -> subprocess.Popen:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    command = [sys.executable, "-c", _BOOT.format(root=root), str(os.getpid())]
    # Linux sends the parent-death signal when the *thread* that started the child ends: only the
    # main thread lives as long as this process.
    if threading.current_thread() is threading.main_thread():
        command.append("pdeathsig")
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


WORKER = Worker()


def _forget_after_fork() -> None:
    """A forked child has its parent's worker object, whose lock a compile thread of the parent may
    have held at the fork (no thread of the child releases it): it gets a worker of its own."""
    global WORKER
    WORKER = Worker()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def _at_exit() -> None:
    """Kill the worker rather than wait for it: a compile it is running can only be dropped now."""
    WORKER.broken = True  # a compile thread that loses its reply does not start another
    WORKER.close(kill=True)


# ---------------------------------------------------------------------- the worker process's side
def serve(requests, replies) -> None:
    """The worker's loop: compile each request read from ``requests`` until it closes."""
    from ..codegen.llvm import backend, worker  # noqa: F401, PLC0415 - imported before the first request asks
    from . import driver, program_cache  # noqa: PLC0415
    from .options import CompileOptions  # noqa: PLC0415

    # at its parent's priority (see the module's docstring)
    _write(replies, b"ok")
    warm_up()
    while (request := _read(requests)) is not None:
        try:
            traced, meta, _ = program_cache.unpack_graph(request)
            asked = json.loads(meta["request"])
            options = CompileOptions(backend=asked["backend"], verify=asked["verify"], loops=asked["loops"],
                                     compile_timeout=None, wait=True)  # fmt: skip
            strides = tuple(None if s is None else tuple(s) for s in asked["strides"])
            requested = tuple(tuple(pair) for pair in asked["requested"])
            # No deadline here: its caller keeps it (and kills this process past it), and LLVM then
            # runs in this process -- given one, it would run in the LLVM workers, a process more
            # to start and its IR text to pipe there.
            entry, seconds = driver.compile_entry(traced, options, strides, requested, None)
            timings = json.dumps({"seconds": seconds, "retire": _retires()}).encode()
            reply = b"ok" + _HEADER.pack(len(timings)) + timings + entry
        except Exception as error:  # noqa: BLE001 - the caller compiles it itself, and says why at debug level
            reply = b"er" + f"{type(error).__name__}: {error}".encode()
        _write(replies, reply)


def warm_up() -> None:
    """Import what a compile imports on first use -- the code generator, llvmlite's IR builder,
    LLVM itself (a 180 MB library) and its target -- once the worker has said it is ready: its
    first compile (DCGAN's, ~0.5 s) paid ~0.03 s of them (66 modules), and a first request
    usually comes later than the worker's start-up (a model is built, a batch loaded, a trace run)."""
    from ..codegen import mathlib  # noqa: F401, PLC0415
    from ..codegen.llvm import backend, compile_stream, elementwise, engine, horizontal, kernels, reduction  # noqa: F401, PLC0415

    engine.target_machine()


def _retires() -> bool:
    """Whether this worker should be replaced: LLVM keeps memory for good per module compiled in a
    process, and past ``IN_PROCESS_COMPILES`` modules the engine would move them to its workers (a
    process more, the IR piped there); a fresh worker compiles them in itself again."""
    from ..codegen.llvm import engine, worker  # noqa: PLC0415

    return engine._compiles >= worker.IN_PROCESS_COMPILES


def main(argv: list[str]) -> None:
    """``PARENT_PID [pdeathsig]``: serve stdin until it closes."""
    from ..codegen.llvm import worker  # noqa: PLC0415 - its guards against outliving the parent

    parent = int(argv[0])
    if "pdeathsig" in argv[1:]:
        worker._die_with_parent(parent)
    threading.Thread(target=worker._Watchdog(parent).run, daemon=True, name="kiln-program-worker-watchdog").start()
    serve(sys.stdin.buffer, sys.stdout.buffer)
