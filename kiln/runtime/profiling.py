"""The profiler's footprint on the hot paths: one flag, read once per eager op and once per compiled run.

``active`` is true only while a ``kiln.profiler.profile`` records; eager dispatch and the executor
of compiled programs read it and, when it is set, hand their work to the functions below, which
time it and pass an ``Event`` to the ``recorder`` (the profile). This module sits in the runtime
layer so that both the frontend's dispatch and the runtime's executor can read it; the profile
itself, its tables and traces are ``kiln.profiler``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

active = False
recorder: Any = None  # the recording profile: .recorded (Event fields as tuples), .record_shapes, .with_stack
_local = threading.local()  # .inside: this thread is timing an eager op (its nested apply runs plainly)
_clock = time.perf_counter_ns
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STACK_DEPTH = 5


@dataclass
class Event:
    """One timed interval: ``name``, category (``op``, ``kernel``, ``extern``, ``compiled``,
    ``compile``, ``user``), start and end in ``perf_counter_ns``, the thread, the bytes the work
    read and wrote, the bytes it allocated, input shapes and the user's stack when recorded."""

    name: str
    cat: str
    start: int
    end: int
    tid: int
    nbytes: int = 0
    allocated: int = 0
    shapes: tuple = ()
    stack: tuple = ()
    args: dict | None = None


def user_stack() -> tuple[str, ...]:
    """The innermost frames outside kiln's own package, as ``file:line in function``."""
    frames: list[str] = []
    frame: Any = sys._getframe(1)
    while frame is not None and len(frames) < _STACK_DEPTH:
        filename = frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(_KILN_DIR):
            frames.append(f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return tuple(frames)


def eager_op(apply, prim, inputs: tuple, attrs: dict):
    """Time ``apply(prim, *inputs, **attrs)`` as an ``op`` event; None when this thread is already
    timing one (``apply`` then runs its own body: the event is recorded once)."""
    rec = recorder
    if rec is None or getattr(_local, "inside", False):
        return None
    _local.inside, _local.compiled = True, False
    start = _clock()
    try:
        result = apply(prim, *inputs, **attrs)
    finally:
        _local.inside = False
    end = _clock()
    kernel = {"kernel": "compiled" if _local.compiled else "numpy"}
    data = result._data
    moved = sum(t._data.nbytes for t in inputs) + data.nbytes
    allocated = 0 if prim.is_view else data.nbytes
    shapes = tuple(tuple(t._data.shape) for t in inputs) if rec.record_shapes else ()
    stack = user_stack() if rec.with_stack else ()
    rec.recorded.append((prim.name, "op", start, end, threading.get_ident(), moved, allocated, shapes, stack, kernel))
    return result


def note_compiled_kernel() -> None:
    """The eager op being timed ran a compiled kernel (``kiln.frontend.eager_kernels``), not numpy."""
    _local.compiled = True


def timed(name: str, cat: str, fn, *args, **info):
    """Call ``fn(*args)`` and record it as one event named ``name`` (a compiled call, a compile)."""
    rec = recorder
    start = _clock()
    try:
        return fn(*args)
    finally:
        if rec is not None:
            stack = user_stack() if rec.with_stack else ()
            rec.recorded.append((name, cat, start, _clock(), threading.get_ident(), 0, 0, (), stack, info))


def step(start: int, end: int, name: str, cat: str, nbytes: int, allocated: int, shapes: tuple, where: tuple) -> None:
    """A step of a compiled program (a kernel or an extern node), timed by the executor; ``where``
    is the user's line that made it (its stack, with ``with_stack``)."""
    rec = recorder
    if rec is not None:  # a tuple: an Event is made when the profile is read (cheaper while recording)
        rec.recorded.append((name, cat, start, end, threading.get_ident(), nbytes, allocated,
                             shapes if rec.record_shapes else (), where if rec.with_stack else (), None))  # fmt: skip


def clock() -> int:
    return _clock()
