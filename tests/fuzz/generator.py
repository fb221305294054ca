"""Seeded random programs over kiln's op surface, written as Python source text.

``generate(seed)`` returns a ``Program``: the source of a module defining ``make_inputs(rng)``,
``make_captures(rng)`` and ``build(*captures) -> f`` (the function under test closes over the
captured tensors), plus how the caller uses it (backward outside, mutating a result). Being source
text, a failing program prints as a standalone repro.

False positives are excluded by construction: every value carries a bound on its magnitude (ops
that would overflow are wrapped in ``clamp``/``tanh``), and a value is *exact* only when eager and
any reassociated or fused computation must agree bit for bit (inputs, views, casts, selections).
Discontinuous ops (comparisons, floor, argmax, float->int casts) only read exact values, divisions
and logs only read denominators bounded away from zero.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

FLOATS = ("float16", "float32", "float64")
CATEGORY = {"bool": 0, "int32": 1, "int64": 1, "float16": 2, "float32": 2, "float64": 2}
WIDTH = {"bool": 0, "int32": 1, "int64": 2, "float16": 1, "float32": 2, "float64": 3}
LIMIT = {"float16": 200.0, "float32": 1e4, "float64": 1e4, "int32": 1e4, "int64": 1e4, "bool": 1.0}
TOLERANCE = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-9}  # rtol; atol is rtol times the scale
SCALAR_DTYPE = {"float": "float32", "int": "int64", "bool": "bool"}  # dtypes of Python scalars alone


@dataclass
class Var:
    """A value of the program being generated, with what the generator knows about it."""

    name: str
    shape: tuple
    dtype: str
    bound: float = 2.0  # |value| <= bound
    exact: bool = True  # eager and compiled agree bit for bit
    grad: bool = False  # requires grad
    root: str = ""  # the tensor whose memory this is (views share their base's root)
    writable: bool = True  # may be written in place (not expanded, not a leaf requiring grad)
    contiguous: bool = True

    @property
    def is_float(self) -> bool:
        return CATEGORY[self.dtype] == 2


@dataclass
class Program:
    """A generated program: the parts of its source, and how the caller uses the function."""

    seed: int
    inputs: list[str]  # statements of make_inputs
    captures: list[str]  # statements of make_captures
    arg_names: list[str]
    cap_names: list[str]
    body: list[str]  # statements of f, the last one its return
    ops: list[str]  # one op kind per body statement before the return (mismatch signatures)
    backward_outside: bool = False  # the caller runs backward over the results that require grad
    mutate_result: int | None = None  # index of a result the caller changes in place after each call
    float_dtype: str = "float32"
    scale: float = 1.0  # the largest magnitude any value may reach (for tolerances)
    # the loosest float tolerance of any value in the program: a float32 value's rounding survives
    # a cast to float64, so a float64 result is compared with float32's tolerance
    rtol: float = 0.0
    kind: str = "ops"  # which generator made it (tests/fuzz/kinds.py); other kinds are ``Scenario``s

    @property
    def source(self) -> str:
        ind = "    "
        lines = ["import numpy as np", "import kiln", "import kiln.nn.functional as F", "", "",
                 "def make_inputs(rng):"]  # fmt: skip
        lines += [ind + s for s in self.inputs]
        lines += [ind + f"return [{', '.join(self.arg_names)}]", "", "", "def make_captures(rng):"]
        lines += [ind + s for s in self.captures]
        lines += [ind + f"return [{', '.join(self.cap_names)}]", "", "", f"def build({', '.join(self.cap_names)}):"]
        lines += [ind + f"def f({', '.join(self.arg_names)}):"]
        lines += [ind * 2 + s for s in self.body]
        lines += [ind + "return f", ""]
        lines += [f"# caller: backward over the results={self.backward_outside}, "
                  f"mutates result {self.mutate_result} in place after each call; seed {self.seed}, scale {float(self.scale)}, rtol {self.rtol}"]  # fmt: skip
        return "\n".join(lines)

    @classmethod
    def from_source(cls, text: str) -> Program:
        """A program back from its printed source (``python -m tests.fuzz --repro FILE``)."""

        def block(name: str) -> list[str]:
            lines = text.split(f"def {name}(", 1)[1].split("\n")[1:]
            body = []
            for line in lines:
                if not line.startswith("    "):
                    break
                body.append(line[4:])
            return body

        caller = re.search(
            r"results=(\w+), mutates result (\w+) .*seed (\d+), scale ([\d.e+]+), rtol ([\d.e+-]+)", text
        )
        if caller is None:
            raise ValueError("not a fuzz program: its last line should be the '# caller: ...' comment")
        names = lambda sig: [n.strip() for n in re.search(sig + r"\((.*)\):", text).group(1).split(",") if n.strip()]  # noqa: E731
        body = [line[4:] for line in block("build")[1:-1]]
        mutate = None if caller.group(2) == "None" else int(caller.group(2))
        return cls(int(caller.group(3)), block("make_inputs")[:-1], block("make_captures")[:-1], names("def f"),
                   names("def build"), body, ["?"] * (len(body) - 1), caller.group(1) == "True", mutate,
                   scale=float(caller.group(4)), rtol=float(caller.group(5)))  # fmt: skip


def promote(*items) -> str:
    """PyTorch's promotion: tensors with dims, then 0-d tensors, then Python scalars ("float"...)."""
    cats = [CATEGORY[i.dtype] if isinstance(i, Var) else CATEGORY[SCALAR_DTYPE[i]] for i in items]
    best = max(cats)
    for group in ([i for i in items if isinstance(i, Var) and i.shape], [i for i in items if isinstance(i, Var)]):
        dtypes = [v.dtype for v in group if CATEGORY[v.dtype] == best]
        if dtypes:
            return max(dtypes, key=WIDTH.__getitem__)
    return {2: "float32", 1: "int64", 0: "bool"}[best]


