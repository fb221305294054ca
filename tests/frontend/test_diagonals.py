"""diag, diag_embed, diagflat and trace against PyTorch, hand values, finite differences and compiled."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close

rng = np.random.default_rng(2)


def test_hand_values():
    assert kiln.diag(kiln.tensor([1, 2])).tolist() == [[1, 0], [0, 2]]
    assert kiln.diag(kiln.tensor([1, 2]), -1).tolist() == [[0, 0, 0], [1, 0, 0], [0, 2, 0]]
    assert kiln.diag(kiln.tensor([[1, 2, 3], [4, 5, 6]]), 1).tolist() == [2, 6]
    assert kiln.trace(kiln.tensor([[1, 2], [3, 4]])).item() == 5
    assert kiln.diagflat(kiln.tensor([[1, 2]])).tolist() == [[1, 0], [0, 2]]
    m = kiln.ones(3, 3)
    d = kiln.diag(m)
    m[0, 0] = 7.0
    assert d.tolist() == [1.0, 1.0, 1.0]  # new memory, as PyTorch's diag
    with pytest.raises(RuntimeError, match="1D or 2D"):
        kiln.diag(kiln.ones(2, 2, 2))


@pytest.mark.parametrize("shape", [(3,), (0,), (1,)])
@pytest.mark.parametrize("offset", [0, 1, -2])
def test_diag_of_vectors_matches_torch(torch, shape, offset):
    x = rng.normal(size=shape)
    assert_close(kiln.diag(kiln.tensor(x), offset), torch.diag(torch.tensor(x), offset), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(3, 4), (4, 3), (2, 2)])
@pytest.mark.parametrize("offset", [0, 1, -1, 5])
def test_diag_of_matrices_and_trace_match_torch(torch, shape, offset):
    x = rng.normal(size=shape)
    assert_close(kiln.diag(kiln.tensor(x), offset), torch.diag(torch.tensor(x), offset), rtol=0, atol=0)
    assert_close(kiln.trace(kiln.tensor(x)), torch.trace(torch.tensor(x)), rtol=1e-12, atol=1e-12)
    ints = rng.integers(-5, 5, size=shape)
    assert_close(kiln.trace(kiln.tensor(ints)), torch.trace(torch.tensor(ints)), rtol=0, atol=0)


@pytest.mark.parametrize("offset,dim1,dim2", [(0, -2, -1), (1, 0, 2), (-1, 2, 0), (2, 1, 0)])
def test_diag_embed_and_diagflat_match_torch(torch, offset, dim1, dim2):
    x = rng.normal(size=(2, 3))
    expected = torch.diag_embed(torch.tensor(x), offset, dim1, dim2)
    assert_close(kiln.diag_embed(kiln.tensor(x), offset, dim1, dim2), expected, rtol=0, atol=0)
    assert_close(kiln.diagflat(kiln.tensor(x), offset), torch.diagflat(torch.tensor(x), offset), rtol=0, atol=0)


def test_gradients_by_finite_differences():
    v = kiln.tensor(rng.normal(size=3), requires_grad=True)
    m = kiln.tensor(rng.normal(size=(3, 4)), requires_grad=True)
    assert gradcheck(lambda v: kiln.diag(v, 1) * 2.0, (v,))
    assert gradcheck(lambda m: kiln.diag(m, -1), (m,))
    assert gradcheck(lambda v: kiln.diag_embed(v.reshape(1, 3), 0, 0, 2), (v,))
    assert gradcheck(lambda m: kiln.trace(m[:, :3]), (m,))


def test_compiled_matches_eager():
    def f(v, m):
        return kiln.diag(v) @ m + kiln.trace(m[:, :3]) + kiln.diag(m).sum()

    compiled = kiln.compile(f, fullgraph=True)
    for _ in range(3):
        v, m = kiln.randn(3), kiln.randn(3, 4)
        assert_close(compiled(v, m), f(v, m), rtol=1e-6, atol=1e-6)
