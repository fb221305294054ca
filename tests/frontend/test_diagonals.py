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


# (shape, offset, dim1, dim2, how the input is made from a contiguous tensor): the two dims apart in
# memory, as the input's own view, of a view, and transposed
APART = [((3, 2, 3), 0, 0, 2, None), ((3, 2, 4), 1, 0, 2, None), ((3, 2, 4), -1, 2, 0, None),
         ((4, 3, 5, 2), 1, 1, 3, None), ((5, 2, 3), 0, 0, 2, "slice"), ((3, 2, 3), 0, 2, 0, "transpose"),
         ((3, 2, 3), 7, 0, 2, None)]  # fmt: skip


def _input(m, shape, how):
    x = m.arange(float(np.prod(shape)) * 2).reshape((2 * shape[0],) + shape[1:])
    if how == "slice":
        return x[1 : 1 + shape[0]]
    x = x[: shape[0]]
    return x.transpose(0, 2).transpose(0, 2) if how == "transpose" else x


@pytest.mark.parametrize("shape, offset, dim1, dim2, how", APART)
def test_a_diagonal_across_dims_apart_in_memory_is_a_view_as_pytorch(torch, shape, offset, dim1, dim2, how):
    """Writes through the diagonal reach the input (it was a copy of a flattening: writes were lost)."""
    results = []
    for m in (kiln, torch):
        x = _input(m, shape, how)
        d = x.diagonal(offset, dim1, dim2)
        before = d.clone()
        d.mul_(-1)
        results.append((before.numpy(), x.numpy(), d._base is not None))
    (kb, kx, kview), (tb, tx, tview) = results
    np.testing.assert_array_equal(kb, tb)
    np.testing.assert_array_equal(kx, tx)
    assert kview and tview


@pytest.mark.parametrize("shape, offset, dim1, dim2, how", APART[:4])
def test_a_diagonal_across_dims_apart_differentiates_and_compiles(shape, offset, dim1, dim2, how):
    x = kiln.from_numpy(np.random.default_rng(0).standard_normal(shape)).requires_grad_()
    assert gradcheck(lambda t: t.diagonal(offset, dim1, dim2) * 3, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)

    def step(t):
        t.diagonal(offset, dim1, dim2).add_(1.0)
        return t.exp().sum()

    compiled = kiln.compile(step, wait=True)
    for k in range(3):
        values = np.random.default_rng(k).standard_normal(shape)
        a, b = kiln.from_numpy(values.copy()), kiln.from_numpy(values.copy())
        assert_close(compiled(a), step(b), rtol=1e-12, atol=1e-12)
        assert_close(a, b, rtol=0, atol=0)
