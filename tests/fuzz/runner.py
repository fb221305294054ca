"""Running one generated program eagerly and compiled, call by call, and comparing everything.

The two copies get identical inputs and captured tensors (each built from the same seeds) and
the same generator seed before each call. Per call the comparison covers: exceptions (same
type), results (type, dtype, shape, requires_grad, values), the aliasing structure of the
results, arguments and captured tensors after the call, the random generator's state,
gradients after the caller's ``backward``, and arguments and captures after the caller changes
a result in place. After the comparisons the compiled copy's state is set to the eager copy's
bits, so a difference within tolerance never grows into a false one on a later call.
"""

from __future__ import annotations

import linecache
import re
import signal
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

import kiln

from . import compare
from .compare import Difference
from .generator import Program
from .scenario import Scenario

# (input set, fresh tensors?): the same tensors three times (their mutations and .grad carry
# over), a second input set of the same shapes, then fresh tensors with the first set's values.
SCHEDULE = (("A", True), ("A", False), ("A", False), ("B", True), ("B", False), ("A", True))
SET_SEEDS = {"A": 1, "B": 2}
PROGRAM_SECONDS = 30  # a program still running after this (in Python code) is reported as a crash


@dataclass
class Outcome:
    program: Program
    difference: Difference | None = None  # a silent mismatch
    crash: str | None = None  # the compiled copy raised where eager did not
    crash_trace: str | None = None  # where it raised: the innermost frames of its traceback
    eager_error: str | None = None  # both raised the same exception type (not a finding)
    call: int = -1  # the call at which the finding showed
    calls: Counter = field(default_factory=Counter)  # compiled-call kinds: compiled / traced / fallback
    fallbacks: Counter = field(default_factory=Counter)  # reasons of fallback calls
    specializations: int = 0  # of the compiled copy, when the program ended
    breaks: int = 0  # trace breaks of the compiled copy (each makes a key run eagerly from then on)

    @property
    def finding(self) -> bool:
        return self.difference is not None or self.crash is not None


class Side:
    """One copy of the program: eager or compiled, with its own inputs and captured tensors."""

    def __init__(self, namespace: dict, program: Program, compiled: bool, backend: str):
        self.ns, self.program, self.compiled = namespace, program, compiled
        self.captures = namespace["make_captures"](np.random.default_rng(program.seed))
        fn = namespace["build"](*self.captures)
        self.fn = kiln.compile(fn, options=kiln.CompileOptions(backend=backend, wait=True)) if compiled else fn
        self.inputs: list = []
        self.limits: list[float] = []  # per input and capture: its largest magnitude when made

    def prepare(self, input_set: str, fresh: bool) -> None:
        if fresh:
            self.inputs = self.ns["make_inputs"](np.random.default_rng([self.program.seed, SET_SEEDS[input_set]]))
            self.limits = [_magnitude(t) for t in self.inputs + self.captures]

    def grown(self) -> bool:
        """Whether in-place updates repeated call after call (``a.pow_(2)`` on an argument) took a
        value past the largest magnitude it had when made: the generator sized the program's values
        (and its tolerances) for one call on such values, and float rounding past them need not stay
        within tolerance (a softmax of logits in the tens of thousands, say)."""
        return any(_magnitude(t) > limit for t, limit in zip(self.inputs + self.captures, self.limits, strict=True))

    def reset_captures(self) -> None:
        """The captured tensors' first values again (same tensors: the compiled copy reads them each call)."""
        first = self.ns["make_captures"](np.random.default_rng(self.program.seed))
        for t, value in zip(self.captures, first, strict=True):
            if t._data.flags.writeable:
                np.copyto(t._data, value._data)

    def call(self, seed: int):
        kiln.manual_seed(seed)
        try:
            out = self.fn(*self.inputs)
        except Exception as error:  # noqa: BLE001 - compared with the other copy's
            return None, error, bytes(kiln.get_rng_state()._data)
        results = list(out) if isinstance(out, tuple) else [out]
        return results, None, bytes(kiln.get_rng_state()._data)


