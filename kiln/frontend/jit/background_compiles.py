"""Compiling in the background (``CompileOptions(wait=False)``): what a pending compile puts in
a compiled function's cache, and what its outcome replaces there (``CompiledFunction`` inherits it).

A traced call caches a ``PendingEntry`` (its calls run eagerly, ``call_cache.py``) and hands the
compile to the pool (``background.py``). A trace at a second size of a dimension decides first, on
the caller's thread, whether its program is dynamic (``PendingSpecialization.decide``: the graphs
compared, nothing lowered), so that its entry is cached under the dynamic key: every size the
program will serve runs eagerly until it is ready, and none traces again. The call no longer waits
for the lowering (before: 3.0-5.0 s for the CNN's ragged batch, cold cache, loaded 2-core machine;
now 0.12-0.61 s, the trace and ``decide``). A program that comes out static after all (a backend
that lowers its backward per size) serves its own call key alone, and the dims only it made
dynamic are static again, so later sizes trace as they would have.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from typing import TYPE_CHECKING

from . import background
from .build import PendingSpecialization
from .entries import CompileState, EagerEntry, PendingEntry
from .keys import dynamic_key
from .locations import user_frame
from .outcomes import TraceBreak


class BackgroundCompiles:
    """``CompiledFunction``'s compiles in the background (it holds ``state``, ``_install_lock``,
    ``_dynamic_key``, ``_event``, ``_log_once``, ``_slow_compile_notice`` and ``_name``)."""

    if TYPE_CHECKING:  # CompiledFunction's
        state: CompileState
        _install_lock: threading.Lock

        def _dynamic_key(self, spec, key: tuple, leaves: list) -> tuple[tuple, str]: ...
        def _event(self, kind: str, detail: str, once: bool = False) -> None: ...
        def _log_once(self, key, message: str, where: tuple | None = None) -> None: ...
        def _slow_compile_notice(self, nodes: int, where: tuple, background: bool = False) -> threading.Timer: ...
        def _name(self) -> str: ...

    def _compile_in_background(self, pending: PendingSpecialization, key, leaves: list, reason: str,
                               first: bool = False) -> None:  # fmt: skip
        """Cache a ``PendingEntry`` (its calls run eagerly) and hand the compile to the pool. A trace at
        a second size is decided on this thread (``_pending_key``): its entry is cached under the
        dynamic key, so calls at every size it will serve run eagerly meanwhile and trace no more.
        ``first``: the entry goes before the key's others (it serves any value of a float in Python
        state, they one value each)."""
        key, note, dims = self._pending_key(pending, key, leaves)
        entry = PendingEntry(key, reason, pending.nodes, source=pending.sizes_source, pending=pending, note=note)
        entry.dynamic, entry.size_guards = dims
        where = user_frame(sys._getframe(2))
        with self._install_lock:
            self.state.pending.append(entry)
            entries = self.state.cache.setdefault(key, [])
            entries.insert(0 if first else len(entries), entry)
        notice = self._slow_compile_notice(entry.nodes, where, background=True)  # from the trace: the calls wait
        entry.job = background.submit(lambda: self._finish_background(pending, entry, where, notice))

    def _pending_key(self, pending: PendingSpecialization, key, leaves: list) -> tuple[tuple, str, tuple]:
        """``_dynamic_key`` for a trace not compiled yet: the key, the note for its reason and (the
        dynamic (argument, dim) pairs, the size guards) when it is dynamic (else ``(None, [])``).
        ``decide`` runs here, on the caller's thread: the partition and the graphs' comparison."""
        if pending.dynamic is None or pending.dynamic[0] == "defer":
            return key, "", (None, [])
        try:
            decision = pending.decide()
        except Exception:  # noqa: BLE001 - the compile raises it again, and says it, in the background
            return key, "", (None, [])
        if decision.symbolic is None:
            stand_in = types.SimpleNamespace(dynamic=None, not_dynamic=decision.not_dynamic)
            return (*self._dynamic_key(stand_in, key, leaves), (None, []))
        stand_in = types.SimpleNamespace(dynamic=pending.dynamic[3], key=key, size_guards=list(decision.size_guards))
        with self._install_lock:  # the dims of every dynamic key of this call tree, as the settling reads them
            dynamic, note = dynamic_key(self.state.dynamic, key, stand_in, leaves)
        return dynamic, note, (stand_in.dynamic, stand_in.size_guards)

    def _finish_background(self, pending: PendingSpecialization, entry: PendingEntry, where, notice) -> None:
        """On a compile thread: compile, then put the specialization in place of ``entry``; a compile
        that raises leaves its key running eagerly, saying why."""
        try:
            spec = pending.compile()
        except Exception as error:  # noqa: BLE001 - said, and raised at the next call under KILN_JIT_STRICT=1
            why = TraceBreak(f"the compile failed in the background ({type(error).__name__}: {error})", None)
            if entry.dynamic is not None:  # its sizes stay static: each traces again, as a static program
                self._settle_static(entry, None, str(why))
            else:
                self._settle(entry, EagerEntry(why, entry.key))
            self._event("break", str(why), once=False)
            self._log_once(("break", str(why)), f"running eagerly: {why}", where)
            if os.environ.get("KILN_JIT_STRICT") == "1":
                self.state.background_error = error
            return
        finally:
            notice.cancel()
        spec.background_seconds = time.perf_counter() - entry.started
        if entry.dynamic is not None and spec.dynamic is None:  # static after all (its backward's lowering)
            number = self._settle_static(entry, spec, spec.not_dynamic)
            entry.ready = True
            self._event(
                "compiled", f"specialization {number}: {entry.reason}; its sizes stay static: {spec.not_dynamic}"
            )
            return
        if entry.dynamic is not None:  # the key and guards ``_pending_key`` gave it
            spec.key, spec.size_guards = entry.key, entry.size_guards
        number = self._settle(entry, spec)
        entry.ready = True
        self._event("compiled", f"specialization {number}: {entry.reason}{entry.note}")

    def _settle(self, entry: PendingEntry, outcome) -> int:
        """Put ``outcome`` (a Specialization or an EagerEntry) in ``entry``'s place; the number of
        specializations then."""
        with self._install_lock:
            entries = self.state.cache.get(entry.key, [])
            position = next((i for i, e in enumerate(entries) if e is entry), None)
            if isinstance(outcome, EagerEntry) or position is None:
                if position is not None:
                    entries[position] = outcome
            else:
                self.state.specializations.append(outcome)
                entries[position] = outcome  # one store: a racing call sees the entry or the specialization
            self.state.pending.remove(entry)
            return len(self.state.specializations)

    def _settle_static(self, entry: PendingEntry, spec, why: str | None) -> int:
        """A dynamic ``entry`` that came out static (``spec``, or None when its compile failed): its sizes
        stay static from now on (``state.not_dynamic``), ``spec`` serves its own call key, and the
        dynamic key goes, with the dims only it made dynamic: the sizes it ran eagerly trace again."""
        tree = entry.key[0]
        with self._install_lock:
            self.state.not_dynamic[tree] = why
            if spec is not None:
                self.state.specializations.append(spec)
                self.state.cache.setdefault(spec.key, []).append(spec)
            entries = self.state.cache.get(entry.key, [])
            if entry in entries:
                entries.remove(entry)
                if not entries:
                    del self.state.cache[entry.key]
            self.state.pending.remove(entry)
            dims: dict = {}  # those of the dynamic programs and entries left
            for other in [*self.state.specializations, *self.state.pending]:
                if other.key[0] == tree and other.dynamic:
                    for p, d in other.dynamic:
                        dims[p] = tuple(sorted({*dims.get(p, ()), d}))
            if dims:
                self.state.dynamic[tree] = dims
            else:
                self.state.dynamic.pop(tree, None)
            return len(self.state.specializations)

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait for this function's compiles running in the background; whether they all finished
        within ``timeout`` seconds (None: as long as they take). Under ``KILN_JIT_STRICT=1`` a
        compile that failed raises here.

        >>> import kiln
        >>> f = kiln.compile(lambda x: x * 2)
        >>> _ = f(kiln.ones(3))
        >>> f.wait_compiled()
        True
        """
        done = background.wait([e.job for e in list(self.state.pending) if e.job is not None], timeout)
        if self.state.background_error is not None:
            self._raise_background_error()
        return done

    def _raise_background_error(self) -> None:
        error, self.state.background_error = self.state.background_error, None
        raise RuntimeError(f"kiln.compile({self._name()}): a compile failed in the background") from error
