"""A module constructed inside a compiled function is the call's own local: traced through, its
parameters computed by the graph (random initialisation included, from the generator's state, as
eagerly), never guarded -- it used to retrace on every call ("module NoneType was freed")."""

from __future__ import annotations

import kiln
from kiln import nn
from tests.conftest import assert_close
from tests.frontend.jit.helpers import compiled_calls


def test_stateless_modules_made_in_forward_compile_once():
    @kiln.compile
    def f(x):
        return nn.Softmax(dim=-1)(nn.ReLU()(x)) + nn.Dropout(0.5).eval()(x)

    for _ in range(5):
        x = kiln.randn(3, 4)
        assert_close(f(x), kiln.softmax(kiln.relu(x), -1) + x, rtol=1e-6, atol=1e-6)
    report = kiln.explain(f, x)
    assert "1 specialization(s), 0 trace break(s), 0 recompilation(s)" in report.summary()
    assert sum(compiled_calls(f)) >= 4


def test_layers_with_parameters_made_in_forward_match_eager_with_their_random_init():
    def g(x):
        return nn.LayerNorm(3, dtype=kiln.float64)(nn.Linear(4, 3, dtype=kiln.float64)(x)).tanh()

    compiled = kiln.compile(g)
    x = kiln.randn(2, 4, dtype=kiln.float64, requires_grad=True)
    for seed in range(4):
        kiln.manual_seed(seed)
        expected = g(x)
        (grad_expected,) = kiln.autograd.grad(expected.sum(), x)
        kiln.manual_seed(seed)
        got = compiled(x)
        (grad_got,) = kiln.autograd.grad(got.sum(), x)
        assert_close(got, expected, rtol=1e-10, atol=1e-12)
        assert_close(grad_got, grad_expected, rtol=1e-10, atol=1e-12)
    assert "1 specialization(s), 0 trace break(s)" in kiln.explain(compiled, x).summary()


def test_a_module_from_outside_is_still_guarded():
    outside = nn.Dropout(0.5)

    @kiln.compile
    def h(x):
        return outside(x)

    x = kiln.ones(4)
    outside.eval()
    h(x), h(x)
    outside.train()
    kiln.manual_seed(0)
    y = h(x)
    assert set(y.tolist()) <= {0.0, 2.0}  # dropout in training mode: a new trace, not the eval one
