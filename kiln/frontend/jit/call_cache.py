"""``kiln.compile``: trace on the first call of each specialization, run the compiled program after.

Per call (DESIGN.md, "Tracing and compile"):

1. the **key**: the arguments' structure, each tensor's shape, strides, dtype, device,
   requires_grad, whether ``.grad`` is set and its hooks, which arguments share memory, plain arguments by
   type and value (other objects by identity), and the grad mode;
2. each specialization cached under that key also checks the **captured state** it was traced
   with: captured tensors alive and unchanged in shape/dtype/requires_grad/``.grad`` presence/hooks,
   module ``training`` flags, the objects the function's globals and closure name, and the Python
   values held in the containers and objects it reached from them (``guards.py``);
3. on a miss the call is **traced while it runs eagerly** (its result is the eager result), the
   pass pipeline runs, and the specialization is cached; at most ``recompile_limit`` per
   function, after which unmatched calls run eagerly and say why.

The pass pipeline, code generation and loading run **in the background** by default
(``background.py``): the traced call returns its eager result at once, calls of that key run
eagerly until the program is ready, then run it. So decorating a function never makes a run
slower than eager (PyTorch users expect that of ``torch.compile``). ``CompileOptions(wait=True)``,
``kiln.compile(fn, wait=True)`` or ``KILN_COMPILE_WAIT=1`` compile before the traced call returns
(benchmarks, the test suite); ``fn.wait_compiled()`` and ``kiln.jit.wait_compiled()`` wait for
pending compiles. A compile that fails in the background leaves its key running eagerly, with
the reason said (``kiln.explain`` lists it; ``KILN_JIT_STRICT=1`` raises it at the next call).

A trace that stops (``.item()``, a data-dependent shape...) leaves that key running eagerly, with
the reason logged once; ``fullgraph=True`` raises instead. ``KILN_JIT=0`` makes every compiled
function plain eager code.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any

from ...compiler import program_worker
from ...compiler.options import CompileOptions
from ...runtime import profiling
from .. import eager_kernels
from ..tensor import Tensor
from . import hazards, numpy_inputs, reads, scalar_args, snapshots, state, state_floats
from .background_compiles import BackgroundCompiles
from .build import PendingSpecialization, build_specialization, trace_specialization
from .dynamic import Pending
from .entries import _NOT_COMPILED, CompileState, EagerEntry, Event, PendingEntry, _match
from .guards import build_guards
from .keys import call_key, changed_ints, describe_key_change
from .locations import user_frame as _user_frame
from .outcomes import CompileWarning, TraceBreak, TraceBreakError
from .partners import Partners
from .pytree import flatten_call
from .trace import Trace
from .watched_sizes import sizes_to_watch, with_shadows

logger = logging.getLogger("kiln")

_NONE: frozenset[int] = frozenset()


#: How long the compile after a trace runs before kiln says it is compiling (a CompileWarning).
SLOW_COMPILE_SECONDS = 1.0
#: Every compiled function alive (``kiln.compiler.reset`` forgets what each has compiled).
LIVE: weakref.WeakSet = weakref.WeakSet()


#: Traces of one call key that may stop on a change of Python state before its calls run eagerly for
#: good (see CompiledFunction._changes_once_more): two, since a first call that initializes lazily
#: may be followed by one that creates optimizer state.
STATE_CHANGE_RETRIES = 2


class CompiledFunction(BackgroundCompiles, Partners):
    """What ``kiln.compile(fn)`` returns: call it like ``fn``."""

    def __init__(self, fn, *, fullgraph: bool = False, check: bool = False, options: CompileOptions | None = None,
                 guard_code=None, name: str | None = None):  # fmt: skip
        if not callable(fn):
            raise TypeError(f"kiln.compile expected a function, method or nn.Module, got {type(fn).__name__}")
        if options is not None and not isinstance(options, CompileOptions):
            raise TypeError(f"kiln.compile: options must be a kiln.CompileOptions, got {type(options).__name__}")
        self.fn = fn
        self.fullgraph = fullgraph
        self.check = check
        self.options = options or CompileOptions()
        self.state = CompileState()
        self.enabled = os.environ.get("KILN_JIT", "1") != "0"
        if self.enabled and not self.options.wait:  # its process imports kiln meanwhile (~0.25 s)
            program_worker.start_soon()
        code_fn = guard_code or getattr(fn, "__func__", fn)  # whose globals and closure are guarded
        self._globals = getattr(code_fn, "__globals__", None)
        self._code = getattr(code_fn, "__code__", None)
        self._closure = getattr(code_fn, "__closure__", None)
        self._lock = threading.RLock()  # held while a miss traces (see _compile_miss)
        self._install_lock = threading.Lock()  # held while a background compile's outcome enters the cache
        functools.update_wrapper(self, fn, updated=())
        self._display_name = name  # what messages call it (a module's class: its calls run ``_call_impl``)
        LIVE.add(self)

    def reset(self) -> None:
        """Forget every specialization, trace and reason (``torch.compiler.reset``): the next call
        traces again. The compiles running in the background are waited for first: each settles into
        the state it started from, which must still be this function's."""
        self.wait_compiled()
        with self._lock, self._install_lock:
            self.state = CompileState()

    def __get__(self, obj, objtype=None):
        """``@kiln.compile`` on a method: bind like a function, sharing this cache."""
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    @property
    def graph(self):
        """The IR of the most recent specialization (after the passes)."""
        specs = self.state.specializations
        return specs[-1].graph if specs else None

    # ------------------------------------------------------------------ calling
    def __call__(self, *args, **kwargs):
        if not self.enabled or state.current.get() is not None:
            return self.fn(*args, **kwargs)  # disabled, or inside another trace: trace through
        leaves, tree = flatten_call(args, kwargs)
        dynamic = self.state.dynamic.get(tree) if self.state.dynamic else None
        closure_values = self._closure_values()
        if dynamic is not None:  # a static program runs the sizes it was made for: never slower than a dynamic one
            for entry in self.state.cache.get(call_key(tree, leaves), ()):
                if (
                    not isinstance(entry, _NOT_COMPILED)
                    and entry.state_miss(self._globals, closure_values, leaves) is None
                ):
                    return self._run_compiled(entry, args, kwargs, leaves)
        floats = self.state.dynamic_floats.get(tree, _NONE)
        key = call_key(tree, leaves, dynamic, floats)
        miss = "first call"
        while True:
            # (with dynamic floats, a miss looks up the programs traced at their values too: by_value)
            for entry in itertools.chain(self.state.cache.get(key, ()), self._by_value(key, leaves) if floats else ()):
                if isinstance(entry, _NOT_COMPILED):  # eagerly (a PendingEntry: until its program is ready)
                    if self.state.background_error is not None:
                        self._raise_background_error()
                    if isinstance(entry, EagerEntry):
                        self._log_once(
                            ("break", str(entry.reason)), f"running eagerly: the trace stopped: {entry.reason}"
                        )
                        return self.fn(*args, **kwargs)
                    return self._run_pending(entry, args, kwargs)
                miss = entry.state_miss(self._globals, closure_values, leaves)
                if miss is None:
                    return self._run_compiled(entry, args, kwargs, leaves)
            if dynamic is None:
                break
            # A call the dynamic programs do not serve (a size guard, changed state) looks up, and
            # traces under, its own sizes: a static program must never serve other sizes.
            dynamic, key = None, call_key(tree, leaves, None, floats)
        return self._compile_miss(args, kwargs, leaves, key, miss, closure_values)

    def _run_pending(self, entry: PendingEntry, args, kwargs):
        """A call of a key whose program compiles in the background: eagerly, queueing no eager
        kernels while the program's compile goes first (``background.Job.defers_kernels``), and
        after that none that would compile once the program is ready (``eager_kernels.moot_once``)."""
        if entry.job is not None and entry.job.defers_kernels():
            with eager_kernels.deferred():
                return self.fn(*args, **kwargs)
        with eager_kernels.moot_once(lambda: entry.ready):
            return self.fn(*args, **kwargs)

    def _run_compiled(self, entry, args, kwargs, leaves):
        """Run the compiled specialization ``entry``, whose guards the call passed."""
        if self.check:
            from .check import run_checked  # noqa: PLC0415

            return run_checked(self, entry, args, kwargs, leaves)
        if profiling.active:  # kiln.profiler records the call around its kernels
            return profiling.timed(f"kiln.compile({self._name()})", "compiled", entry.run, leaves)
        return entry.run(leaves)

    def _compile_miss(self, args, kwargs, leaves, key, miss: str, closure_values: dict):
        """A call no specialization matched: trace it, one thread at a time.

        Threads racing on the first call of a key would each trace it (one specialization per
        thread, past the recompile limit). The lock is held only here, never while a compiled
        program runs; a thread that waited looks the key up again and runs what the winner
        compiled. Nested compiled calls trace through without reaching this (``state.current``
        is set); a thread that already holds another compiled function's lock (a call after a
        trace break) never blocks on this one, so two functions cannot deadlock each other.
        """
        if self.state.background_error is not None:
            self._raise_background_error()
        if not _acquire(self._lock):
            self._log_once(("busy",), "another thread is compiling this function; this call runs eagerly")
            return self.fn(*args, **kwargs)
        try:
            found = _match(self.state.cache.get(key, ()), self._globals, closure_values, leaves)
            if found is None:
                return self._trace_new(args, kwargs, leaves, key, miss)
        finally:
            _release(self._lock)
        # Another thread compiled this key (or is compiling it in the background) while this one waited.
        if isinstance(found, PendingEntry):
            return self._run_pending(found, args, kwargs)
        if isinstance(found, EagerEntry):
            return self.fn(*args, **kwargs)
        if self.check:
            from .check import run_checked  # noqa: PLC0415

            return run_checked(self, found, args, kwargs, leaves)
        return found.run(leaves)

    def _trace_new(self, args, kwargs, leaves, key, miss: str):
        """Trace a miss unless the recompile limit is reached (then the call runs eagerly)."""
        if key not in self.state.cache and self.state.last_key is not None:
            changed = describe_key_change(self.state.last_key, key) if key != self.state.last_key else "traced again"
            # (a call the dynamic programs missed says why they did: a size guard, sizes its ops do not take)
            miss = changed if miss == "first call" else f"{changed}; the dynamic program missed: {miss}"
        if len(self.state.specializations) + len(self.state.pending) >= self.options.recompile_limit:
            limit = self.options.recompile_limit
            ints = changed_ints(self.state.last_key, key) if self.state.last_key is not None else []
            hint = (f"; an int argument (argument {ints[0]}) is compiled for each of its values: pass one that "
                    "changes at every call as a 0-d tensor (kiln.tensor(n)), read at each call" if ints else "")  # fmt: skip
            self._event("recompile limit", f"{miss}; the limit of {limit} specializations is reached, so calls that "
                        f"match none of them now run eagerly (CompileOptions(recompile_limit=...) sets it){hint}", once=True)  # fmt: skip
            return self.fn(*args, **kwargs)
        with _collector_paused():
            if profiling.active:
                name = f"kiln.compile({self._name()}): trace and compile"
                return profiling.timed(name, "compile", self._trace, args, kwargs, leaves, key, miss, reason=miss)
            return self._trace(args, kwargs, leaves, key, miss)

    def _trace(self, args, kwargs, leaves, key, reason: str):
        key = scalar_args.by_value(key, leaves)
        closure_values = self._closure_values()
        objects = hazards.watched_objects(self, leaves, closure_values)
        roots = reads.roots(self, args, kwargs, closure_values)
        started = time.perf_counter()
        partner = self._dynamic_partner(key, leaves)
        trace = Trace(fullgraph=self.fullgraph).start()
        trace.numpy_shadows = self.state.numpy_shadows
        if partner is not None:  # Python's reads of the sizes that may become dynamic are watched: with the
            # size each had in the earlier trace (``WatchedSize.shadow``) where there is one
            trace.watched_sizes = (
                with_shadows((new, old) for old, new in partner[2]) if partner[0] == "compare"
                else frozenset(sizes_to_watch(leaves, partner, self.options.dynamic is True))
            )  # fmt: skip
        watch = hazards.Watch(
            objects, leaves, hazards.named_values(self, closure_values), self._code, roots, self.state.numpy_shadows
        )
        floats = self._scalar_partner(key, leaves, partner)
        in_state = None if partner else self._state_float_partner(key, leaves, floats)
        call_args, call_kwargs, watched, installed = args, kwargs, dict[int, float](), []
        stored: list = []
        places = scalar_args.float_places(args, kwargs)
        try:
            if floats is not None:  # the floats whose values alone missed: watched (scalar_args.py)
                shadows = {p: float.fromhex(floats[0].key[1][p][1]) for p in floats[1]}
                call_args, call_kwargs, watched, stored = scalar_args.watched_call(
                    args, kwargs, key[0], shadows, trace, places
                )
            if in_state is not None:  # floats in Python state whose values alone missed (state_floats.py)
                installed = state_floats.install(in_state[0], trace, self.state.float_holders)
            for i, leaf in enumerate(leaves):
                if isinstance(leaf, Tensor) and not trace.is_bound(leaf):  # an argument passed twice is one input
                    trace.add_external(leaf, "arg", i)
                elif type(leaf) is float and i in places:
                    number = watched.get(i, leaf)
                    number_input = scalar_args.number_input(leaf)
                    trace.add_external(number_input, "arg", i)
                    trace.scalar_args[id(number)] = (number, number_input, i)
            watch.start()
            try:
                # A traced call compiles no eager kernels: the program replaces its ops (DCGAN's trace
                # compiled 15, 0.66 s of its 0.72 s, with KILN_EAGER_KERNELS=sync), and in the
                # background its compile goes first (``background.Job.defers_kernels``). A trace
                # records composite ops as their primitives: kernels no eager call would run.
                with eager_kernels.deferred():
                    result = self.fn(*call_args, **call_kwargs)
                if watched or installed:
                    result = scalar_args.unwatched(result)
            finally:
                hazard = watch.stop()
                scalar_args.restore(stored)
                state_floats.restore(installed)
        except BaseException:
            trace.abandon()
            raise
        trace.seconds = time.perf_counter() - started  # the first of the timed stages (build.py)
        self.state.last_key = key
        if hazard is not None and trace.broken is None:
            self._hazard(trace, hazard)
            if self._changes_once_more(key):
                trace.abandon()
                self._event("not cached", f"{hazard}; this call ran eagerly and the next one traces again (a "
                            "change made once, as a lazily made mask or cache is, stops no later call)", once=False)  # fmt: skip
                return result
        if trace.broken is None and trace.new_arrays:
            made = numpy_inputs.made_in_call(trace, self.state.numpy_shadows)
            if made is not None:
                self._hazard(trace, TraceBreak(*made))
        if trace.broken is not None:
            trace.abandon()
            return self._run_eagerly_from_now_on(key, trace.broken, result)
        if self.options.wait:
            notice = self._slow_compile_notice(len(trace.builder.nodes), _user_frame(sys._getframe(1)))
            try:
                spec, why_not = build_specialization(
                    self, trace, result, leaves, key, closure_values=self._closure_values(), dynamic=partner
                )
            finally:
                notice.cancel()
        else:
            spec, why_not = trace_specialization(
                self, trace, result, leaves, key, closure_values=self._closure_values(), dynamic=partner
            )
        if isinstance(why_not, TraceBreak):
            return self._run_eagerly_from_now_on(key, why_not, result)
        if spec is None:
            if isinstance(why_not, Pending):
                self.state.deferred.append(why_not)
            elif not self._changes_once_more(key):  # the same reason at every call: stop tracing them
                return self._run_eagerly_from_now_on(key, TraceBreak(str(why_not), None), result)
            self._event("not cached", str(why_not), once=False)
            return result
        self._guard(spec, trace, watch, objects, leaves, closure_values)
        scalars_note, any_float = "", False
        self._float_guards(spec, trace, watched, installed)
        if floats is not None:
            key, scalars_note = self._floats_decided(spec, trace, floats, key, leaves)
        if in_state is not None:
            state_note, any_float = self._state_floats_decided(spec, trace, in_state)
            scalars_note += state_note
        if isinstance(spec, PendingSpecialization):
            self._compile_in_background(spec, key, leaves, reason + scalars_note, first=any_float)
            return result
        note = scalars_note
        if partner is not None:
            key, note = self._dynamic_key(spec, key, leaves)
        self.state.specializations.append(spec)
        entries = self.state.cache.setdefault(key, [])
        # one serving any float there goes before those keyed at one value each (each miss costs its words)
        entries.insert(0 if any_float else len(entries), spec)
        self._event("compiled", f"specialization {len(self.state.specializations)}: {reason}{note}")
        return result

    def _guard(self, spec, trace: Trace, watch, objects: list, leaves: list, closure_values: dict) -> None:
        """Set a new specialization's guards (``guards.py``) and its table of Python values read."""
        captured = [s.ref() for s in spec.sources if s.kind == "capture"]
        named = [*hazards.named_values(self, closure_values), *leaves]
        # The Python containers the call read, along the attribute names its code loads, from what the
        # function names and from the globals of the other functions that ran: guarded by value.
        attr_names, spelled = reads.attribute_names(watch.codes), watch.read_names()
        owners: dict = {}  # (the object of each of the user's objects' tables reached, for build_guards)
        named_roots = reads.named_roots(self, closure_values, leaves)
        helper_globals = [(g, names) for g, names in watch.globals_read]
        helper_globals += reads.users_modules(named_roots + [(n, g[n]) for g, names in helper_globals for n in names]
                                              + reads.imported(watch.codes), attr_names)  # fmt: skip
        helpers = reads.merged_globals(helper_globals)
        helper_roots = [(f"{module}.{name}", g[name]) for g, module, names in helpers for name in names]
        roots = named_roots + helper_roots + reads.process_state(watch.codes)
        reached = snapshots.not_inputs(reads.reach(roots, attr_names, owners=owners), self.state.numpy_shadows)
        guards = build_guards(objects, spec.modules, captured, named, reached, spelled, owners)
        for g, module, names in helpers:
            guards.add_globals(g, names, module)
        spec.guards = guards if guards.pairs or guards.grad_owners or guards.global_reads or guards.attr_reads else None
        spec.checks = trace.checks  # what kiln.jit.guard was told to check (optimizers' flags)
        spec.python_reads.extend(trace.python_reads)  # what the traced code said it read (Trace.on_python_read)
        spec.python_reads.extend(reads.records(reached, watch.codes, attr_names))
        spec.python_reads.extend(reads.global_records(helper_roots, watch.codes))

    def _slow_compile_notice(self, nodes: int, where: tuple, background: bool = False) -> threading.Timer:
        """A timer that says, once the compile after a trace has taken ``SLOW_COMPILE_SECONDS``, that it
        is compiling (a CompileWarning at the user's call ``where``, from the timer's thread: passes
        release the interpreter between bytecodes, and LLVM runs in the worker, waited for without it)."""
        name = self._name()
        then = ("calls run eagerly until it is ready" if background else
                "this call finishes when it is done, later calls run the compiled program")  # fmt: skip

        def say() -> None:
            text = (f"kiln.compile: compiling {name} ({nodes} nodes)... over {SLOW_COMPILE_SECONDS:g} s "
                    f"so far{' in the background' if background else ''}; {then}")  # fmt: skip
            warnings.warn_explicit(text, CompileWarning, *where)

        timer = threading.Timer(SLOW_COMPILE_SECONDS, say)
        timer.daemon = True
        timer.start()
        return timer

    def _changes_once_more(self, key) -> bool:
        """Whether a trace of ``key`` that stopped on a change of Python state (``self.mask = ...``)
        is retried at the next call: lazy initialization changes state on the first call only, so
        the first ``STATE_CHANGE_RETRIES`` such stops are forgiven; state changed by every call
        (a counter) then runs eagerly for good."""
        seen = self.state.state_changes.get(key, 0)
        self.state.state_changes[key] = seen + 1
        return seen < STATE_CHANGE_RETRIES

    def _run_eagerly_from_now_on(self, key, reason: TraceBreak, result):
        self.state.cache.setdefault(key, []).append(EagerEntry(reason, key))
        self._event("break", str(reason), once=False)
        self._log_once(("break", str(reason)), f"running eagerly: the trace stopped: {reason}")
        return result

    def _hazard(self, trace: Trace, hazard: TraceBreak) -> None:
        """The traced call did something a compiled call would not repeat (see ``hazards.Watch``)."""
        if self.fullgraph:
            trace.abandon()
            raise TraceBreakError(
                f"kiln.compile(fullgraph=True): {hazard}\n"
                "Move that code out of the compiled function, or drop fullgraph=True to run such calls eagerly."
            )
        trace.broken = hazard

    # ------------------------------------------------------------------ guards on globals and closures
    def _closure_values(self) -> dict:
        if not self._closure or self._code is None:
            return {}
        values = {}
        for name, cell in zip(self._code.co_freevars, self._closure, strict=True):
            try:
                values["closure:" + name] = cell.cell_contents
            except ValueError:  # an empty cell
                pass
        return values

    def _cells(self) -> dict:
        """The function's closure cells by ``"closure:" + name`` (as ``_closure_values`` names their values)."""
        if not self._closure or self._code is None:
            return {}
        return {"closure:" + name: cell for name, cell in zip(self._code.co_freevars, self._closure, strict=True)}

    def guarded_names(self, closure_values: dict) -> list[tuple[str, Any]]:
        """The globals and closure variables the function names, with their current objects."""
        guards = []
        if self._code is not None and self._globals is not None:
            for name in _names(self._code):
                if name in self._globals:
                    guards.append((name, self._globals[name]))
        guards.extend(closure_values.items())
        return guards

    # ------------------------------------------------------------------ reporting
    def _event(self, kind: str, detail: str, once: bool = False) -> None:
        if once and any(e.kind == kind and e.detail == detail for e in self.state.events):
            return
        self.state.events.append(Event(kind, detail))
        if kind == "recompile limit":
            self._log_once((kind,), detail)  # once per function: each later miss names another change
        elif kind != "break":  # breaks are logged once per reason by the caller
            logger.info("kiln.compile(%s): %s", self._name(), detail)

    def _log_once(self, key, message: str, where: tuple | None = None) -> None:
        """Say ``message`` once per function and ``key``: to the ``kiln`` logger, and as a
        ``CompileWarning`` at the user's line that called the function (``where``, if given; kiln's
        logger has no handler of its own, so by default only the warning reaches the user, as
        torch.compile's do)."""
        if key in self.state.logged:
            return
        self.state.logged.add(key)
        text = f"kiln.compile({self._name()}): {message}"
        logger.warning("%s", text)
        warnings.warn_explicit(text, CompileWarning, *(where or _user_frame(sys._getframe(1))))

    def _name(self) -> str:
        return self._display_name or getattr(self.fn, "__qualname__", None) or type(self.fn).__name__

    def __repr__(self) -> str:
        return f"<compiled {self._name()}: {len(self.state.specializations)} specialization(s)>"


