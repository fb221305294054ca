"""COO sparse tensors for graph networks: against PyTorch's, hand values, finite differences, and a GCN
training step compiled against eager with its adjacency captured (no trace break)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln import nn
from kiln.autograd import gradcheck
from tests.conftest import assert_close

rng = np.random.default_rng(4)
INDICES = np.array([[0, 1, 1, 0, 2], [1, 0, 2, 1, 2]])  # (0, 1) twice: uncoalesced
VALUES = np.array([1.0, 2.0, 3.0, 4.0, 5.0])


def _adjacency(dtype=kiln.float64):
    return kiln.sparse_coo_tensor(kiln.tensor(INDICES), kiln.tensor(VALUES, dtype=dtype), (3, 3))


def test_hand_values():
    adj = _adjacency()
    assert adj.to_dense().tolist() == [[0.0, 5.0, 0.0], [2.0, 0.0, 3.0], [0.0, 0.0, 5.0]]
    assert not adj.is_coalesced() and adj._nnz() == 5
    with pytest.raises(RuntimeError, match="coalesce"):
        adj.indices()
    c = adj.coalesce()
    assert c.indices().tolist() == [[0, 1, 1, 2], [1, 0, 2, 2]] and c.values().tolist() == [5.0, 2.0, 3.0, 5.0]
    assert (adj @ kiln.ones(3, dtype=kiln.float64)).tolist() == [5.0, 5.0, 5.0]
    assert kiln.tensor([[0.0, 1.5], [0.0, 0.0]]).to_sparse().to_dense().tolist() == [[0.0, 1.5], [0.0, 0.0]]
    with pytest.raises(RuntimeError, match="out of bounds"):
        kiln.sparse_coo_tensor(kiln.tensor([[0, 3]]), kiln.ones(2), (3,))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        _adjacency() @ kiln.ones(4, 2, dtype=kiln.float64)


def test_products_and_conversions_match_torch(torch):
    theirs = torch.sparse_coo_tensor(torch.tensor(INDICES), torch.tensor(VALUES), (3, 3), check_invariants=True)
    ours = _adjacency()
    dense = rng.normal(size=(3, 4))
    assert_close(ours.to_dense(), theirs.to_dense(), rtol=0, atol=0)
    for product in (kiln.spmm, kiln.mm, kiln.matmul, kiln.sparse.mm, lambda a, b: a @ b):
        assert_close(product(ours, kiln.tensor(dense)), torch.sparse.mm(theirs, torch.tensor(dense)), rtol=1e-12,
                     atol=1e-12)  # fmt: skip
    assert_close(kiln.tensor(dense.T) @ ours, torch.tensor(dense.T) @ theirs, rtol=1e-12, atol=1e-12)
    vector = rng.normal(size=3)
    assert_close(ours @ kiln.tensor(vector), torch.mv(theirs, torch.tensor(vector)), rtol=1e-12, atol=1e-12)
    c, tc = ours.coalesce(), theirs.coalesce()
    assert c.indices().tolist() == tc.indices().tolist()
    assert_close(c.values(), tc.values(), rtol=0, atol=0)
    x = rng.normal(size=(3, 2)) * (rng.uniform(size=(3, 2)) < 0.5)
    s, ts = kiln.tensor(x).to_sparse(), torch.tensor(x).to_sparse()
    assert s.indices().tolist() == ts.indices().tolist()
    assert_close(s.values(), ts.values(), rtol=0, atol=0)


def test_gradients_by_finite_differences():
    dense = kiln.tensor(rng.normal(size=(3, 2)), requires_grad=True)
    values = kiln.tensor(VALUES, requires_grad=True)

    def product(dense, values):
        return kiln.sparse_coo_tensor(kiln.tensor(INDICES), values, (3, 3)) @ dense

    assert gradcheck(product, (dense, values))
    assert gradcheck(lambda v: kiln.sparse_coo_tensor(kiln.tensor(INDICES), v, (3, 3)).to_dense(), (values,))


def test_dense_plus_sparse_is_dense_as_in_torch(torch):
    # pytorch/examples' GCN: ``torch.eye(V) + adjacency`` with an int64 adjacency
    theirs = torch.sparse_coo_tensor(torch.tensor(INDICES), torch.tensor(VALUES), (3, 3), dtype=torch.int64)
    ours = kiln.sparse_coo_tensor(kiln.tensor(INDICES), kiln.tensor(VALUES), (3, 3), dtype=kiln.int64)
    dense = rng.normal(size=(3, 3)).astype(np.float32)
    cases = (
        lambda lib, s, d: d + s, lambda lib, s, d: d - s, lambda lib, s, d: d.add(s),
        lambda lib, s, d: lib.add(d, s, alpha=2), lambda lib, s, d: lib.sub(d, s, alpha=3),
        lambda lib, s, d: lib.eye(3) + s,
    )  # fmt: skip
    for case in cases:
        got, expected = case(kiln, ours, kiln.tensor(dense)), case(torch, theirs, torch.tensor(dense))
        assert got.dtype == kiln.float32 and not getattr(got, "is_sparse", False)
        assert_close(got, expected, rtol=1e-6, atol=1e-6)
    both, their_both = ours + ours, theirs + theirs
    assert both.is_sparse and both.dtype == kiln.int64
    assert_close(both.to_dense(), their_both.to_dense(), rtol=0, atol=0)
    for wrong in (lambda: ours + kiln.tensor(dense), lambda: ours - kiln.tensor(dense)):
        with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
            wrong()


def test_dense_plus_sparse_gradients_by_finite_differences_and_compiled():
    dense = kiln.tensor(rng.normal(size=(3, 3)), requires_grad=True)
    values = kiln.tensor(VALUES, requires_grad=True)

    def plus(dense, values):
        return (dense - 2 * kiln.sparse_coo_tensor(kiln.tensor(INDICES), values, (3, 3))).tanh()

    assert gradcheck(plus, (dense, values))
    adj = _adjacency()

    def step(x):
        return (kiln.eye(3, dtype=kiln.float64) + adj) @ x - adj @ x

    compiled = kiln.compile(step)
    for _ in range(4):
        x = kiln.tensor(rng.normal(size=(3, 2)))
        assert_close(compiled(x), step(x), rtol=1e-12, atol=1e-12)
    assert "0 trace break(s)" in kiln.explain(compiled).summary()


class GCN(nn.Module):
    """Two graph convolutions, ``adj @ (x W)``, as pygcn writes them."""

    def __init__(self, features, hidden, classes):
        super().__init__()
        self.first, self.second = nn.Linear(features, hidden), nn.Linear(hidden, classes)

    def forward(self, x, adj):
        h = F.relu(kiln.spmm(adj, self.first(x)))
        return F.log_softmax(kiln.mm(adj, self.second(h)), dim=1)


def _gcn_step(seed):
    kiln.manual_seed(seed)
    nodes = 12
    edges = np.random.default_rng(seed).integers(0, nodes, size=(2, 40))
    adj = kiln.sparse_coo_tensor(kiln.tensor(edges), kiln.full((40,), 0.25), (nodes, nodes))
    model = GCN(5, 8, 3)
    opt = kiln.optim.Adam(model.parameters(), lr=0.01)

    def step(x, y):
        opt.zero_grad()
        loss = F.nll_loss(model(x, adj), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


def test_compiled_gcn_step_matches_eager_with_no_trace_break():
    x, y = kiln.randn(12, 5), kiln.randint(0, 3, (12,))
    eager_model, eager_step = _gcn_step(0)
    compiled_model, step = _gcn_step(0)
    compiled = kiln.compile(step)
    for _ in range(4):
        assert_close(compiled(x, y), eager_step(x, y), rtol=1e-5, atol=1e-6)
    for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
        assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert "0 trace break(s)" in kiln.explain(compiled, x, y).summary()
