"""Running a ``Scenario`` eagerly and compiled, call by call, comparing results and all the state.

Each copy executes the scenario's source in its own namespace (so module-level containers are
not shared) and builds its state from the same seed. Before call ``k`` both copies run
``between(k, last)``; each call gets fresh arguments from the same generator seed. After each call
the comparison covers exceptions (same type), results, the arguments (a dict argument the call
mutated, say) and the state objects, seen through ``view``: a module's parameters, gradients,
buffers and training flags; an optimizer's hyperparameters and per-parameter state; a scheduler's
attributes; containers and plain objects entry by entry. Then the compiled copy's tensors get the
eager copy's bits, so rounding never grows into a false difference on a later call.
"""

from __future__ import annotations

import linecache
import math
import signal
import types
import warnings

import numpy as np

import kiln

from . import compare
from .compare import Difference
from .runner import PROGRAM_SECONDS, Outcome, _both, _error, _timeout, call_kind, count_call, counters, history
from .scenario import Scenario

CALLS = 6
INPUT_SETS = (1, 2, 1, 3, 2, 1)  # the seed of each call's arguments: the same batch comes back


def view(obj):
    """``obj`` as nested dicts and lists of tensors and plain values (what is compared)."""
    if isinstance(obj, kiln.Tensor) or obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, kiln.nn.Module):
        out: dict = {}
        for name, p in obj.named_parameters():
            out[name], out[name + ".grad"] = p, p.grad
        out.update(obj.named_buffers())
        out["training"] = [m.training for m in obj.modules()]
        return out
    if isinstance(obj, kiln.optim.Optimizer):
        groups = [{k: view(v) for k, v in g.items() if k != "params"} for g in obj.param_groups]
        states = [view(dict(obj.state.get(p, {}))) for g in obj.param_groups for p in g["params"]]
        return {"param_groups": groups, "state": states}
    if isinstance(obj, dict):
        return {k: view(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [view(v) for v in obj]
    if callable(obj):  # a scheduler's lambda: each copy has its own function object
        return "<callable>"
    if isinstance(obj, kiln.optim.lr_scheduler.LRScheduler):
        return {k: view(v) for k, v in vars(obj).items() if k != "optimizer"}
    if isinstance(obj, types.SimpleNamespace) or hasattr(obj, "__dict__"):
        return {k: view(v) for k, v in vars(obj).items()}
    return obj


def differences(where: str, e, c, scale: float, rtol: float) -> list[Difference]:
    """Two views (``view``) compared: tensors within tolerance, containers entry by entry."""
    if isinstance(e, kiln.Tensor) or isinstance(c, kiln.Tensor):
        return compare.tensors(where, e, c, scale, rtol)
    if isinstance(e, dict) and isinstance(c, dict):
        if list(e) != list(c):
            return [Difference("container", where, f"keys: eager {list(e)}, compiled {list(c)}")]
        return [d for k in e for d in differences(f"{where}[{k!r}]", e[k], c[k], scale, rtol)]
    if isinstance(e, list) and isinstance(c, list):
        if len(e) != len(c):
            return [Difference("container", where, f"length: eager {len(e)}, compiled {len(c)}")]
        return [d for i, (x, y) in enumerate(zip(e, c, strict=True)) for d in differences(f"{where}[{i}]", x, y, scale, rtol)]  # fmt: skip
    if type(e) is not type(c):
        return [Difference("type", where, f"eager {type(e).__name__} {e!r}, compiled {type(c).__name__} {c!r}")]
    if isinstance(e, float):
        same = math.isclose(e, c, rel_tol=max(rtol, 1e-12), abs_tol=max(rtol, 1e-12)) or (e != e and c != c)
    else:
        same = e == c
    return [] if same else [Difference("value", where, f"eager {e!r}, compiled {c!r}")]


def resync(e, c) -> None:
    """Give the compiled copy's tensors in view ``c`` the eager copy's bits from view ``e``."""
    if isinstance(e, kiln.Tensor) and isinstance(c, kiln.Tensor):
        if c._data.flags.writeable and e._data.shape == c._data.shape:
            np.copyto(c._data, e._data.astype(c._data.dtype))
    elif isinstance(e, dict) and isinstance(c, dict):
        for k in e.keys() & c.keys():
            resync(e[k], c[k])
    elif isinstance(e, list) and isinstance(c, list) and len(e) == len(c):
        for x, y in zip(e, c, strict=True):
            resync(x, y)


class Copy:
    """One copy of the scenario: its namespace, state, function and the last call's results."""

    def __init__(self, program: Scenario, compiled: bool, backend: str, filename: str):
        self.program, self.ns = program, {"__name__": f"fuzz_scenario_{'compiled' if compiled else 'eager'}"}
        exec(compile(program.source, filename, "exec"), self.ns)  # noqa: S102 - our own generated program
        fn, self.between, self.state = self.ns["build"]()
        self.fn = kiln.compile(fn, options=kiln.CompileOptions(backend=backend, wait=True)) if compiled else fn
        self.inputs: list = []
        self.last = None

    def arguments(self, call: int) -> None:
        self.inputs = self.ns["make_inputs"](np.random.default_rng([self.program.seed, INPUT_SETS[call]]))

    def before(self, call: int):
        try:
            self.between(call, self.last)
        except Exception as error:  # noqa: BLE001 - compared with the other copy's
            return error
        return None

    def call(self, call: int):
        kiln.manual_seed(1000 + call)
        try:
            out = self.fn(*self.inputs)
        except Exception as error:  # noqa: BLE001
            return None, error, bytes(kiln.get_rng_state()._data)
        self.last = list(out) if isinstance(out, tuple) else [out]
        return self.last, None, bytes(kiln.get_rng_state()._data)


def _call(eager: Copy, compiled: Copy, call: int, outcome: Outcome) -> bool:
    """One call of both copies and every comparison; True when the scenario stops here."""
    p = eager.program
    tol = (p.scale, p.rtol)
    if _both("between calls", eager.before(call), compiled.before(call), outcome):
        return True
    eager.arguments(call)
    compiled.arguments(call)
    er, e_err, e_rng = eager.call(call)
    before = counters(compiled.fn)
    cr, c_err, c_rng = compiled.call(call)
    count_call(outcome, *(call_kind(compiled.fn, before) if c_err is None else ("raised", None)))
    if _both("the call", e_err, c_err, outcome):
        return True
    found = [] if e_rng == c_rng else [Difference("rng state", "generator", "state after the call differs")]
    found += differences("result", view(er), view(cr), *tol)
    found += compare.structure(compare.aliasing(er, _tensors(eager.inputs), []),
                               compare.aliasing(cr, _tensors(compiled.inputs), []))  # fmt: skip
    found += differences("argument", view(eager.inputs), view(compiled.inputs), *tol)
    for name in p.state_names:
        found += differences(name, view(eager.state[name]), view(compiled.state[name]), *tol)
    if found:
        outcome.difference = found[0]
        return True
    resync(view(eager.state), view(compiled.state))
    return False


def _tensors(items: list) -> list:
    return [t for t in items if isinstance(t, kiln.Tensor)]


def run_scenario(program: Scenario, backend: str = "llvm") -> Outcome:
    """Run ``program`` eagerly and compiled for ``CALLS`` calls; the first finding stops it."""
    outcome = Outcome(program)
    source, filename = program.source, f"<fuzz scenario {program.seed}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(PROGRAM_SECONDS)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            eager = Copy(program, False, backend, filename)
            compiled = Copy(program, True, backend, filename)
            for call in range(CALLS):
                if _call(eager, compiled, call, outcome):
                    outcome.call = call
                    break
            history(compiled.fn, outcome)
    except TimeoutError as error:
        outcome.crash = _error(error)
    except Exception as error:  # noqa: BLE001 - building the state failed: a generator bug, said as such
        outcome.crash = f"building the scenario: {_error(error)}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        linecache.cache.pop(filename, None)
    return outcome
