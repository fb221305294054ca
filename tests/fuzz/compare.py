"""Comparing what the eager and the compiled copy of a program did: values, metadata, aliasing.

Every function returns a list of ``Difference`` (empty when the two agree). Tolerances allow
for reassociated and fused float arithmetic: ``rtol`` per dtype, ``atol`` the same times the
largest magnitude the program may reach (the generator bounds it), so a reported difference is
beyond any rounding the compiler may legally introduce. Integers and bools compare exactly, NaN
positions and infinities must match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

import kiln

from .generator import TOLERANCE


@dataclass
class Difference:
    check: str  # which comparison failed: "value", "dtype", "aliasing", "grad", ...
    where: str  # "result 0", "argument a1", "capture G2 .grad", ...
    detail: str

    def __str__(self) -> str:
        return f"{self.check} of {self.where}: {self.detail}"


def dtype_name(t) -> str:
    return str(t.dtype).removeprefix("kiln.")


def host(t) -> np.ndarray:
    return np.asarray(t.detach()._host() if t.device.type != "cpu" else t.detach()._data)


def values(where: str, eager, compiled, scale: float, rtol_floor: float, check: str = "value") -> list[Difference]:
    """Two tensors: dtype, shape, then values within the dtype's tolerance."""
    if dtype_name(eager) != dtype_name(compiled):
        return [Difference("dtype", where, f"eager {dtype_name(eager)}, compiled {dtype_name(compiled)}")]
    if tuple(eager.shape) != tuple(compiled.shape):
        return [Difference("shape", where, f"eager {tuple(eager.shape)}, compiled {tuple(compiled.shape)}")]
    e, c = host(eager), host(compiled)
    if e.dtype.kind in "biu":
        bad = e != c
    else:
        e64, c64 = e.astype(np.float64), c.astype(np.float64)
        finite = np.isfinite(e64)
        big = float(np.abs(e64[finite]).max()) if finite.any() else 0.0
        rtol = max(TOLERANCE[dtype_name(eager)], rtol_floor)
        atol = rtol * max(1.0, scale, big)
        close = np.isclose(c64, e64, rtol=rtol, atol=atol, equal_nan=True)
        bad = ~(close | (e64 == c64))  # equal infinities are close
    if not bad.any():
        return []
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
    return [Difference(check, where, f"{int(bad.sum())} of {bad.size} elements differ; at {first}: eager "
                                     f"{e[first]!r}, compiled {c[first]!r}")]  # fmt: skip


def tensors(where: str, eager, compiled, scale: float, rtol_floor: float) -> list[Difference]:
    """Two results: both tensors (then requires_grad and values) or equal plain values."""
    if isinstance(eager, kiln.Tensor) != isinstance(compiled, kiln.Tensor):
        return [Difference("type", where, f"eager {type(eager).__name__}, compiled {type(compiled).__name__}")]
    if not isinstance(eager, kiln.Tensor):
        same = eager == compiled or (eager != eager and compiled != compiled)
        return [] if same else [Difference("value", where, f"eager {eager!r}, compiled {compiled!r}")]
    if eager.requires_grad != compiled.requires_grad:
        return [Difference("requires_grad", where, f"eager {eager.requires_grad}, compiled {compiled.requires_grad}")]
    return values(where, eager, compiled, scale, rtol_floor)


def grads(where: str, eager, compiled, scale: float, rtol_floor: float) -> list[Difference]:
    ge, gc = eager.grad, compiled.grad
    if (ge is None) != (gc is None):
        return [Difference("grad", f"{where} .grad", f"eager {'None' if ge is None else 'set'}, "
                                                     f"compiled {'None' if gc is None else 'set'}")]  # fmt: skip
    return [] if ge is None else values(f"{where} .grad", ge, gc, scale, rtol_floor, check="grad")


def _shares(a, b) -> bool:
    x, y = a._data, b._data
    if x.size == 0 or y.size == 0 or not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
        return False
    return bool(np.shares_memory(x, y))


def aliasing(results: list, inputs: list, captures: list) -> list[str]:
    """Which results are (or share memory with) an argument, a captured tensor or another result."""
    facts = []
    named = [("argument", i, t) for i, t in enumerate(inputs)] + [("capture", i, t) for i, t in enumerate(captures)]
    for i, r in enumerate(results):
        if not isinstance(r, kiln.Tensor):
            continue
        for kind, j, t in named + [("result", k, results[k]) for k in range(i)]:
            if not isinstance(t, kiln.Tensor):
                continue
            if r is t:
                facts.append(f"result {i} is {kind} {j}")
            elif _shares(r, t):
                facts.append(f"result {i} shares memory with {kind} {j}")
    return facts


def structure(eager: list[str], compiled: list[str]) -> list[Difference]:
    if eager == compiled:
        return []
    only_e = sorted(set(eager) - set(compiled))
    only_c = sorted(set(compiled) - set(eager))
    return [Difference("aliasing", "results", f"eager only: {only_e}; compiled only: {only_c}")]


# calls whose results PyTorch always computes into new memory, even where the values equal a
# view of the input (a pooling window of 1); an activation may wrap them (layers.conv_epilogue)
FRESH_CALL = re.compile(r"([\w.]+\()?F\.(max_pool\dd|avg_pool\dd|batch_norm|group_norm|embedding|conv2d)\(")


def fresh(program, results: list, named: list) -> list[Difference]:
    """Eager against PyTorch's rule, which compiled-vs-eager cannot see: a result of a
    ``FRESH_CALL`` must not share memory with an argument or a captured tensor."""
    made = dict(line.split(" = ", 1) for line in program.body[:-1] if " = " in line)
    names = program.body[-1].removeprefix("return ").rstrip(",").split(", ")
    found = []
    for i, (name, r) in enumerate(zip(names, results, strict=False)):
        call = FRESH_CALL.match(made.get(name, ""))
        if call is None or not isinstance(r, kiln.Tensor):
            continue
        shared = [j for j, t in enumerate(named) if isinstance(t, kiln.Tensor) and _shares(r, t)]
        if shared:
            found.append(Difference("fresh memory", f"result {i}", f"F.{call.group(2)} returned memory shared "
                                    f"with argument/capture {shared[0]} (PyTorch returns new memory)"))  # fmt: skip
    return found
