"""``kiln.profiler``: where the time goes, eager ops and compiled kernels alike, as in ``torch.profiler``.

    with kiln.profiler.profile(record_shapes=True) as prof:
        with kiln.profiler.record_function("train step"):
            step(x, y)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")  # chrome://tracing or https://ui.perfetto.dev

What is recorded: every eager op (by its primitive's name: ``add``, ``matmul``...), every call of
a compiled function (``kiln.compile(step)``) with each step of its program inside it (``kernel
reduction (add+reduce_max+sub+exp+...)`` for a fused kernel, ``extern matmul`` for a node run by
its eager kernel), each trace-and-compile of a new specialization, and the ``record_function``
ranges. Each event has its wall time, the bytes its work read and wrote and, with
``profile_memory=True``, the bytes it allocated; ``record_shapes`` keeps input shapes,
``with_stack`` the user's source lines. An eager op's event says which kernel ran it
(``args["kernel"]``: ``"compiled"``, kiln's compiled kernel for it, or ``"numpy"``;
``kiln.frontend.eager_kernels``), and the table's Kernel column counts them; a composite op run
as a compiled program (softmax, layer_norm...) is a ``kiln.compile(<op>)`` call with its kernels. Times are host (CPU) times; kernels split across kiln's
thread pool count once, in the calling thread. Off, the profiler costs one flag check per eager
op and per compiled call.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from .frontend import dispatch
from .runtime import profiling
from .runtime.profiling import Event

__all__ = ["profile", "record_function", "ProfilerActivity", "EventAverage", "EventList"]


class ProfilerActivity(enum.Enum):
    """What to record: ``CPU`` (host time of eager ops, compiled calls and kernels). ``CUDA`` is
    accepted for torch compatibility; kiln times GPU work from the host side, as CPU events."""

    CPU = "cpu"
    CUDA = "cuda"


_lock = threading.Lock()


class profile:  # noqa: N801 - torch.profiler.profile's name
    """Record eager ops, compiled calls and their kernels while active (a context manager, or
    ``start()``/``stop()``). Only one profile records at a time.

    >>> import kiln
    >>> with kiln.profiler.profile(record_shapes=True) as prof:
    ...     with kiln.profiler.record_function("double"):
    ...         y = kiln.ones(3) * 2
    >>> [(e.name, e.shapes) for e in prof.events()]
    [('double', ()), ('mul', ((3,), ()))]
    >>> [(a.key, a.count) for a in prof.key_averages()]
    [('double', 1), ('mul', 1)]
    """

    def __init__(self, activities: Iterable[ProfilerActivity] | None = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False) -> None:  # fmt: skip
        activities = set(activities) if activities is not None else {ProfilerActivity.CPU}
        for a in activities:
            if not isinstance(a, ProfilerActivity):
                raise TypeError(f"profile: activities must be kiln.profiler.ProfilerActivity members, got {a!r}")
        self.activities = activities
        self.record_shapes, self.profile_memory, self.with_stack = record_shapes, profile_memory, with_stack
        self.recorded: list[tuple] = []  # Event fields, appended by the hooks (list.append is atomic)
        self._start_ns = 0
        self._running = False

    # ------------------------------------------------------------------ recording
    def start(self) -> profile:
        with _lock:
            if profiling.active:
                raise RuntimeError("kiln.profiler: another profile is already recording; stop it first")
            self.recorded, self._start_ns = [], profiling.clock()
            profiling.recorder, profiling.active = self, True
            dispatch.profiling_ops = True
            self._running = True
        return self

    def stop(self) -> None:
        with _lock:
            if self._running:
                dispatch.profiling_ops = False
                profiling.active, profiling.recorder = False, None
                self._running = False

    def __enter__(self) -> profile:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ results
    def events(self) -> list[Event]:
        """The recorded events, in order of their start."""
        return sorted((Event(*fields) for fields in self.recorded), key=lambda e: (e.start, -e.end))

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> EventList:
        """The events grouped by name (and input shapes, and the first ``group_by_stack_n`` frames of
        the user's stack), with total and self times (self: less the events nested inside)."""
        selves = _self_times(self.events())
        groups: dict[tuple, EventAverage] = {}
        for event, (self_ns, moved, allocated) in selves:
            key = (event.name, event.shapes if group_by_input_shape else (),
                   event.stack[:group_by_stack_n] if group_by_stack_n else ())  # fmt: skip
            avg = groups.get(key)
            if avg is None:
                avg = groups[key] = EventAverage(event.name, input_shapes=key[1], stack=key[2])
            avg.count += 1
            avg.is_op = avg.is_op or event.cat == "op"
            avg.cpu_time_total += (event.end - event.start) / 1e3
            avg.self_cpu_time_total += self_ns / 1e3
            avg.bytes += moved
            avg.cpu_memory_usage += allocated
            avg.self_cpu_memory_usage += event.allocated
            if event.cat == "op" and event.args:
                avg.compiled_calls += event.args.get("kernel") == "compiled"
        return EventList(groups.values(), profile_memory=self.profile_memory, shapes=group_by_input_shape,
                         stack=group_by_stack_n > 0)  # fmt: skip

    def export_chrome_trace(self, path: str | os.PathLike) -> None:
        """Write the events as Chrome trace JSON (complete ``"X"`` events, microseconds), which
        chrome://tracing and Perfetto open."""
        pid = os.getpid()
        threads: dict[int, int] = {}
        trace = []
        for e in self.events():
            tid = threads.setdefault(e.tid, len(threads))
            args: dict = {"bytes": e.nbytes}
            if self.profile_memory:
                args["allocated bytes"] = e.allocated
            if e.shapes:
                args["Input Dims"] = [list(s) for s in e.shapes]
            if e.stack:
                args["Call stack"] = ";".join(e.stack)
            args.update(e.args or {})
            trace.append({"name": e.name, "cat": e.cat, "ph": "X", "ts": (e.start - self._start_ns) / 1e3,
                          "dur": (e.end - e.start) / 1e3, "pid": pid, "tid": tid, "args": args})  # fmt: skip
        names = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": t, "args": {"name": f"thread {ident}"}}
                 for ident, t in threads.items()]  # fmt: skip
        with open(path, "w") as f:
            json.dump({"traceEvents": trace + names, "displayTimeUnit": "ms"}, f)


