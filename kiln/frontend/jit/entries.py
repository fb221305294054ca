"""What a compiled function keeps per call key (``call_cache.CompiledFunction``): its specializations,
the keys whose calls run eagerly (a stopped trace, a compile in the background), and its history."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .outcomes import TraceBreak


@dataclass
class EagerEntry:
    """A key whose trace stopped: such calls run eagerly."""

    reason: TraceBreak
    key: tuple = ()


@dataclass(eq=False)
class PendingEntry:
    """A key whose program compiles in the background: such calls run eagerly until it is ready."""

    key: tuple
    reason: str  # why it was traced (a "compiled" event's words once ready)
    nodes: int  # traced nodes
    started: float = field(default_factory=time.perf_counter)
    job: Any = None  # the background.Job
    source: Any = None  # the traced graph a call at other sizes is compared with (dynamic.py), if known
    pending: Any = None  # the PendingSpecialization compiling
    ready: bool = False  # its program is in place of this entry: the calls that ran eagerly are done with
    note: str = ""  # what the "compiled" event adds to ``reason`` (its dynamic sizes, or why they stay static)
    dynamic: list | None = None  # a dynamic program's (argument, dim) pairs: ``key`` holds their size classes
    size_guards: list = field(default_factory=list)  # a dynamic program's (``dynamic.dynamic_key``)

    @property
    def sizes_source(self) -> Any:
        """``source``, or once the background compile has partitioned a call whose results need
        gradients outside it, its (forward, backward) graphs (``PendingSpecialization.sizes_source``)."""
        if self.source is not None or self.pending is None:
            return self.source
        return self.pending.sizes_source


_NOT_COMPILED = (EagerEntry, PendingEntry)  # a tuple: isinstance on it takes half the time a union takes


@dataclass
class Event:
    """One entry of a compiled function's history (shown by ``kiln.explain``)."""

    kind: str  # "compiled" | "break" | "not cached" | "recompile limit"
    detail: str


@dataclass
class CompileState:
    specializations: list = field(default_factory=list)
    cache: dict = field(default_factory=dict)  # key -> list of Specialization | EagerEntry
    events: list[Event] = field(default_factory=list)
    logged: set = field(default_factory=set)
    last_key: tuple | None = None
    numpy_shadows: dict = field(default_factory=dict)  # id(array) -> (array, tensor on it): see Trace.on_numpy
    escapes_survived_young_collection: bool = False  # see build_specialization
    state_changes: dict = field(default_factory=dict)  # key -> calls whose trace stopped on a Python state change
    pending: list = field(default_factory=list)  # PendingEntry per compile running in the background
    background_error: BaseException | None = None  # raised at the next call under KILN_JIT_STRICT=1
    dynamic: dict = field(default_factory=dict)  # argument structure -> {leaf position: its dynamic dims}
    not_dynamic: dict = field(default_factory=dict)  # argument structure -> why its sizes stay static
    deferred: list = field(default_factory=list)  # traces kept, not compiled, until another size comes
    dynamic_floats: dict = field(default_factory=dict)  # argument structure -> float positions read at any value
    static_floats: dict = field(default_factory=dict)  # argument structure -> why its floats stay keyed by value
    # floats held in Python state (state_floats.py): (id of the dict or list, key) -> why it stays guarded by
    # value; and -> (the dict or list, the 0-d tensor a program reads it through)
    static_slots: dict = field(default_factory=dict)
    float_holders: dict = field(default_factory=dict)


def _match(entries, fn_globals: dict | None, closure_values: dict, leaves: list):
    """The first entry of a key that applies now (an ``EagerEntry``, a ``PendingEntry`` or a matching
    specialization)."""
    for entry in entries:
        if isinstance(entry, EagerEntry | PendingEntry) or entry.state_miss(fn_globals, closure_values, leaves) is None:
            return entry
    return None
