"""Draws the pictures the docs show: ``python docs/pictures/make_pictures.py`` (SVG needs Graphviz's dot).

- ``mlp.dot``/``mlp.svg``: the exported MLP of docs/cli.md after fusion (``kiln draw mlp.kiln --fused``);
- ``first_step.dot``/``first_step.svg``: the README's first compiled training step, as ``kiln.explain`` draws it;
- ``first_step_memory.dot``/``.svg``: that step's memory plan over time (``ExplainReport.memory_to_dot``).

tests/test_readme.py checks that the committed ``.dot`` files are what this script draws.
"""

from __future__ import annotations

import sys
from pathlib import Path

import kiln
import kiln.nn.functional as F
from kiln import nn
from kiln.__main__ import fused_graph, signature_labels
from kiln.ir.dot import dot_available, render

HERE = Path(__file__).resolve().parent


def mlp_dot() -> str:
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10), nn.Softmax(-1))
    program = kiln.export(model, kiln.randn(8, 64))
    graph = fused_graph(program)
    inputs, outputs = signature_labels(program.signature, graph)
    return graph.to_dot(name="mlp.kiln", input_labels=inputs, output_labels=outputs)


def first_step_dot() -> str:
    return _first_step_report().to_dot(collapse_kernels=True)


def first_step_memory_dot() -> str:
    return _first_step_report().memory_to_dot()


def _first_step_report():
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = kiln.optim.Adam(model.parameters(), lr=1e-3)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = kiln.compile(step)
    x, y = kiln.randn(128, 64), kiln.randint(0, 10, (128,))
    for _ in range(3):
        compiled(x, y)
    return kiln.explain(compiled, x, y)


PICTURES = {"mlp": mlp_dot, "first_step": first_step_dot, "first_step_memory": first_step_memory_dot}


def main() -> None:
    for name, draw in PICTURES.items():
        text = draw()
        render(text, HERE / f"{name}.dot")
        if dot_available():
            render(text, HERE / f"{name}.svg")
        print(f"wrote {name}.dot" + (" and .svg" if dot_available() else " (no Graphviz here: no .svg)"))


if __name__ == "__main__":
    sys.exit(main())
