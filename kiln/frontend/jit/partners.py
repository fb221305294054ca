"""How a call that misses becomes a program for more than its own values: ``CompiledFunction``'s partners.

A miss that differs from an earlier trace only in some values is traced *watched* and compared with
that earlier trace; when the two agree, the new specialization serves every value there:

- sizes of a dimension (``dynamic.py``, ``watched_sizes.py``): a symbolic size;
- float arguments (``scalar_args.py``): a 0-d input read at each call;
- floats held in Python state, an attribute or a dict's entry (``state_floats.py``): the same, filled
  from the entry before each call, its guard accepting any float.

``CompiledFunction`` (``call_cache.py``) inherits these; ``_trace`` asks them which partner a miss has and,
after the trace, what the new specialization's key or guards become.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import float_guards, scalar_args, state_floats
from .backward import ConsumedPlan
from .build import PendingSpecialization
from .dynamic import sizes_differ
from .entries import CompileState
from .keys import call_key, dynamic_key
from .specialization import PythonRead, Specialization
from .trace import Trace
from .watched_sizes import sizes_to_watch

if TYPE_CHECKING:
    from ...compiler.options import CompileOptions

_NONE: frozenset[int] = frozenset()
logger = logging.getLogger("kiln")


class Partners:
    """``CompiledFunction``'s watched traces (it holds ``state``, ``options``, ``_globals`` and ``_cells``)."""

    if TYPE_CHECKING:  # CompiledFunction's
        state: CompileState
        options: CompileOptions
        _globals: dict | None

        def _cells(self) -> dict: ...

    def _by_value(self, key: tuple, leaves: list):
        """The entries of ``key`` with its floats keyed by value, looked up once those of ``key`` missed."""
        yield from self.state.cache.get(scalar_args.by_value(key, leaves), ())

    # ------------------------------------------------------------------ float arguments (scalar_args.py)
    def _scalar_partner(self, key: tuple, leaves: list, sizes_partner) -> tuple | None:
        """``(spec, positions)`` when this call missed only on the values of float arguments that an
        earlier specialization read as inputs (then they are traced watched); None otherwise."""
        if sizes_partner is not None or self.options.dynamic is False:
            return None
        earlier = [*reversed(self.state.specializations), *(e.pending for e in reversed(self.state.pending))]
        return scalar_args.partner([e for e in earlier if e is not None], key, self.state.static_floats)

    def _floats_decided(self, spec, trace: Trace, floats: tuple, key: tuple, leaves: list) -> tuple[tuple, str]:
        """The key a trace of watched floats (``floats``: its partner and their positions) is cached under:
        with those floats read at any value when its program is its partner's, else its own (and the
        call structure's floats stay keyed by value, ``static_floats`` saying why); and the note for
        its reason."""
        other, positions = floats
        always = _always_by_value(spec, trace)
        mine, theirs = spec.scalar_program, other.scalar_program
        why = always or _split(trace)
        why = why or (scalar_args.same_program(theirs, mine) if mine and theirs else "its program was not kept")
        # The key makes every float of the structure that is dynamic dynamic here too: one this trace did
        # not watch (the same value as its partner's) had the numbers computed from it read as constants.
        unwatched = sorted(self.state.dynamic_floats.get(key[0], _NONE) - set(positions))
        if why is None and unwatched:
            names = ", ".join(f"argument {p}" for p in unwatched)
            why = f"{names} read at one value by this trace (its next value traces it watched)"
        where = ", ".join(f"argument {p}" for p in positions)
        if why is not None:
            if always is not None:  # so at every value: not tried again
                self.state.static_floats[key[0]] = why
            return key, f"; the floats of {where} stay keyed by value: {why}"
        found = self.state.dynamic_floats[key[0]] = self.state.dynamic_floats.get(key[0], _NONE) | set(positions)
        spec.key = call_key(key[0], leaves, self.state.dynamic.get(key[0]), found)
        return spec.key, f"; {where}: a float read at each call (one program for every value)"

    # ------------------------------------------------------------------ dynamic sizes (dynamic.py)
    def _dynamic_partner(self, key: tuple, leaves: list):
        """How this call's trace becomes a dynamic specialization: ``("compare", graph, pairs,
        positions)`` with an earlier trace whose key differs only in sizes >= 2 (``positions``: the
        ``(leaf, dim)`` of each, ``pairs``: its size then and now), ``("defer",)`` to keep the trace
        until another size comes (``dynamic=True``, ``mark_dynamic``), or None."""
        if self.options.dynamic is False or key[0] in self.state.not_dynamic:
            return None
        # the traces kept for another size, those compiling in the background, then the compiled ones
        earlier = [*reversed(self.state.deferred), *reversed(self.state.pending), *reversed(self.state.specializations)]
        for other in earlier:
            positions = sizes_differ(other.key, key)
            source = getattr(other, "sizes_source", None)
            if positions is not None and source is not None:
                pairs = [(other.key[1][p][1][d], key[1][p][1][d]) for p, d in positions]
                return ("compare", source, pairs, positions)
            if positions is not None and getattr(other, "not_dynamic", None):  # say why it stays static
                return ("static", other.not_dynamic)
        if any(other.key == key for other in earlier):
            return None
        if sizes_to_watch(leaves, ("defer",), self.options.dynamic is True):
            return ("defer",)
        return None

    def _dynamic_key(self, spec, key: tuple, leaves: list) -> tuple[tuple, str]:
        """The key a new specialization is cached under (with its dynamic sizes as size classes when
        it is dynamic, ``spec.dynamic``), and what to add to its reason for ``kiln.explain``."""
        if spec.dynamic is None:
            if spec.not_dynamic is None:
                return key, ""
            self.state.not_dynamic[key[0]] = spec.not_dynamic  # not tried again: later sizes specialize
            return key, f"; its sizes stay static: {spec.not_dynamic}"
        return dynamic_key(self.state.dynamic, key, spec, leaves, self.state.dynamic_floats.get(key[0], _NONE))

    # ------------------------------------------------------------------ floats in Python state (state_floats.py)
    def _state_float_partner(self, key: tuple, leaves: list, floats: tuple | None) -> tuple | None:
        """``(changes, partner)`` when this call misses the specializations of its key only because entries
        of Python state hold other floats (``partner``: the latest that read the same entries watched,
        whose program the new trace's must match; None for the first such trace); None otherwise.
        ``floats``: the float arguments' partner (``_scalar_partner``), when there is one: the entries are
        compared with it alone, since the new program is compared with its program."""
        if self.options.dynamic is False:
            return None
        cells = self._cells()
        # (the arguments' partner may still be compiling in the background: its Python state is compared)
        candidates = reversed(self.state.cache.get(key, ())) if floats is None else [floats[0]]
        for entry in candidates:
            if not isinstance(entry, Specialization | PendingSpecialization):
                continue
            try:
                changes = state_floats.changed(entry, self._globals, cells, leaves)
            except Exception:  # noqa: BLE001 - an object's own == that raises: no partner (the trace is static)
                logger.debug("kiln.compile: floats of state not compared", exc_info=True)
                continue
            if changes is None or any(change.slot in self.state.static_slots for change in changes):
                continue
            slots = frozenset(change.slot for change in changes)
            return changes, (entry if entry.state_float_slots == slots and entry.scalar_program is not None else None)
        return None

    def _float_guards(self, spec, trace: Trace, watched: dict, installed: list) -> None:
        """The watched trace's comparisons of its floats as the new specialization's guards
        (``float_guards.py``; its floats stay keyed by value where one cannot be computed again)."""
        if not trace.scalar_guards:
            return
        roots: dict[int, tuple] = {id(number): ("arg", position) for position, number in watched.items()}
        roots.update((id(number), ("entry", change.table, change.key, change.name)) for change, number in installed)
        found = float_guards.guards(trace.scalar_guards, roots)
        if found is None:
            trace.scalar_compared = trace.scalar_compared or "a comparison of it that kiln cannot compute again"
            return
        spec.value_guards = found
        spec.python_reads.extend(PythonRead(f"{guard} is {guard.result} ({guard.where})", "guard") for guard in found)

    def _state_floats_decided(self, spec, trace: Trace, found: tuple) -> tuple[str, bool]:
        """After a watched trace of floats in Python state (``found``: the changes and the partner): make
        the new specialization's guards accept any float there when its program is its partner's. The
        note for its reason, and whether it now serves any float there."""
        changes, other = found
        names = state_floats.names(changes)
        spec.state_float_slots = frozenset(change.slot for change in changes)
        holders = self.state.float_holders  # (kiln.explain names the tensors they are read through)
        spec.state_float_names = {id(holders[change.slot][1]): change.name for change in changes}
        why = _always_by_value(spec, trace)
        if why is not None:  # so at every value: not watched again
            self.state.static_slots.update(dict.fromkeys(spec.state_float_slots, why))
            return f"; {names} stay guarded by value: {why}", False
        why = _split(trace)
        if why is not None:
            return f"; {names} stay guarded by value: {why}", False
        if other is None:
            return f"; {names} read at each call (another value decides whether one program serves every value)", False
        why = scalar_args.same_program(other.scalar_program, spec.scalar_program) if spec.scalar_program else None
        if why is not None:
            return f"; {names} stay guarded by value: {why}", False
        state_floats.relax(spec, changes, self._globals)
        spec.python_reads[:] = _inputs_now(spec.python_reads, changes)
        return f"; {names}: a float read at each call (one program for every value)", True


def _always_by_value(spec, trace: Trace) -> str | None:
    """Why a watched trace's floats stay keyed or guarded by value at every value, or None: Python used
    the value (a branch, a conversion, a number the same at both values), or a backward run after the
    call would read them as traced (a consumed one never runs)."""
    if trace.scalar_compared is not None:
        return f"Python uses its value ({trace.scalar_compared})"
    if spec.backward is not None and not isinstance(spec.backward, ConsumedPlan):
        return "the results need gradients outside the call"
    return None


def _split(trace: Trace) -> str | None:
    """Why this watched trace's floats stay keyed by value this time: a comparison of them came out
    otherwise at the earlier trace's values (a later pair of values may agree)."""
    if trace.scalar_split is None:
        return None
    return f"a comparison of it ({trace.scalar_split}) comes out otherwise at the other value"


def _inputs_now(records: list[PythonRead], changes: list) -> list[PythonRead]:
    """``kiln.explain``'s records with the guards of the entries ``changes`` names made inputs."""
    names = {f"{change.name} == " for change in changes}
    out = [r for r in records if not any(r.what.startswith(n) for n in names)]
    out += [PythonRead(f"{change.name}: any float", "input") for change in changes]
    return out
