"""Property tests: random chains of ops over random shapes give the same results compiled (third
call) and eager; every graph produced verifies and survives the printer/parser round trip exactly.

Hypothesis settings come from the profile tests/conftest.py loads ('ci' or 'dev').
"""

from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
given = hypothesis.given

import kiln  # noqa: E402
from kiln.ir.graph import Graph, qualified_constants  # noqa: E402
from kiln.ir.parser import parse_graph  # noqa: E402
from kiln.ir.printer import print_graph  # noqa: E402
from kiln.ir.verifier import verify  # noqa: E402

from .helpers import assert_tree_close, clone_tree, compiled_calls  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5

UNARY = {
    "tanh": kiln.tanh,
    "sin": kiln.sin,
    "neg": lambda t: -t,
    "abs": kiln.abs,
    "sigmoid": kiln.sigmoid,
    "relu": lambda t: t.relu(),
    "square": lambda t: t * t,
    "scale": lambda t: t * 0.5 + 1.0,
}
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "maximum": kiln.maximum,
    "rsub": lambda a, b: b - a,
}
INPLACE = {
    "add_": lambda t, b: t.add_(b),
    "mul_": lambda t, b: t.mul_(b),
    "clamp_": lambda t, b: t.clamp_(-1.0, 1.0),
}


def _broadcast_shape(draw, shape: tuple) -> tuple:
    """A shape that broadcasts to ``shape``: leading dims dropped, some dims set to 1."""
    drop = draw(st.integers(0, len(shape)))
    tail = shape[drop:]
    return tuple(1 if draw(st.booleans()) else n for n in tail)


