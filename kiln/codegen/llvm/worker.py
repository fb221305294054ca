"""A compile worker: a separate process that turns LLVM IR into object code.

llvmlite (0.50) keeps about 100 KB for good each time it builds an optimization pipeline (a pass
builder's instrumentation callbacks are never freed, and a builder cannot be reused: each run
leaves callbacks behind that point into that run's stack). A process that compiles thousands of
programs would grow without bound. So ``engine.compile_ir`` compiles its first
``IN_PROCESS_COMPILES`` modules in this process (no start-up cost for the common case) and the
rest in a worker process, which is replaced after ``WORKER_COMPILES`` compiles: its memory goes
back to the system when it exits. A worker that cannot start is said once, and compiles go on in
this process. A module that kills the worker (an LLVM abort) raises ``RuntimeError`` here, where
it would have ended the caller's process.

The worker is ``python -m kiln.codegen.llvm.worker``; it imports kiln's code generator only,
never the caller's ``__main__``. Messages on its stdin and stdout are an 8-byte little-endian
length and a payload: requests are IR text, replies are ``b"ok"`` + object code or ``b"er"`` +
the error's text. It exits when its stdin closes (so it never outlives its parent).
"""

from __future__ import annotations

import atexit
import logging
import os
import struct
import subprocess
import sys

logger = logging.getLogger("kiln")

IN_PROCESS_COMPILES = 48  # ~5 MB of llvmlite's leak before compiles move out
WORKER_COMPILES = 256  # compiles per worker process before it is replaced

_HEADER = struct.Struct("<Q")


class WorkerDied(RuntimeError):
    """The worker process ended while compiling a module."""


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
    """One worker process (started on first use, replaced after ``WORKER_COMPILES`` compiles)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._compiles = 0
        self._answered = False  # a worker has replied at least once in this process
        self._pid = os.getpid()  # the process whose worker this is
        self.broken = False  # could not start: compile in this process from then on

    def compile(self, ir_text: str) -> bytes:
        """Object code for ``ir_text`` (``RuntimeError`` with LLVM's message when it fails)."""
        process = self._running()
        try:
            _write(process.stdin, ir_text.encode())
            reply = _read(process.stdout)
        except OSError:
            reply = None
        self._compiles += 1
        if reply is None:
            self.close()
            if not self._answered:  # it never worked here (it could not import kiln, say)
                raise OSError("the LLVM compile worker did not start")
            raise WorkerDied("the LLVM compile worker ended while compiling this module (an LLVM crash)")
        self._answered = True
        if reply[:2] == b"er":
            raise RuntimeError(reply[2:].decode(errors="replace"))
        return reply[2:]

    def _running(self) -> subprocess.Popen:
        if self._pid != os.getpid():  # a forked child (a DataLoader worker): its parent's worker is not its own
            self._process, self._pid = None, os.getpid()
        if self._process is not None and (self._compiles >= WORKER_COMPILES or self._process.poll() is not None):
            self.close()
        if self._process is None:
            # The kiln this process runs, wherever it was imported from.
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
            self._process = subprocess.Popen(
                [sys.executable, "-m", "kiln.codegen.llvm.worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            )  # fmt: skip
            self._compiles = 0
        return self._process

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
atexit.register(WORKER.close)


def serve(requests, replies) -> None:
    """The worker's loop: compile each IR text read from ``requests`` until it closes."""
    from .engine import compile_here  # noqa: PLC0415

    while (request := _read(requests)) is not None:
        try:
            reply = b"ok" + compile_here(request.decode())
        except Exception as error:  # noqa: BLE001 - the caller re-raises it with LLVM's message
            reply = b"er" + f"{type(error).__name__}: {error}".encode()
        _write(replies, reply)


if __name__ == "__main__":  # pragma: no cover - run as a process by Worker
    serve(sys.stdin.buffer, sys.stdout.buffer)
