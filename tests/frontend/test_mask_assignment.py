"""``x[mask] = value`` with one value for every selected element is ``where(mask, value, x)``: the same
result and gradients as PyTorch's, and a compiled function keeps it in its graph (it used to stop the
trace through ``nonzero``'s data-dependent shape)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close

rng = np.random.default_rng(5)

# (x's shape, the mask's shape, value): values the same for every selected element
CASES = [
    ((4, 3), (4, 3), 0.0),
    ((4, 3), (4,), 2.5),
    ((4, 3), (4,), np.array([1.0, 2.0, 3.0])),  # one row for every selected row
    ((2, 3, 2), (2, 3), np.array([[-1.0, 1.0]])),  # leading size-1 dims dropped, as PyTorch does
    ((5,), (5,), np.array(7.0)),
    ((3, 2), (3, 2), np.array([4.0])),
]


def _assign(x, mask, value):
    y = x * 1.0
    y[mask] = value
    return y


@pytest.mark.parametrize("shape,mask_shape,value", CASES)
def test_matches_torch(torch, shape, mask_shape, value):
    x, mask = rng.normal(size=shape), rng.uniform(size=mask_shape) < 0.5
    as_kiln = kiln.tensor(value) if isinstance(value, np.ndarray) else value
    as_torch = torch.tensor(value) if isinstance(value, np.ndarray) else value
    expected = _assign(torch.tensor(x), torch.tensor(mask), as_torch)
    assert_close(_assign(kiln.tensor(x), kiln.tensor(mask), as_kiln), expected, rtol=0, atol=0)


def test_hand_values_and_other_values_still_index_put():
    x = kiln.tensor([[1.0, -2.0], [-3.0, 4.0]])
    x[x < 0] = 0
    assert x.tolist() == [[1.0, 0.0], [0.0, 4.0]]
    y = kiln.zeros(3, 2)
    y[kiln.tensor([True, False, True])] = kiln.tensor([[1.0, 2.0], [3.0, 4.0]])  # a row per selected row
    assert y.tolist() == [[1.0, 2.0], [0.0, 0.0], [3.0, 4.0]]
    with pytest.raises(IndexError, match="shape of the mask"):
        y[kiln.tensor([True, False])] = 1.0


def test_gradients_by_finite_differences():
    x = kiln.tensor(rng.normal(size=(4, 3)), requires_grad=True)
    value = kiln.tensor(rng.normal(size=3), requires_grad=True)
    mask = kiln.tensor(rng.uniform(size=4) < 0.5)
    assert gradcheck(lambda x, v: _assign(x, mask, v), (x, value))


def test_compiled_keeps_the_assignment_in_its_graph():
    def clamp_grad(g, x):
        g = g.clone()
        g[x < 0] = 0
        g[x > 1] = kiln.tensor(-1.0)
        return g

    compiled = kiln.compile(clamp_grad, fullgraph=True)
    for _ in range(4):
        g, x = kiln.randn(6, 5), kiln.randn(6, 5)
        assert_close(compiled(g, x), clamp_grad(g, x), rtol=0, atol=0)
    report = kiln.explain(compiled, g, x)
    assert "1 specialization(s), 0 trace break(s)" in report.summary()