def broadcast(a: tuple, b: tuple) -> tuple | None:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def numel(shape: tuple) -> int:
    return math.prod(shape)


@dataclass
class Generator:
    seed: int
    r: random.Random = field(init=False)
    pool: list[Var] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # lines of make_inputs
    captures: list[str] = field(default_factory=list)  # lines of make_captures
    arg_names: list[str] = field(default_factory=list)
    cap_names: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    count: int = 0
    families: dict | None = None  # emitter -> weight (None: ops.FAMILIES); tests/fuzz/layers.py adds to it

    def __post_init__(self) -> None:
        self.r = random.Random(self.seed)
        r = self.r
        self.fdt = r.choices(FLOATS, weights=(2, 6, 2))[0]
        self.grad_mode = r.random() < 0.3
        self.scale = 2.0
        self.dtypes: set[str] = set()

    # ------------------------------------------------------------------ values
    def shape(self, rank: int | None = None) -> tuple:
        r = self.r
        rank = r.choice((0, 1, 1, 2, 2, 2, 3, 3)) if rank is None else rank
        return tuple(0 if r.random() < 0.03 else r.randint(1, 5) for _ in range(rank))

    def like(self, shape: tuple) -> tuple:
        """A shape that broadcasts against ``shape`` to ``shape``."""
        k = self.r.randint(0, len(shape))
        return tuple(1 if self.r.random() < 0.3 else d for d in shape[len(shape) - k :])

    def fresh(self, prefix: str = "v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def add(self, var: Var, line: str, op: str) -> Var:
        self.body.append(f"{var.name} = {line}")
        self.ops.append(op)
        self.pool.append(var)
        self.scale = max(self.scale, var.bound)
        self.dtypes.add(var.dtype)
        return var

    def new_input(self, shape: tuple, dtype: str, *, capture: bool = False, grad: bool = False, low: int = -4,
                  high: int = 5) -> Var:  # fmt: skip
        """A new argument (or captured tensor), sometimes laid out non-contiguously."""
        r = self.r
        name = self.fresh("G" if capture else "a")
        if CATEGORY[dtype] == 2:
            make = "rng.uniform(-2, 2, {})"
        elif CATEGORY[dtype] == 1:
            make = f"rng.integers({low}, {high}, {{}})"
        else:
            make = "rng.random({}) < 0.5"
        layout, alloc, contiguous, writable = "", shape, True, True
        pick = r.random()
        if len(shape) >= 2 and pick < 0.2:
            alloc = (*shape[:-2], shape[-1], shape[-2])
            layout, contiguous = ".transpose(-1, -2)", False
        elif len(shape) >= 1 and pick < 0.35:
            alloc = (shape[0] * 2, *shape[1:])
            layout, contiguous = "[::2]", False
        elif len(shape) >= 1 and pick < 0.42 and not grad and not capture:
            alloc = (1, *shape[1:])
            layout, contiguous, writable = f".expand({shape})", False, False
        line = f"kiln.tensor(np.asarray({make.format(alloc)}), dtype=kiln.{dtype}){layout}"
        if grad:
            line += ".detach().requires_grad_()" if layout else ".requires_grad_()"
            writable = False
        (self.captures if capture else self.inputs).append(f"{name} = {line}")
        (self.cap_names if capture else self.arg_names).append(name)
        bound = 2.0 if CATEGORY[dtype] == 2 else max(abs(low), abs(high))
        var = Var(name, shape, dtype, bound, True, grad, name, writable, contiguous)
        self.dtypes.add(dtype)
        self.pool.append(var)
        return var

    def aliased_input(self) -> Var | None:
        """An argument that is a view of another argument: ``f(a0, a0[::2])``."""
        bases = [v for v in self.pool if v.name in self.arg_names and v.shape and v.shape[0] > 1]
        if not bases:
            return None
        base = self.r.choice(bases)
        name = self.fresh("a")
        self.inputs.append(f"{name} = {base.name}[::2]")
        self.arg_names.append(name)
        shape = ((base.shape[0] + 1) // 2, *base.shape[1:])
        var = Var(
            name, shape, base.dtype, base.bound, True, base.grad, base.root, base.writable and not base.grad, False
        )
        self.pool.append(var)
        return var

    def index_input(self, shape: tuple, size: int, negative: bool = False) -> Var:
        """An int64 index tensor with values valid for a dimension of ``size``."""
        low = -size if negative else 0
        index = self.new_input(shape, "int64", capture=self.r.random() < 0.3, low=low, high=size)
        index.writable = False  # an in-place change would make it invalid on the next call
        return index

    def choose(self, pred) -> Var | None:
        candidates = [v for v in self.pool if pred(v)]
        return self.r.choice(candidates) if candidates else None

    def operand(self, a: Var, *, tensor_only: bool = False, same_dtype: bool = False):
        """Something to combine with ``a``: another value, a new input, a Python scalar."""
        r = self.r
        pick = r.random()
        if not tensor_only and not same_dtype and pick < 0.25:
            if a.dtype == "bool":
                return r.choice(("True", "1", "0.5")), 1.0
            return r.choice(("2", "-1", "0.5", "1.5", "-0.25", "3")), 3.0
        if pick < 0.6:
            other = self.choose(lambda v: v is not a and broadcast(v.shape, a.shape) is not None
                                and (v.dtype == a.dtype or not same_dtype) and v.dtype != "bool")  # fmt: skip
            if other is not None:
                return other, other.bound
        dtype = (
            a.dtype
            if same_dtype or r.random() < 0.75
            else r.choice(("float16", "float32", "float64", "int64", "int32"))
        )
        if dtype == "bool":
            dtype = self.fdt
        shape = () if r.random() < 0.1 else self.like(a.shape)
        grad = self.grad_mode and CATEGORY[dtype] == 2 and r.random() < 0.4
        other = self.new_input(shape, dtype, capture=r.random() < 0.3, grad=grad)
        return other, other.bound

    def changed(self, target: Var, bound: float, exact: bool, grad: bool) -> None:
        """An in-place write into ``target``: every view of its memory changes with it."""
        for v in self.pool:
            if v.root == target.root:
                v.bound = max(v.bound, bound)
                v.exact = v.exact and exact
                v.grad = v.grad or grad
        self.scale = max(self.scale, bound)

    def mask(self, shape: tuple) -> str | None:
        """A bool tensor broadcastable to ``shape``: a bool value or a comparison of an exact one."""
        m = self.choose(lambda v: v.dtype == "bool" and broadcast(v.shape, shape) == shape)
        if m is not None and self.r.random() < 0.5:
            return m.name
        x = self.choose(lambda v: v.exact and v.dtype != "bool" and broadcast(v.shape, shape) == shape)
        if x is None:
            x = self.new_input(self.like(shape), self.r.choice((self.fdt, "int64")))
        return f"({x.name} > {self.r.choice(('0', '0.5', '-1'))})"

    # ------------------------------------------------------------------ the program
    def program(self) -> Program:
        from .ops import emit_op, emit_return  # noqa: PLC0415 - ops builds on this module

        r = self.r
        for _ in range(r.randint(1, 3)):
            dtype = self.fdt if r.random() < 0.7 else r.choice(("int64", "int32", "bool", "float32", "float64"))
            self.new_input(self.shape(), dtype, grad=self.grad_mode and CATEGORY[dtype] == 2 and r.random() < 0.6)
        for _ in range(r.choice((0, 0, 1, 2))):
            grad = self.grad_mode and r.random() < 0.5
            self.new_input(self.shape(), self.fdt, capture=True, grad=grad)
        if r.random() < 0.05:
            self.aliased_input()
        target = r.randint(3, 12)
        tries = 0
        while len(self.ops) < target and tries < 100:
            tries += 1
            emit_op(self, self.families)
        backward_outside = emit_return(self)
        mutate = r.randrange(3) if r.random() < 0.3 else None
        return Program(self.seed, self.inputs, self.captures, self.arg_names, self.cap_names, self.body, self.ops,
                       backward_outside, mutate, self.fdt, self.scale, max(TOLERANCE.get(d, 0.0) for d in self.dtypes))  # fmt: skip


def generate(seed: int) -> Program:
    return Generator(seed).program()
