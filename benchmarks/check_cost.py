"""What the value checks of a compiled program cost: an embedding + cross-entropy training step.

One step is ``zero_grad(); cross_entropy(head(embedding(tokens)), target).backward(); SGD.step()``
(momentum 0.9), compiled for the LLVM backend. Its program keeps two ``check`` nodes (the
embedding's indices and the targets; the index_select's, the gather's and their backward's are
merged into them). The reference is the same traced graph with its check nodes removed by one
more pass, timed in the same process, interleaved: ``kiln / no checks`` is the checks' cost.
Both step the same model from the same weights; the check compares their parameters.
Run it alone with ``python -m benchmarks.check_cost [--quick]`` or through ``python -m benchmarks.run``.
"""

from __future__ import annotations

import sys

import numpy as np

import kiln

from .common import KILN, Result, compare

WORKLOAD = "checks"
CASES = [(100, 16, 32), (1000, 64, 256)]  # vocabulary, embedding width, tokens per batch
NO_CHECKS = "kiln, no checks"


def strip_checks(graph):
    """``graph`` without its check nodes (what the checks cost is measured against)."""
    from kiln.ir.graph import Graph  # noqa: PLC0415
    from kiln.passes import eliminate_dead_code  # noqa: PLC0415

    nodes = tuple(n for n in graph.nodes if n.op != "check")
    return eliminate_dead_code(Graph(graph.inputs, nodes, graph.outputs, graph.constants))


def make_step(vocab: int, width: int, passes):
    kiln.manual_seed(0)
    embedding, head = kiln.nn.Embedding(vocab, width), kiln.nn.Linear(width, vocab)
    params = list(embedding.parameters()) + list(head.parameters())
    optimizer = kiln.optim.SGD(params, lr=0.1, momentum=0.9)

    def step(tokens, target):
        optimizer.zero_grad()
        loss = kiln.nn.functional.cross_entropy(head(embedding(tokens)), target)
        loss.backward()
        optimizer.step()
        return loss

    return kiln.compile(step, options=kiln.CompileOptions(passes=passes)), params


def _case(vocab: int, width: int, batch: int, quick: bool) -> list[Result]:
    from kiln.passes import DEFAULT_PIPELINE  # noqa: PLC0415

    rng = np.random.default_rng(0)
    tokens, target = kiln.tensor(rng.integers(0, vocab, batch)), kiln.tensor(rng.integers(0, vocab, batch))
    steps = {KILN: make_step(vocab, width, None), NO_CHECKS: make_step(vocab, width, (*DEFAULT_PIPELINE, strip_checks))}
    for step, _ in steps.values():
        for _ in range(4):  # trace, then the momentum buffers exist: the compiled program runs from here
            step(tokens, target)
    (checked, with_params), (stripped, without_params) = steps[KILN], steps[NO_CHECKS]
    same = all(np.array_equal(p.detach().numpy(), q.detach().numpy()) for p, q in zip(with_params, without_params))
    counts = [step.graph.op_counts().get("check", 0) for step in (checked, stripped)]
    ok = same and counts[0] > 0 and counts[1] == 0
    check = f"{'ok' if ok else 'FAIL'}: same parameters after 4 steps {same}; check nodes {counts[0]} and {counts[1]}"
    timings = compare(
        {impl: (lambda s=step: s(tokens, target), None) for impl, (step, _) in steps.items()}, quick=quick
    )
    case = f"embedding {vocab}x{width} + cross-entropy, batch {batch}, SGD"
    params = {"vocab": vocab, "width": width, "batch": batch}
    return [Result(WORKLOAD, case, impl, t, params=params, check=check) for impl, t in timings.items()]


def run(quick: bool = False) -> list[Result]:
    return [r for vocab, width, batch in CASES for r in _case(vocab, width, batch, quick)]


if __name__ == "__main__":
    from .run import main

    sys.exit(main([*sys.argv[1:], WORKLOAD]))
