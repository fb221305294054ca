"""kiln.compile basics: decorator forms, functions, methods, modules, nested arguments and results.

Reference everywhere: the same function run eagerly on clones of the inputs. The first call of a
specialization is the traced eager run, so each test calls at least three times and checks that
the compiled program ran (one specialization whose ``calls`` grows).
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn

from .helpers import assert_tree_close, check_against_eager, clone_tree, compiled_calls, state_of

RTOL, ATOL = 1e-6, 1e-7


def _xy():
    kiln.manual_seed(0)
    return kiln.randn(3, 4), kiln.randn(4)


def test_decorator_without_arguments_compiles_and_reuses_one_specialization():
    @kiln.compile
    def f(x, y):
        return (x * y).sum(dim=1) + kiln.exp(y).mean()

    x, y = _xy()
    expected = f.fn(x, y)
    for i in range(4):
        assert_tree_close(f(x, y), expected, rtol=RTOL, atol=ATOL)
        assert len(f.state.specializations) == 1
        assert compiled_calls(f) == [i]  # the first call is the traced eager run
    assert [e.kind for e in f.state.events] == ["compiled"]
    assert isinstance(f, kiln.jit.CompiledFunction)
    assert f.__name__ == "f"


def test_decorator_with_arguments():
    @kiln.compile(fullgraph=True, options=kiln.CompileOptions(recompile_limit=3, verify=True))
    def f(x, y):
        return kiln.tanh(x) - y

    x, y = _xy()
    for _ in range(3):
        assert_tree_close(f(x, y), kiln.tanh(x) - y, rtol=RTOL, atol=ATOL)
    assert f.fullgraph and f.options.recompile_limit == 3
    assert compiled_calls(f) == [2]


def test_compile_called_as_a_function():
    def f(x):
        return x.relu() * 2

    x, _ = _xy()
    g = kiln.compile(f)
    check_against_eager(f, lambda: (x.clone(),), calls=3)
    for _ in range(3):
        g(x)
    assert compiled_calls(g) == [2]


def test_bad_arguments_to_compile():
    with pytest.raises(TypeError, match="function, method or nn.Module"):
        kiln.compile(3)
    with pytest.raises(TypeError, match="CompileOptions"):
        kiln.compile(lambda x: x, options={"recompile_limit": 2})
    with pytest.raises(ValueError, match="recompile_limit"):
        kiln.CompileOptions(recompile_limit=-1)
    with pytest.raises(ValueError, match="backend"):
        kiln.CompileOptions(backend="nope")


class Scaler:
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.w = kiln.full((4,), scale)

    @kiln.compile
    def apply(self, x):
        return x * self.w + 1

    def plain(self, x):
        return x * self.w - self.scale


def test_compile_in_a_class_body_binds_like_a_method():
    x, _ = _xy()
    a, b = Scaler(2.0), Scaler(3.0)
    for _ in range(3):
        assert_tree_close(a.apply(x), x * 2.0 + 1, rtol=RTOL, atol=ATOL)
        assert_tree_close(b.apply(x), x * 3.0 + 1, rtol=RTOL, atol=ATOL)
    # Both instances share one CompiledFunction; ``self`` is guarded by identity: one specialization each.
    calls = compiled_calls(Scaler.__dict__["apply"])
    assert len(calls) == 2 and calls == [2, 2]


def test_compile_a_bound_method():
    x, _ = _xy()
    s = Scaler(1.5)
    g = kiln.compile(s.plain)
    for _ in range(3):
        assert_tree_close(g(x), s.plain(x), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [2]
    s.w.mul_(2)  # the captured attribute tensor is read at each call
    assert_tree_close(g(x), s.plain(x), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [3]


def _mlp(seed: int):
    kiln.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 2))


def test_compiled_module_is_the_module():
    m = _mlp(0)
    cm = kiln.compile(m)
    assert isinstance(cm, nn.Module)
    assert [id(p) for p in cm.parameters()] == [id(p) for p in m.parameters()]
    assert list(cm.state_dict()) == list(m.state_dict())
    for k, v in cm.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), m.state_dict()[k].numpy())
    cm.eval()
    assert not m.training and not cm.training and all(not s.training for s in m.modules())
    cm.train()
    assert m.training and cm.training
    m.eval()
    assert not cm.training
    # load_state_dict through the compiled module reaches the same parameter objects
    other = _mlp(1)
    cm.load_state_dict(other.state_dict())
    np.testing.assert_array_equal(m[0].weight.detach().numpy(), other[0].weight.detach().numpy())


def test_compiled_module_output_equals_eager_and_reads_updated_parameters():
    m = _mlp(0).eval()
    cm = kiln.compile(m)
    kiln.manual_seed(1)
    x = kiln.randn(5, 4)
    for _ in range(3):
        assert_tree_close(cm(x), m(x), rtol=RTOL, atol=ATOL)
    assert compiled_calls(cm) == [2]
    with kiln.no_grad():
        m[0].weight.mul_(-0.5)  # parameters are read at each call, never baked in
        m[3].bias.add_(1.0)
    assert_tree_close(cm(x), m(x), rtol=RTOL, atol=ATOL)
    assert compiled_calls(cm) == [3]


def test_nested_arguments_and_results_with_plain_values():
    def f(inputs, scale, mode):
        a, (b, c) = inputs["pair"], inputs["rest"]
        out = a * scale + b.sum(dim=0)
        return {"out": out, "parts": [c - 1, (a.T, mode)]}, [scale, None]

    def make():
        kiln.manual_seed(3)
        return ({"pair": kiln.randn(2, 3), "rest": [kiln.randn(4, 3), kiln.randn(1)]}, 2.5, "fast")

    g = check_against_eager(f, make, calls=3, rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [2]


def test_nested_tensor_results_only():
    def f(inputs):
        a, (b, c) = inputs["pair"], inputs["rest"]
        return {"out": a + b.sum(dim=0), "parts": [c - 1, (a.T,)]}

    def make():
        kiln.manual_seed(3)
        return ({"pair": kiln.randn(2, 3), "rest": (kiln.randn(4, 3), kiln.randn(1))},)

    g = check_against_eager(f, make, calls=3, rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [2]


def test_an_input_returned_as_output_is_the_same_object():
    @kiln.compile
    def f(x, y):
        return x, y * 2, [y]

    x, y = _xy()
    for _ in range(3):
        a, b, (c,) = f(x, y)
        assert a is x and c is y
        assert b is not y and not np.shares_memory(b.numpy(), y.numpy())
    assert compiled_calls(f) == [2]


@pytest.mark.parametrize(
    "fn",
    [lambda x: (x + 0, x * 1), lambda x: (x.reshape(12) * 1, x.T + 0)],
    ids=["identity-like", "view-of-input"],
)
def test_results_the_passes_reduce_to_an_input_do_not_alias_it(fn):
    # x + 0 and x * 1 simplify to x (or to a view of x): the result is still a new tensor, as in eager.
    f = kiln.compile(fn)
    x, _ = _xy()
    before = x.numpy().copy()
    for _ in range(3):
        a, b = f(x)
        assert a is not x and b is not x
        assert not np.shares_memory(a.numpy(), x.numpy()) and not np.shares_memory(b.numpy(), x.numpy())
        a.add_(1)
        b.add_(1)
        np.testing.assert_array_equal(x.numpy(), before)
    assert compiled_calls(f) == [2]


def test_kwargs_are_arguments():
    def f(x, *, bias, power=2):
        return x**power + bias

    g = kiln.compile(f)
    x, y = _xy()
    for _ in range(3):
        assert_tree_close(g(x, bias=y), f(x, bias=y), rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [2]
    assert_tree_close(g(x, bias=y, power=3), f(x, bias=y, power=3), rtol=RTOL, atol=ATOL)
    assert len(state_of(g).specializations) == 2


def test_views_returned_from_compiled_calls_have_eager_values():
    def f(x):
        return x.T, x[1:, ::2], x.reshape(2, 6).sum(dim=1)

    x, _ = _xy()
    g = check_against_eager(f, lambda: (clone_tree(x),), calls=3, rtol=RTOL, atol=ATOL)
    assert compiled_calls(g) == [2]


def test_graph_and_repr():
    @kiln.compile
    def f(x):
        return kiln.sin(x) + 1

    assert f.graph is None
    x, _ = _xy()
    f(x)
    text = str(f.graph)
    assert "sin" in text and "test_compile_basics.py" in text
    assert "1 specialization" in repr(f)


def test_kiln_jit_0_gives_plain_eager(monkeypatch):
    monkeypatch.setenv("KILN_JIT", "0")

    @kiln.compile
    def f(x):
        return x * 3

    x, _ = _xy()
    for _ in range(3):
        assert_tree_close(f(x), x * 3, rtol=0, atol=0)
    assert f.state.specializations == [] and f.state.events == []
    m = kiln.compile(_mlp(0).eval())
    m(x)
    assert state_of(m).specializations == []
