"""The user's line of each traced op, found once per stretch of kiln's own code (issue 33).

A traced op's node carries the user's source line (errors of compiled calls and ``kiln.explain``
show it). Finding it walks the stack up from the op; the engine's backward, a kiln module's
forward and an optimizer's step run thousands of ops below one user line, so the trace finds that
line once per such call (``state.unwatched`` pins it) -- but the ops of user code that kiln's code
runs still get their own lines.
"""

from __future__ import annotations

import inspect

import numpy as np

import kiln
from kiln.frontend.jit import trace as trace_module

from .helpers import array, compiled_calls

RTOL, ATOL = 1e-5, 1e-6


def _line(marker: str) -> int:
    """The line of this file that ends with the comment ``# <marker>``."""
    lines = inspect.getsource(inspect.getmodule(_line)).splitlines()
    (found,) = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    return found


def _lines_of(g) -> dict[str, set[int]]:
    """Each traced op's lines in this file (every traced node must have one here)."""
    (spec,) = g.state.specializations
    found: dict[str, set[int]] = {}
    for node in spec.traced_graph.nodes:
        if node.op == "constant":
            continue
        assert node.loc is not None and node.loc.filename == __file__, f"{node.op} at {node.loc}"
        found.setdefault(node.op, set()).add(node.loc.line)
    return found


def _counting_walks(monkeypatch) -> list:
    calls: list = []
    walk = trace_module.user_location

    def counted(depth: int = 2):
        calls.append(depth)
        return walk(depth + 1)

    monkeypatch.setattr(trace_module, "user_location", counted)
    return calls


def _training_step(model, opt):
    def step(x, y):
        out = model(x)  # forward
        loss = ((out - y) ** 2).mean()  # loss
        loss.backward()  # backward
        opt.step()  # step
        opt.zero_grad()
        return loss.detach()

    return step


def _model_and_optimizer(state=None):
    model = kiln.nn.Sequential(kiln.nn.Linear(4, 8), kiln.nn.Tanh(), kiln.nn.Linear(8, 1))
    if state is not None:
        model.load_state_dict(state)
    return model, kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_the_ops_of_a_backward_and_a_step_have_the_users_lines_found_once_per_call(monkeypatch):
    kiln.manual_seed(0)
    model, opt = _model_and_optimizer()
    eager_step = _training_step(*_model_and_optimizer(model.state_dict()))
    walks = _counting_walks(monkeypatch)
    g = kiln.compile(_training_step(model, opt), wait=True)
    x, y = kiln.ones(5, 4) * 0.3, kiln.zeros(5, 1)
    for _ in range(3):
        np.testing.assert_allclose(array(g(x, y)), array(eager_step(x, y)), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [2]
    lines = _lines_of(g)
    assert set().union(*lines.values()) == {_line("forward"), _line("loss"), _line("backward"), _line("step")}
    assert _line("backward") in lines["matmul"] and _line("step") in lines["mul"]
    nodes = len(g.state.specializations[0].traced_graph.nodes)
    # one walk per op before (71); now one per op called from the user's code, kiln module called
    # and call of the engine or the optimizer (24)
    assert len(walks) < nodes / 2, (len(walks), nodes)


class _Scaled(kiln.autograd.Function):
    # A user's Function that claims to run kiln's code only: the watch is paused around it, yet its
    # ops are the user's, at the lines of its forward and backward.
    kiln_only = True

    @staticmethod
    def forward(ctx, x):
        return x * 2.0  # function forward

    @staticmethod
    def backward(ctx, grad):
        return grad * 3.0  # function backward


def test_a_users_function_marked_kiln_only_keeps_the_lines_of_its_own_code():
    def f(x):
        loss = _Scaled.apply(x).sum()  # apply
        loss.backward()  # function's caller
        return loss.detach()

    g = kiln.compile(f, wait=True)
    x = kiln.ones(3, requires_grad=True)
    g(x)
    lines = _lines_of(g)
    assert lines["mul"] == {_line("function forward"), _line("function backward")}
    assert _line("function's caller") not in lines["mul"]
    np.testing.assert_allclose(array(x.grad), [3.0, 3.0, 3.0])
