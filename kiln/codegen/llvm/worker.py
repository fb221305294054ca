"""A compile worker: a separate process that turns LLVM IR into object code.

llvmlite (0.50) keeps about 100 KB for good each time it builds an optimization pipeline (a pass
builder's instrumentation callbacks are never freed, and a builder cannot be reused: each run
leaves callbacks behind that point into that run's stack). A process that compiles thousands of
programs would grow without bound. So ``engine.compile_ir`` compiles its first
``IN_PROCESS_COMPILES`` modules in this process (no start-up cost) and the rest in a worker
process -- every compile with a time limit too, since only there can it be stopped -- which is replaced after ``WORKER_COMPILES`` compiles: its memory goes
back to the system when it exits. A worker that cannot start is said once, and compiles go on in
this process. A module that kills the worker (an LLVM abort) raises ``RuntimeError`` here, where
it would have ended the caller's process. A worker compiles an empty function before it serves
(``engine.warm_up``): LLVM's one-time set-up is then paid while the caller's passes run, not in the
caller's first module. There are two workers, ``WORKER`` and ``SPARE``, which
``worker_pool`` shares between the threads that compile (``SPARE`` only where a core is idle).

The worker is ``python .../kiln/codegen/llvm/worker.py PARENT_PID [pdeathsig]``; it loads ``engine.py``
and llvmlite only (not the kiln package, nor the caller's ``__main__``). Messages on its stdin and stdout are an 8-byte
little-endian length and a payload: a request is the compile's time limit (a little-endian double,
seconds; 0: none) and IR text, a reply ``b"ok"`` + object code or ``b"er"`` + the error's text. A
request of several modules (``compile_many``) separates their texts by NUL; its reply holds each
object after its 8-byte length. Each module counts as a compile.

A compile with a limit (``Worker.compile(text, timeout)``) that has not answered by then is
abandoned: the worker is killed (LLVM cannot be stopped any other way) and ``CompileTimeout`` is
raised; the next compile starts a new worker. The worker never outlives its parent nor its
deadline, even where nobody kills it: it exits when its stdin closes, Linux kills it when its
parent dies (``PR_SET_PDEATHSIG``), and a watchdog thread in it exits the process when its parent
process changes (the portable check; a stuck compile holds only the main thread) or when a compile
runs ``GRACE_SECONDS`` past its limit.
"""

from __future__ import annotations

import atexit
import logging
import os
import struct
import subprocess
import sys
import threading
import time

logger = logging.getLogger("kiln")

IN_PROCESS_COMPILES = 48  # ~5 MB of llvmlite's leak before compiles move out
WORKER_COMPILES = 256  # compiles per worker process before it is replaced
GRACE_SECONDS = 2.0  # a worker still compiling this long past its limit exits by itself
WATCH_SECONDS = 0.25  # how often the worker's watchdog looks at its parent and its deadline
# How much lower the worker's CPU priority is than its parent's (os.nice): a compile in the
# background (kiln.compile's default) then leaves a contended core to the eager calls that run
# meanwhile, rather than slowing them down; a compile the caller waits for still takes a free core
# (the caller is blocked). A priority, not a thread: the interpreter's lock is not involved.
WORKER_NICE = 5

_HEADER = struct.Struct("<Q")
_LIMIT = struct.Struct("<d")
_SEPARATOR = "\0"  # between the modules of one request (LLVM IR text never holds a NUL)


class WorkerDied(RuntimeError):
    """The worker process ended while compiling a module."""


class CompileTimeout(RuntimeError):
    """LLVM did not finish compiling a module within its time limit; the worker was stopped."""


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


class Worker:
    """One worker process (started on first use, replaced after ``WORKER_COMPILES`` compiles). One
    thread at a time uses it: the one that claimed it (``worker_pool``)."""

    def __init__(self) -> None:
        self.busy = False  # claimed by a thread (``worker_pool``)
        self._process: subprocess.Popen | None = None
        self._compiles = 0
        self._answered = False  # a worker has replied at least once in this process
        self._pid = os.getpid()  # the process whose worker this is
        self.broken = False  # could not start: compile in this process from then on

    def compile(self, ir_text: str, timeout: float | None = None) -> bytes:
        """Object code for ``ir_text`` (``RuntimeError`` with LLVM's message when it fails);
        ``CompileTimeout`` when no reply came within ``timeout`` seconds (None: no limit)."""
        return self._request(ir_text, 1, timeout)

    def compile_many(self, ir_texts: list[str], timeout: float | None = None) -> list[bytes]:
        """``compile`` for several modules in one request: an object for each, in order."""
        assert all(_SEPARATOR not in text for text in ir_texts), "LLVM IR text holds no NUL"
        reply = self._request(_SEPARATOR.join(ir_texts), len(ir_texts), timeout)
        return [reply] if len(ir_texts) == 1 else unpack(reply)  # one module: a plain reply

    def _request(self, text: str, modules: int, timeout: float | None) -> bytes:
        process = self._running()
        request = _LIMIT.pack(timeout or 0.0) + text.encode()
        if timeout is None:
            reply = self._exchange(process, request)
        else:
            reply = self._exchange_within(process, request, timeout)
        self._compiles += modules
        if reply is None:
            self.close()
            if not self._answered:  # it never worked here (it could not import llvmlite, say)
                raise OSError("the LLVM compile worker did not start")
            raise WorkerDied("the LLVM compile worker ended while compiling this module (an LLVM crash)")
        self._answered = True
        if reply[:2] == b"er":
            raise RuntimeError(reply[2:].decode(errors="replace"))
        return reply[2:]

    @staticmethod
    def _exchange(process: subprocess.Popen, request: bytes) -> bytes | None:
        try:
            _write(process.stdin, request)
            return _read(process.stdout)
        except (OSError, ValueError):  # ValueError: the pipe was closed meanwhile (the process exits)
            return None

    def _exchange_within(self, process: subprocess.Popen, request: bytes, timeout: float) -> bytes | None:
        """``_exchange`` on a thread of its own, waited for ``timeout`` seconds: a blocking read on
        a pipe is the one portable wait, and killing the worker ends it."""
        replies: list = []
        exchange = threading.Thread(target=lambda: replies.append(self._exchange(process, request)), daemon=True,
                                    name="kiln-compile-wait")  # fmt: skip
        exchange.start()
        try:
            exchange.join(timeout)
        finally:  # also on KeyboardInterrupt: a reply left in the pipe would answer the next request
            late = exchange.is_alive()
            if late:
                process.kill()
                exchange.join()
                self.close()
        if late:
            raise CompileTimeout(f"LLVM did not finish compiling within {timeout:.3g} s; the compile was abandoned")
        return replies[0]

    def start(self) -> None:
        """Start the process now, if none runs, without waiting for it to load."""
        self._running()

    def _running(self) -> subprocess.Popen:
        if self._pid != os.getpid():  # a forked child (a DataLoader worker): its parent's worker is not its own
            self._process, self._pid = None, os.getpid()
        if self._process is not None and (self._compiles >= WORKER_COMPILES or self._process.poll() is not None):
            self.close()
        if self._process is None:
            self._process = self._start()
            self._compiles = 0
        return self._process

    @staticmethod
    def _start() -> subprocess.Popen:
        command = [sys.executable, os.path.abspath(__file__), str(os.getpid())]
        # Linux sends the parent-death signal when the *thread* that started the child ends: only
        # the main thread lives as long as this process.
        if threading.current_thread() is threading.main_thread():
            command.append("pdeathsig")
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None or self._pid != os.getpid():
            return
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