def counters(fn) -> tuple[int, int]:
    """Where a compiled function's history stands: compiled calls so far, events so far."""
    return sum(s.calls for s in fn.state.specializations), len(fn.state.events)


def call_kind(fn, before: tuple[int, int]) -> tuple[str, str | None]:
    """What the last call of a compiled function was: compiled, traced, or a fallback (with why)."""
    state = fn.state
    calls, events = before
    if sum(s.calls for s in state.specializations) > calls:
        return "compiled", None
    new = state.events[events:]
    if any(e.kind in ("compiled", "break") for e in new):
        return "traced", None
    if any(e.kind == "not cached" for e in new):
        return "fallback", "not cached: " + next(e.detail for e in new if e.kind == "not cached")
    limit = [e for e in state.events if e.kind == "recompile limit"]
    breaks = [e for e in state.events if e.kind == "break"]
    if breaks:
        return "fallback", "break: " + breaks[-1].detail
    return "fallback", "recompile limit" if limit else "unknown"


def history(fn, outcome: Outcome) -> None:
    """Copy a compiled function's specialization and trace-break counts into ``outcome``."""
    outcome.specializations = len(fn.state.specializations)
    outcome.breaks = sum(e.kind == "break" for e in fn.state.events)


def count_call(outcome: Outcome, kind: str, reason: str | None) -> None:
    outcome.calls[kind] += 1
    if reason:  # shapes and counts left out, so that one cause is one line of the summary
        outcome.fallbacks[re.sub(r"\([^()]*\d[^()]*\)|\d+", "#", reason)[:110]] += 1


def _magnitude(t) -> float:
    """The largest finite magnitude in a float tensor (0 for other dtypes and empty tensors)."""
    data = t._data
    if data.dtype.kind != "f" or not data.size:
        return 0.0
    finite = np.abs(data[np.isfinite(data)])
    return float(finite.max()) if finite.size else 0.0


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"


def _innermost(error: BaseException, frames: int = 6) -> str:
    """The last ``frames`` frames of where ``error`` was raised: a crash that a replay does not bring
    back (it depended on the process's history) is then reported with the line that raised it."""
    return "".join(traceback.format_tb(error.__traceback__)[-frames:]).rstrip()


def _both(where: str, eager_error, compiled_error, outcome: Outcome) -> bool:
    """Compare two exceptions (or their absence); True when the program stops here."""
    if eager_error is None and compiled_error is None:
        return False
    if eager_error is None:
        outcome.crash = f"{where}: {_error(compiled_error)}"
        outcome.crash_trace = _innermost(compiled_error)
    elif compiled_error is None:
        outcome.difference = Difference("no error", where, f"eager raised {_error(eager_error)}")
    elif not isinstance(compiled_error, type(eager_error)):
        outcome.difference = Difference("error type", where, f"eager {_error(eager_error)}; "
                                                             f"compiled {_error(compiled_error)}")  # fmt: skip
    else:
        outcome.eager_error = f"{where}: {_error(eager_error)}"
    return True


def _state(eager: Side, compiled: Side, scale: tuple, stage: str, grads: bool = False) -> list[Difference]:
    found = []
    pairs = [
        ("argument " + n, e, c) for n, e, c in zip(eager.program.arg_names, eager.inputs, compiled.inputs, strict=True)
    ]
    pairs += [("capture " + n, e, c) for n, e, c in zip(eager.program.cap_names, eager.captures, compiled.captures,
                                                         strict=True)]  # fmt: skip
    for name, e, c in pairs:
        found += compare.grads(name, e, c, *scale) if grads else compare.tensors(f"{name} {stage}", e, c, *scale)
    return found


def _backward(results: list) -> BaseException | None:
    outs = [r for r in results if isinstance(r, kiln.Tensor) and r.requires_grad and r.is_floating_point()]
    if not outs:
        return None
    try:
        sum(r.double().sum() for r in outs).backward()
    except Exception as error:  # noqa: BLE001
        return error
    return None