def _self_times(events: list[Event]) -> list[tuple[Event, tuple[int, int, int]]]:
    """Per event (sorted by start): its time less that of the events directly inside it (of its
    thread, starting and ending within it), and the bytes moved and allocated by it and every
    event inside it."""
    result: dict[int, list] = {}
    stacks: dict[int, list[Event]] = {}
    for event in events:
        stack = stacks.setdefault(event.tid, [])
        while stack and stack[-1].end <= event.start:
            stack.pop()
        while stack and event.end > stack[-1].end:  # overlaps without nesting: not inside it
            stack.pop()
        result[id(event)] = [event, event.end - event.start, event.nbytes, event.allocated]
        if stack:
            result[id(stack[-1])][1] -= event.end - event.start
        for outer in stack:
            entry = result[id(outer)]
            entry[2] += event.nbytes
            entry[3] += event.allocated
        stack.append(event)
    return [(e, (max(t, 0), moved, allocated)) for e, t, moved, allocated in result.values()]


@dataclass
class EventAverage:
    """The events of one name (and shape/stack group): times in microseconds, as torch's; ``bytes``
    (read and written) and ``cpu_memory_usage`` (allocated) count the events inside them too,
    ``self_cpu_memory_usage`` only their own."""

    key: str
    count: int = 0
    cpu_time_total: float = 0.0
    self_cpu_time_total: float = 0.0
    bytes: int = 0
    cpu_memory_usage: int = 0
    self_cpu_memory_usage: int = 0
    input_shapes: tuple = ()
    stack: tuple = ()
    compiled_calls: int = 0  # eager ops that ran kiln's compiled kernel (the others ran numpy)
    is_op: bool = False  # an eager op's events (they say which kernel ran)

    @property
    def kernel(self) -> str:
        """Which kernel ran an eager op's calls: ``compiled``, ``numpy``, ``compiled 3/5`` when both;
        ``-`` for other events."""
        if not self.is_op:
            return "-"
        if self.compiled_calls in (0, self.count):
            return "compiled" if self.compiled_calls else "numpy"
        return f"compiled {self.compiled_calls}/{self.count}"

    @property
    def cpu_time(self) -> float:
        """Average time per call (microseconds)."""
        return self.cpu_time_total / self.count if self.count else 0.0