WORKER = Worker()
# A second worker, where a core is idle: a request of many modules is shared between the two, and a
# second thread is served meanwhile (``worker_pool``).
SPARE = Worker()
atexit.register(WORKER.close)
atexit.register(lambda: SPARE.close())


# ---------------------------------------------------------------------- the worker process's side
class _Watchdog:
    """Ends the worker process when its parent is gone or a compile runs past its deadline."""

    def __init__(self, parent: int) -> None:
        self.parent = parent
        self.deadline: float | None = None  # time.monotonic() past which the compile must not run

    def run(self) -> None:
        while True:
            time.sleep(WATCH_SECONDS)
            if os.getppid() != self.parent:  # orphaned: adopted by init or a subreaper
                os._exit(0)
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline:
                os._exit(3)


def _die_with_parent(parent: int) -> None:
    """Linux: be sent SIGKILL when the parent ends (and exit now if it already has)."""
    if sys.platform.startswith("linux"):
        import ctypes  # noqa: PLC0415
        import signal  # noqa: PLC0415

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def serve(requests, replies, compile_here, watchdog: _Watchdog | None = None) -> None:
    """The worker's loop: ``compile_here`` each IR text read from ``requests`` until it closes."""
    while (request := _read(requests)) is not None:
        (limit,) = _LIMIT.unpack_from(request)
        if watchdog is not None:
            watchdog.deadline = time.monotonic() + limit + GRACE_SECONDS if limit > 0 else None
        try:
            texts = request[_LIMIT.size :].decode().split(_SEPARATOR)
            if len(texts) == 1:
                reply = b"ok" + compile_here(texts[0])
            else:
                reply = b"ok" + b"".join(_HEADER.pack(len(code)) + code for code in map(compile_here, texts))
        except Exception as error:  # noqa: BLE001 - the caller re-raises it with LLVM's message
            reply = b"er" + f"{type(error).__name__}: {error}".encode()
        if watchdog is not None:
            watchdog.deadline = None
        _write(replies, reply)


def unpack(payload: bytes) -> list[bytes]:
    """The objects of a reply to several modules: each an 8-byte length and the object code."""
    objects, offset = [], 0
    while offset < len(payload):
        (size,) = _HEADER.unpack_from(payload, offset)
        objects.append(payload[offset + _HEADER.size : offset + _HEADER.size + size])
        offset += _HEADER.size + size
    return objects


def _standalone_engine():
    """engine.py loaded by itself: it needs llvmlite only, and a worker that does not import the
    kiln package starts in a third of the time."""
    import importlib.util  # noqa: PLC0415

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine.py")
    spec = importlib.util.spec_from_file_location("kiln_compile_worker_engine", path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)
    return engine


def _lower_priority() -> None:
    """This process's priority ``WORKER_NICE`` below its parent's (where processes have one)."""
    try:
        os.nice(WORKER_NICE)
    except (AttributeError, OSError):  # no os.nice (Windows), or refused: compile at the parent's priority
        pass


def main(argv: list[str]) -> None:
    """``python .../worker.py PARENT_PID [pdeathsig]``: serve stdin until it closes."""
    parent = int(argv[0])
    _lower_priority()
    if "pdeathsig" in argv[1:]:
        _die_with_parent(parent)
    watchdog = _Watchdog(parent)
    threading.Thread(target=watchdog.run, daemon=True, name="kiln-worker-watchdog").start()
    engine = _standalone_engine()
    try:
        engine.warm_up()  # while the caller's passes run: its first module then compiles no slower than the rest
    except Exception:  # noqa: BLE001, S110 - a time saving only: a real compile says what LLVM rejects
        pass
    serve(sys.stdin.buffer, sys.stdout.buffer, engine.compile_here, watchdog)


if __name__ == "__main__":  # pragma: no cover - run as a process by Worker
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this file's folder: its modules must not shadow llvmlite's imports
    main(sys.argv[1:])
