"""kiln.explain: graphs, node counts, guards, trace breaks with their lines, recompilation reasons."""

from __future__ import annotations

import inspect

import kiln


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
    assert "argument 0: f32[5, 3]" in text  # a guard, in words
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


def test_explain_of_a_compiled_module_and_a_not_cached_first_step():
    model = kiln.nn.Linear(3, 1)
    opt = kiln.optim.Adam(model.parameters())

    def step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    report = kiln.explain(step, kiln.randn(4, 3))
    assert report.not_cached and "optimizer" in report.not_cached[0]
    compiled = kiln.compile(kiln.nn.Linear(3, 2))
    text = str(kiln.explain(compiled, kiln.randn(2, 3)))
    assert "Linear.training == True" in text