@st.composite
def chains(draw, allow_input_mutation: bool = True):
    """(inputs, ops): inputs[0] is x; ops act on the running tensor, binary ones on another input."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    shapes = [shape]
    ops = []
    current = np.empty(shape)
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "view", "view", "inplace", "mutate_input"]))
        nd = current.ndim
        if kind == "unary":
            ops.append(("unary", draw(st.sampled_from(sorted(UNARY)))))
        elif kind in ("binary", "inplace"):
            other = _broadcast_shape(draw, current.shape)
            shapes.append(other)
            name = draw(st.sampled_from(sorted(BINARY if kind == "binary" else INPLACE)))
            view = kind == "inplace" and nd >= 1 and current.shape[0] > 1 and draw(st.booleans())
            if view:  # write through a view of the intermediate: t[1:] op= y
                shapes[-1] = _broadcast_shape(draw, (current.shape[0] - 1,) + current.shape[1:])
            ops.append((kind, name, len(shapes) - 1, view))
        elif kind == "reduce" and nd >= 1:
            dim = draw(st.integers(-nd, nd - 1))
            keepdim = draw(st.booleans())
            name = draw(st.sampled_from(["sum", "mean", "amax"]))
            ops.append(("reduce", name, dim, keepdim))
            current = current.sum(axis=dim, keepdims=keepdim)
        elif kind == "view" and nd >= 1:
            choice = draw(st.sampled_from(["permute", "transpose", "slice", "reshape", "flatten", "unsqueeze"]))
            if choice == "permute":
                perm = tuple(draw(st.permutations(range(nd))))
                ops.append(("view", choice, perm))
                current = current.transpose(perm)
            elif choice == "transpose":
                a, b = draw(st.integers(0, nd - 1)), draw(st.integers(0, nd - 1))
                ops.append(("view", choice, (a, b)))
                current = np.swapaxes(current, a, b)
            elif choice == "slice":
                dim = draw(st.integers(0, nd - 1))
                start = draw(st.integers(0, max(current.shape[dim] - 1, 0)))
                step = draw(st.integers(1, 2))
                ops.append(("view", choice, (dim, start, step)))
                index = [slice(None)] * nd
                index[dim] = slice(start, None, step)
                current = current[tuple(index)]
            elif choice == "reshape":
                ops.append(("view", choice, current.shape[::-1]))
                current = current.reshape(current.shape[::-1])
            elif choice == "flatten":
                ops.append(("view", choice, None))
                current = current.reshape(-1)
            else:
                dim = draw(st.integers(0, nd))
                ops.append(("view", choice, dim))
                current = np.expand_dims(current, dim)
        elif kind == "mutate_input" and allow_input_mutation:
            ops.append(("mutate_input", draw(st.sampled_from(["add_", "setitem"]))))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    inputs = [kiln.tensor(rng.uniform(-2, 2, s).astype(np.float32)) for s in shapes]
    return inputs, ops


def _apply(ops, inputs):
    t = inputs[0]
    for op in ops:
        kind = op[0]
        if kind == "unary":
            t = UNARY[op[1]](t)
        elif kind == "binary":
            t = BINARY[op[1]](t, inputs[op[2]])
        elif kind == "inplace":
            t = t * 1.0  # an intermediate, never an input
            target = t[1:] if op[3] else t
            INPLACE[op[1]](target, inputs[op[2]])
        elif kind == "reduce":
            t = getattr(t, op[1])(dim=op[2], keepdim=op[3])
        elif kind == "view":
            name, arg = op[1], op[2]
            if name == "permute":
                t = t.permute(*arg)
            elif name == "transpose":
                t = t.transpose(*arg)
            elif name == "slice":
                dim, start, step = arg
                index = [slice(None)] * t.ndim
                index[dim] = slice(start, None, step)
                t = t[tuple(index)]
            elif name == "reshape":
                t = t.reshape(arg)
            elif name == "flatten":
                t = t.reshape(-1)
            else:
                t = t.unsqueeze(arg)
        elif kind == "mutate_input":
            x = inputs[0]
            if op[1] == "add_":
                x.add_(0.25)
            elif x.ndim >= 1:
                x[0] = 3.0
            else:
                x.fill_(3.0)
    return t, t.sum()


def _graphs(compiled) -> list:
    graphs = [compiled.graph]
    for spec in compiled.state.specializations:
        graphs.append(spec.traced_graph)
        graphs.extend(g for _, g in spec.passes_record if isinstance(g, Graph))
        if spec.backward is not None:
            graphs.append(spec.backward.graph)
    return [g for g in graphs if g is not None]


def _check_graphs(compiled) -> None:
    for g in _graphs(compiled):
        verify(g)
        text = print_graph(g)
        again = parse_graph(text, qualified_constants(g))
        assert print_graph(again) == text
        verify(again)


@given(chains())
def test_random_chains_compiled_equal_eager(case):
    inputs, ops = case
    f = kiln.compile(lambda *xs: _apply(ops, list(xs)))
    for _ in range(3):
        args = clone_tree(inputs)
        eager_args = clone_tree(inputs)
        expected = _apply(ops, eager_args)
        got = f(*args)
        assert_tree_close(got, expected, rtol=RTOL, atol=ATOL)
        assert_tree_close(args, eager_args, rtol=RTOL, atol=ATOL, path="inputs after the call")
    assert compiled_calls(f) == [2]
    _check_graphs(f)


@given(chains(allow_input_mutation=False))
def test_random_chains_gradients_through_compiled_equal_eager(case):
    inputs, ops = case
    inputs = [x.double().requires_grad_(True) for x in inputs]
    f = kiln.compile(lambda *xs: _apply(ops, list(xs))[1])
    for _ in range(3):
        args, eager_args = clone_tree(inputs), clone_tree(inputs)
        got, expected = f(*args), _apply(ops, eager_args)[1]
        assert_tree_close(got.detach(), expected.detach(), rtol=1e-10, atol=1e-10)
        got.backward()
        expected.backward()
        for a, e in zip(args, eager_args, strict=True):
            assert (a.grad is None) == (e.grad is None)
            if e.grad is not None:
                np.testing.assert_allclose(a.grad.numpy(), e.grad.numpy(), rtol=1e-10, atol=1e-10)
    assert compiled_calls(f) == [2]
    _check_graphs(f)


def test_verify_and_round_trip_on_training_step_graphs():
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Linear(4, 8), kiln.nn.ReLU(), kiln.nn.Dropout(0.2), kiln.nn.Linear(8, 2))
    opt = kiln.optim.Adam(model.parameters(), lr=1e-2)

    @kiln.compile(options=kiln.CompileOptions(verify=True))
    def step(x, y):
        opt.zero_grad()
        loss = kiln.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    x, y = kiln.randn(5, 4), kiln.randn(5, 2)
    for _ in range(4):
        step(x, y)
    assert step.state.specializations and sum(compiled_calls(step)) >= 2
    _check_graphs(step)