# ---------------------------------------------------------------------- the miss path's lock
_held = threading.local()  # .count: compile locks this thread holds


def _acquire(lock) -> bool:
    """Take ``lock``: waiting when this thread holds no other compile lock, else only if it is free
    (a thread holding one lock never waits for another, so no cycle of waits can form)."""
    held = getattr(_held, "count", 0)
    if not lock.acquire(blocking=held == 0):
        return False
    _held.count = held + 1
    return True


def _release(lock) -> None:
    _held.count -= 1
    lock.release()


_GLOBAL_READS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})


def _names(code) -> list[str]:
    """Global names a code object reads, including those of nested functions and comprehensions.
    Only names loaded as globals: ``co_names`` also holds attribute names, so a function reading
    ``opt.step`` would otherwise be guarded on a global ``step`` (a training loop's counter: a
    retrace every call)."""
    names = [arg for _, op, arg in reads.instructions(code) if op in _GLOBAL_READS]
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names.extend(_names(const))
    return list(dict.fromkeys(names))


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector paused while this thread traces (and, waiting, compiles) a call.

    A trace makes tens of thousands of long-lived objects (nodes, values, types); each full
    collection walks all of them, so collections during a long trace grow with its square. Two
    LSTMCells over 600 steps: 4.9 -> 3.6 s of CPU for the first call. A collector the user turned
    off stays off.

    A long trace leaves many objects young (an LSTMCell loop over 1,000 steps: about 480,000, nearly
    all of them its graphs, which the specialization keeps). Left to the collector, the first
    allocation after the pause walks them all (a young collection), and the next collection of the
    middle generation walks the survivors again. They are moved to the old generation instead,
    unwalked (``_age``): the trace's cycles of garbage (a few tens of thousands of small objects, the
    code generator's) wait for the next full collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_count()[0] > _MANY_YOUNG_OBJECTS:
                _age()
            gc.enable()


def _age() -> None:
    """Every young object moved to the old generation without a walk of them: ``freeze`` then
    ``unfreeze`` splice the generations' lists (the LSTMCell loop's 480,000 objects: a collection of the
    young generations took 0.28 s). Where the program froze objects of its own (``gc.freeze`` before
    forking workers), ``unfreeze`` would thaw those too: the young generations are collected instead."""
    if gc.get_freeze_count():
        gc.collect(1)
    else:
        gc.freeze()
        gc.unfreeze()


#: Young objects past which the end of a pause moves them to the old generation (``_age``): a short
#: trace's few thousand are left to the collector's own young collections. DCGAN's and the CNN's first
#: calls leave about 84,000 and 80,000 (about half of them garbage, mostly the code generator's): the
#: young collection that walked them took 23-62 ms of that call, at 100,000 here; moved, their garbage
#: waits for a full collection, which the process's RSS does not show (DCGAN: 328.6 MB against 328.8).
_MANY_YOUNG_OBJECTS = 20_000