def _mutate(results: list, index: int | None) -> BaseException | None:
    if index is None or index >= len(results) or not isinstance(results[index], kiln.Tensor):
        return None
    r = results[index]
    try:
        with kiln.no_grad():
            r.logical_not_() if r.dtype == kiln.bool else r.add_(1)
    except Exception as error:  # noqa: BLE001
        return error
    return None


def _resync(eager: Side, compiled: Side) -> None:
    """Give the compiled copy's state the eager copy's bits (differences within tolerance stay put)."""
    for e, c in zip(eager.inputs + eager.captures, compiled.inputs + compiled.captures, strict=True):
        for x, y in ((e, c), (e.grad, c.grad)):
            if x is not None and y is not None and y._data.flags.writeable and x._data.shape == y._data.shape:
                np.copyto(y._data, x._data.astype(y._data.dtype))


def _call(eager: Side, compiled: Side, number: int, outcome: Outcome) -> bool:
    """One call of both copies and every comparison; True when the program stops here."""
    p = eager.program
    scale = (p.scale, p.rtol)
    er, e_err, e_rng = eager.call(1000 + number)
    before = counters(compiled.fn)
    cr, c_err, c_rng = compiled.call(1000 + number)
    count_call(outcome, *(call_kind(compiled.fn, before) if c_err is None else ("raised", None)))
    if _both("the call", e_err, c_err, outcome):
        return True
    found = [] if e_rng == c_rng else [Difference("rng state", "generator", "state after the call differs")]
    if len(er) != len(cr):
        found.append(Difference("result count", "results", f"eager {len(er)}, compiled {len(cr)}"))
    else:
        for i, (e, c) in enumerate(zip(er, cr, strict=True)):
            found += compare.tensors(f"result {i}", e, c, *scale)
        found += compare.structure(compare.aliasing(er, eager.inputs, eager.captures),
                                   compare.aliasing(cr, compiled.inputs, compiled.captures))  # fmt: skip
        found += compare.fresh(p, er, eager.inputs + eager.captures)
    found += _state(eager, compiled, scale, "after the call")
    if not found and p.backward_outside:
        if _both("backward outside", _backward(er), _backward(cr), outcome):
            return True
        found += _state(eager, compiled, scale, "", grads=True)
    if not found and p.mutate_result is not None:
        if _both("caller's in-place change of a result", _mutate(er, p.mutate_result), _mutate(cr, p.mutate_result),
                 outcome):  # fmt: skip
            return True
        found += _state(eager, compiled, scale, "after the caller changed a result")
    if found:
        outcome.difference = found[0]
        return True
    _resync(eager, compiled)
    return False


def _timeout(signum, frame):
    raise TimeoutError(f"the program ran longer than {PROGRAM_SECONDS} s")


def run(program: Program, backend: str = "llvm") -> Outcome:
    """Run ``program`` eagerly and compiled over ``SCHEDULE``; the first finding stops it."""
    if isinstance(program, Scenario):  # a training step, optimizer or Python-state scenario
        from .stateful import run_scenario  # noqa: PLC0415 - stateful builds on this module

        return run_scenario(program, backend)
    outcome = Outcome(program)
    source = program.source
    filename = f"<fuzz program {program.seed}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated program
    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(PROGRAM_SECONDS)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            eager, compiled = Side(namespace, program, False, backend), Side(namespace, program, True, backend)
            for number, (input_set, fresh) in enumerate(SCHEDULE):
                fresh = fresh or eager.grown()  # values past their first magnitudes: start them over
                if fresh and number:
                    eager.reset_captures()
                    compiled.reset_captures()
                eager.prepare(input_set, fresh)
                compiled.prepare(input_set, fresh)
                if _call(eager, compiled, number, outcome):
                    outcome.call = number
                    break
            history(compiled.fn, outcome)
    except TimeoutError as error:
        outcome.crash = _error(error)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        linecache.cache.pop(filename, None)
    return outcome
