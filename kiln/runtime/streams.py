"""CUDA streams and events over cupy's: the queues kernels are launched on, and markers in them.

Work on a CUDA device is queued asynchronously on the *current stream*: cupy's kernels, cuBLAS
and kiln's compiled kernels (launched on the stream cupy is using, kiln/runtime/cuda_executor.py)
all go there, and the host runs ahead until it needs a value (``.item()``, ``.cpu()``,
``.numpy()``, printing), which copies to the host and so waits for that stream. ``Stream`` and
``Event`` follow ``torch.cuda.Stream`` and ``torch.cuda.Event``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .devices import require_cuda


class Stream:
    """A CUDA stream (``cupy.cuda.Stream``); ``with kiln.cuda.stream(s):`` makes it current.

    ``priority``: lower is more urgent, as in CUDA (0 is the default priority).
    """

    def __init__(self, device: Any = None, priority: int = 0, *, _cupy_stream: Any = None) -> None:
        cp = require_cuda("kiln.cuda.Stream()")
        if _cupy_stream is not None:
            self._stream = _cupy_stream
        else:
            with cp.cuda.Device(_index(device)):
                self._stream = cp.cuda.Stream(non_blocking=False, priority=priority)

    @property
    def cuda_stream(self) -> int:
        """The raw ``cudaStream_t`` as an int (0 for the legacy default stream)."""
        return int(self._stream.ptr)

    def synchronize(self) -> None:
        """Wait until everything queued on this stream has run."""
        self._stream.synchronize()

    def query(self) -> bool:
        """Whether everything queued on this stream has run (without waiting)."""
        return bool(self._stream.done)

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        """Work queued on this stream after this call waits for ``event``."""
        self._stream.wait_event(event._event)

    def wait_stream(self, stream: Stream) -> None:
        """Work queued on this stream after this call waits for what ``stream`` has queued so far."""
        self.wait_event(stream.record_event())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.cuda_stream == self.cuda_stream

    def __hash__(self) -> int:
        return hash(self.cuda_stream)

    def __repr__(self) -> str:
        return f"<kiln.cuda.Stream cuda_stream={self.cuda_stream:#x}>"


class Event:
    """A marker in a stream: ``record`` it, then wait for it or time between two of them.

    >>> # on a GPU: start, end = Event(enable_timing=True), Event(enable_timing=True)
    >>> # start.record(); work(); end.record(); end.synchronize(); start.elapsed_time(end)  # ms
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        cp = require_cuda("kiln.cuda.Event()")
        self.enable_timing = enable_timing
        self._event = cp.cuda.Event(block=blocking, disable_timing=not enable_timing, interprocess=interprocess)

    def record(self, stream: Stream | None = None) -> None:
        self._event.record(None if stream is None else stream._stream)

    def wait(self, stream: Stream | None = None) -> None:
        (current_stream() if stream is None else stream).wait_event(self)

    def query(self) -> bool:
        return bool(self._event.done)

    def synchronize(self) -> None:
        self._event.synchronize()

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (both recorded, timing enabled, ``end`` done)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Event.elapsed_time: both events must be created with enable_timing=True")
        cp = require_cuda("Event.elapsed_time()")
        return float(cp.cuda.get_elapsed_time(self._event, end._event))

    def __repr__(self) -> str:
        return f"<kiln.cuda.Event timing={self.enable_timing}>"


def _index(device: Any) -> int:
    if device is None:
        cp = require_cuda("a CUDA device")
        return int(cp.cuda.runtime.getDevice())
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is None and isinstance(device, str):
        _, _, text = device.partition(":")
        index = int(text) if text else 0
    return int(index or 0)


def current_stream(device: Any = None) -> Stream:
    """The stream kernels are queued on now (the default stream unless a ``stream(...)`` is active)."""
    cp = require_cuda("kiln.cuda.current_stream()")
    with cp.cuda.Device(_index(device)):
        return Stream(_cupy_stream=cp.cuda.get_current_stream())


def default_stream(device: Any = None) -> Stream:
    cp = require_cuda("kiln.cuda.default_stream()")
    with cp.cuda.Device(_index(device)):
        return Stream(_cupy_stream=cp.cuda.Stream.null)


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    """Make ``s`` the current stream inside the ``with`` block (None: no change, as in PyTorch)."""
    if s is None:
        yield
        return
    with s._stream:
        yield
