"""Scenario programs: a function with state around it (a model and its optimizer, Python
containers, a config), called several times with things changed between the calls.

A ``Scenario`` prints as a standalone module: ``make_inputs(rng)`` gives one call's arguments,
``build()`` makes the state and returns ``f`` (the function under test), ``between(call, last)``
(what the caller does before call number ``call``, given the previous call's results) and the
dict of state objects compared after every call. Its parts are lists of one-line statements, so
the shrinker deletes body statements and between-call actions as it does for op programs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .generator import Program

IMPORTS = ["import functools", "import math", "import os", "import types", "", "import numpy as np", "", "import kiln", "import kiln.nn as nn",
           "import kiln.nn.functional as F", "import kiln.optim as optim", "from kiln.optim import lr_scheduler"]  # fmt: skip
IND = "    "


@dataclass
class Scenario(Program):
    """A generated scenario; ``body``/``ops`` are f's statements and their tags, as for op programs."""

    kind: str = "models"
    preamble: list[str] = field(default_factory=list)  # module-level statements (global containers)
    setup: list[str] = field(default_factory=list)  # statements of build() before f
    actions: list[str] = field(default_factory=list)  # statements of between(call, last), one line each
    action_ops: list[str] = field(default_factory=list)  # one tag per action (signatures, known bugs)
    state_names: list[str] = field(default_factory=list)  # the objects compared after every call

    @property
    def source(self) -> str:
        lines = [*IMPORTS, "", "# module state", *self.preamble, "", "", "def make_inputs(rng):"]
        lines += [IND + s for s in self.inputs] + [IND + f"return [{', '.join(self.arg_names)}]", "", ""]
        lines += ["def build():", *(IND + s for s in self.setup), "", IND + f"def f({', '.join(self.arg_names)}):"]
        lines += [IND * 2 + s for s in self.body]
        lines += ["", IND + "def between(call, last):", *(IND * 2 + s for s in self.actions or ["pass"]), ""]
        state = ", ".join(f'"{n}": {n}' for n in self.state_names)
        lines += [IND + f"return f, between, {{{state}}}", ""]
        lines += [f"# caller: kind {self.kind}; tags {', '.join(self.action_ops) or '-'}; seed {self.seed}, "
                  f"scale {float(self.scale)}, rtol {self.rtol}"]  # fmt: skip
        return "\n".join(lines)

    @classmethod
    def from_source(cls, text: str) -> Scenario:
        """A scenario back from its printed source (``python -m tests.fuzz --repro FILE``)."""
        caller = re.search(r"# caller: kind (\w+); tags (.*); seed (\d+), scale ([\d.e+]+), rtol ([\d.e+-]+)", text)
        if caller is None:
            raise ValueError("not a fuzz scenario: its last line should be the '# caller: kind ...' comment")
        lines = text.splitlines()

        def block(header: str, indent: str) -> list[str]:
            start = next(i for i, line in enumerate(lines) if line.strip().startswith(header)) + 1
            out = []
            for line in lines[start:]:
                if not line.startswith(indent) or not line.strip():
                    break
                out.append(line[len(indent) :])
            return out

        names = lambda sig: [n.strip() for n in re.search(sig + r"\((.*)\):", text).group(1).split(",") if n.strip()]  # noqa: E731
        body = block("def f(", IND * 2)
        actions = [a for a in block("def between(", IND * 2) if a != "pass"]
        tags = caller.group(2).split(", ") if caller.group(2) != "-" else []
        state = re.search(r"return f, between, \{(.*)\}", text).group(1)
        return cls(int(caller.group(3)), block("def make_inputs(", IND)[:-1], [], names("def f"), [], body,
                   ["?"] * (len(body) - 1), scale=float(caller.group(4)), rtol=float(caller.group(5)),
                   kind=caller.group(1), preamble=block("# module state", ""), setup=block("def build(", IND),
                   actions=actions, action_ops=(tags + ["?"] * len(actions))[: len(actions)],
                   state_names=re.findall(r'"(\w+)": \w+', state))  # fmt: skip


@dataclass
class Builder:
    """What the scenario generators share: fresh names and the parts of the program."""

    seed: int
    inputs: list[str] = field(default_factory=list)
    arg_names: list[str] = field(default_factory=list)
    preamble: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    action_ops: list[str] = field(default_factory=list)
    state_names: list[str] = field(default_factory=list)
    count: int = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def argument(self, make: str, prefix: str = "a") -> str:
        name = self.fresh(prefix)
        self.inputs.append(f"{name} = {make}")
        self.arg_names.append(name)
        return name

    def float_input(self, shape: tuple, dtype: str, low: float = -2, high: float = 2) -> str:
        return self.argument(f"kiln.tensor(rng.uniform({low}, {high}, {shape}), dtype=kiln.{dtype})")

    def int_input(self, shape: tuple, high: int) -> str:
        return self.argument(f"kiln.tensor(rng.integers(0, {high}, {shape}))")

    def stmt(self, line: str, op: str) -> None:
        self.body.append(line)
        self.ops.append(op)

    def action(self, call: int, line: str, op: str) -> None:
        """``line`` runs before call number ``call``."""
        self.action_line(f"if call == {call}: {line}", op)

    def action_line(self, line: str, op: str) -> None:
        self.actions.append(line)
        self.action_ops.append(op)

    def scenario(self, kind: str, returns: str, scale: float, rtol: float) -> Scenario:
        return Scenario(self.seed, self.inputs, [], self.arg_names, [], [*self.body, f"return {returns}"], self.ops,
                        scale=scale, rtol=rtol, kind=kind, preamble=self.preamble, setup=self.setup,
                        actions=self.actions, action_ops=self.action_ops, state_names=self.state_names)  # fmt: skip
