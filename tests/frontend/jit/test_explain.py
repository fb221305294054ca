"""kiln.explain: graphs, node counts, guards, trace breaks with their lines, recompilation reasons."""

from __future__ import annotations

import inspect

import numpy as np

import kiln

from .helpers import mean_square_step


def _line_of(fn, marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def test_report_lists_graphs_guards_and_recompilations():
    w = kiln.randn(3, 2)

    def f(x):
        return (x @ w).relu().sum(0)

    compiled = kiln.compile(f)
    compiled(kiln.randn(4, 3))
    report = kiln.explain(compiled, kiln.randn(5, 3))
    assert len(report.specializations) == len(report.graphs) == 2
    text = str(report)
    assert "2 specialization(s)" in text and "1 recompilation(s)" in text
    assert "argument 0: shape (4, 3) -> (5, 3)" in text
    assert "matmul x1" in text
    assert "argument 0: f32[dynamic0, 3]" in text  # a guard, in words: the second size made the batch dynamic
    assert "1 captured: w f32[3,2]" in text  # named as the function names it
    assert "captured tensor(s)" in text and "f32[3, 2]" in text
    assert f'test_explain.py":{_line_of(f, "relu")}' in text  # the graph carries source lines


def test_plain_functions_are_compiled_and_breaks_name_the_line():
    def g(x):
        y = x * 2
        if y.sum() > 0:  # BREAK
            return y
        return -y

    report = kiln.explain(g, kiln.ones(3))
    assert report.specializations == []
    assert len(report.breaks) == 1
    assert "bool(Tensor)" in report.breaks[0]
    assert f":{_line_of(g, '# BREAK')}" in report.breaks[0]
    assert "Trace breaks" in str(report)


def test_explain_of_a_compiled_module_and_a_fresh_optimizers_first_step():
    model = kiln.nn.Linear(3, 1)
    step = mean_square_step(model, kiln.optim.Adam(model.parameters()))
    report = kiln.explain(step, kiln.randn(4, 3))  # the first step makes Adam's state: still compiled
    assert len(report.specializations) == 1 and not report.not_cached, report.summary()
    compiled = kiln.compile(kiln.nn.Linear(3, 2))
    text = str(kiln.explain(compiled, kiln.randn(2, 3)))
    assert "Linear.training == True" in text


def test_summary_lists_inputs_outputs_kernels_memory_and_guards_then_the_ir():
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Linear(8, 16), kiln.nn.ReLU(), kiln.nn.Linear(16, 4))
    opt = kiln.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        loss = kiln.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = kiln.compile(step)
    x, y = kiln.randn(5, 8), kiln.tensor([0, 1, 2, 3, 0])
    for _ in range(3):
        compiled(x, y)
    report = kiln.explain(compiled)
    summary, text = report.summary(), str(report)
    spec = report.specializations[-1]
    kernels = [n for n in spec.graph.nodes if n.op == "kernel"]
    assert kernels
    assert (
        "inputs:  argument 0 f32[5,8], argument 1 i64[5]; 5 captured: model.0.weight f32[16,8], model.0.bias "
        "f32[16], model.2.weight f32[4,16], model.2.bias f32[4], opt.param_groups[0]['lr'] f64[]" in summary
    )
    assert "outputs: result 0 f32[]" in summary
    assert "writes back 4 input(s) changed in place" in summary  # the SGD update of each parameter
    for node in kernels:  # one line per kernel: name, kind, the ops it fuses, where the user made them
        line = next(line for line in summary.splitlines() if line.strip().startswith(node.attrs["name"] + " "))
        assert node.attrs["kind"] in line and "test_explain.py:" in line
        assert all(op in line for body in node.bodies for op in (n.op for n in body.nodes) if op != "constant")
    assert "memory plan: arena" in summary and "eager would hold" in summary
    assert "argument 0: f32[5, 8] strides (32, 4)" in summary  # a guard
    # the first call's new .grad (read by zero_grad's second call) makes no second specialization
    assert "made because first call" in summary and "Recompilations:" not in summary
    assert "graph(" not in summary and "Full IR" not in summary
    assert text.startswith(summary) and "Full IR" in text and str(spec.graph).splitlines()[0] in text
    assert len(summary) < len(text) / 2


def test_to_dot_draws_each_specialization_and_marks_trace_breaks():
    from tests.ir.test_dot import parse_dot

    def g(x):
        y = (x * 2).exp()
        if x.shape[0] > 3 and y.sum() > 0:  # BREAK
            return y
        return y + 1

    compiled = kiln.compile(g)
    for _ in range(2):
        compiled(kiln.ones(2))  # compiled: the branch does not read a value for 2 elements
    compiled(kiln.ones(5))  # breaks
    report = kiln.explain(compiled)
    parsed = parse_dot(report.to_dot())
    assert parsed["clusters"]["cluster_s1_"] == "specialization 1: 1 kernel(s)"
    breaks = [label for label, attrs, _ in parsed["nodes"].values() if "octagon" in attrs]
    assert len(breaks) == 1 and "bool(Tensor)" in breaks[0] and f":{_line_of(g, '# BREAK')}" in breaks[0]
    labels = [label for label, _, _ in parsed["nodes"].values()]
    assert "argument 0\n%0: f32[2]" in labels and "result 0\n" in "".join(labels)


def test_to_dot_draws_the_compiled_backward_next_to_the_forward():
    from tests.ir.test_dot import parse_dot

    w = kiln.randn(4, 3, requires_grad=True)

    def f(x):
        return (x @ w).tanh().sum()

    compiled = kiln.compile(f)
    x = kiln.randn(2, 4)
    for _ in range(2):
        compiled(x).backward()
    expected = (1 - (x @ w).tanh() ** 2).detach()
    np.testing.assert_allclose(w.grad.numpy(), 2 * (x.T @ expected).numpy(), rtol=1e-5, atol=1e-6)
    spec = kiln.explain(compiled).specializations[0]
    assert spec.backward is not None
    parsed = parse_dot(kiln.explain(compiled).to_dot())
    assert parsed["clusters"]["cluster_s1b_"].startswith("specialization 1, compiled backward")
    labels = [label for label, _, within in parsed["nodes"].values() if "cluster_s1b_" in within]
    assert any(label.startswith("gradient of result 0") for label in labels)
    assert any(
        "saved for backward" in label for label, _, within in parsed["nodes"].values() if "cluster_s1_" in within
    )


def test_a_call_that_ran_backward_through_its_results_is_explained_and_drawn():
    """A training step that returns its loss undetached: the call consumed the results' graph, so
    there is no compiled backward to show (explain used to fail on it)."""
    w = kiln.randn(3, 2, requires_grad=True)

    def step(x):
        loss = (x @ w).relu().sum()
        loss.backward()
        return loss

    compiled = kiln.compile(step)
    for _ in range(3):
        loss = compiled(kiln.randn(4, 3))
    assert loss.requires_grad
    report = kiln.explain(compiled)
    text = str(report)
    assert "the call ran backward through its results itself" in text
    assert "backward graph" not in text and "Full IR" in text
    assert "compiled backward" not in report.to_dot()