_SORT_KEYS = ("self_cpu_time_total", "cpu_time_total", "cpu_time", "count", "bytes", "cpu_memory_usage",
              "self_cpu_memory_usage")  # fmt: skip


@dataclass
class EventList:
    """``key_averages()``'s result: a list of ``EventAverage`` with ``table()``."""

    items: Iterable[EventAverage]
    profile_memory: bool = False
    shapes: bool = False
    stack: bool = False
    averages: list[EventAverage] = field(init=False)

    def __post_init__(self) -> None:
        self.averages = list(self.items)

    def __iter__(self):
        return iter(self.averages)

    def __len__(self) -> int:
        return len(self.averages)

    def __getitem__(self, i):
        return self.averages[i]

    def table(self, sort_by: str | None = None, row_limit: int = 100, max_name_column_width: int = 55) -> str:
        """A text table like torch's: name, self and total time with percentages, average, bytes
        moved (and allocated with ``profile_memory``), calls, which kernel ran each eager op; sorted by ``sort_by`` (descending)."""
        if sort_by is not None and sort_by not in _SORT_KEYS:
            raise ValueError(f"table: sort_by must be one of {', '.join(_SORT_KEYS)}; got {sort_by!r}")
        rows = sorted(self.averages, key=lambda a: -getattr(a, sort_by)) if sort_by else list(self.averages)
        if row_limit is not None and row_limit >= 0:
            rows = rows[:row_limit]
        total = sum(a.self_cpu_time_total for a in self.averages) or 1.0
        header = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "Bytes moved"]
        if self.profile_memory:
            header += ["CPU Mem", "Self CPU Mem"]
        header.append("# of Calls")
        kernels = any(a.is_op for a in rows)
        if kernels:
            header.append("Kernel")
        if self.shapes:
            header.append("Input Shapes")
        if self.stack:
            header.append("Source Location")
        body = []
        for a in rows:
            row = [_clip(a.key, max_name_column_width), f"{100 * a.self_cpu_time_total / total:.2f}%",
                   _time(a.self_cpu_time_total), f"{100 * a.cpu_time_total / total:.2f}%", _time(a.cpu_time_total),
                   _time(a.cpu_time), _bytes(a.bytes)]  # fmt: skip
            if self.profile_memory:
                row += [_bytes(a.cpu_memory_usage), _bytes(a.self_cpu_memory_usage)]
            row.append(str(a.count))
            if kernels:
                row.append(a.kernel)
            if self.shapes:
                row.append(str([list(s) for s in a.input_shapes]))
            if self.stack:
                row.append(a.stack[0] if a.stack else "")
            body.append(row)
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
        rule = "-" * (sum(widths) + 2 * (len(widths) - 1))

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

        out = [rule, line(header), rule, *map(line, body), rule, f"Self CPU time total: {_time(total)}"]
        return "\n".join(out) + "\n"

    def __str__(self) -> str:
        return self.table()


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _bytes(n: int) -> str:
    for unit, size in (("Gb", 1 << 30), ("Mb", 1 << 20), ("Kb", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} b"


class record_function:  # noqa: N801 - torch.profiler.record_function's name
    """Mark a range of user code with ``name`` in the profile: a context manager or a decorator.
    Free when no profile records."""

    def __init__(self, name: str, args: str | None = None) -> None:
        self.name, self.args = name, args
        self._start = 0

    def __enter__(self) -> record_function:
        self._start = profiling.clock()
        return self

    def __exit__(self, *exc) -> None:
        rec = profiling.recorder
        if rec is not None and profiling.active:
            stack = profiling.user_stack() if rec.with_stack else ()
            info = {"args": self.args} if self.args is not None else {}
            rec.recorded.append((self.name, "user", self._start, profiling.clock(), threading.get_ident(), 0, 0, (),
                                 stack, info))  # fmt: skip

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with record_function(self.name, self.args):
                return fn(*args, **kwargs)

        return wrapper
