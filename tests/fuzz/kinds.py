"""The fuzzer's program kinds: which generator makes a program, and reading a printed one back.

``ops``: random op chains (generator.py, ops.py); ``layers``: the same with pooling,
normalization, embedding and conv-epilogue ops among them (layers.py); ``models``: whole training steps (models.py);
``optim``: optimizers and schedulers with hyperparameters changed between calls (optimizers.py);
``pystate``: reads and mutations of Python containers and configs (pystate.py); ``loops``: Python
loops over time steps and layers, which the compiler rolls into loop nodes (loops.py).
"""

from __future__ import annotations

import random

from . import layers, loops, models, optimizers, pystate
from .generator import Program
from .generator import generate as generate_ops
from .scenario import Scenario

GENERATORS = {"ops": generate_ops, "layers": layers.generate, "models": models.generate, "optim": optimizers.generate,
              "pystate": pystate.generate, "loops": loops.generate}  # fmt: skip
# the default mix: op programs are the cheapest and cover the most ops
WEIGHTS = {"ops": 2, "layers": 2, "models": 1, "optim": 1, "pystate": 1, "loops": 1}


def parse_kinds(text: str) -> tuple[str, ...]:
    """``"models,optim"`` -> ("models", "optim"); ``"all"`` -> every kind."""
    kinds = tuple(GENERATORS) if text == "all" else tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in GENERATORS]
    if unknown or not kinds:
        raise SystemExit(f"--kinds: expected 'all' or a comma-separated list of {', '.join(GENERATORS)}; got {text!r}")
    return kinds


def generate(seed: int, kinds: tuple[str, ...] = tuple(GENERATORS)) -> Program:
    """The program of ``seed`` among ``kinds`` (with one kind, the same program as its generator's)."""
    kind = kinds[0] if len(kinds) == 1 else random.Random(seed).choices(kinds, [WEIGHTS[k] for k in kinds])[0]
    return GENERATORS[kind](seed)


def from_source(text: str) -> Program:
    """A program printed by an earlier run, of any kind."""
    return Scenario.from_source(text) if "# caller: kind " in text else Program.from_source(text)
