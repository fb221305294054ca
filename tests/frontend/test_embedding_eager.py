"""Eager embedding: the forward is one lookup, the backward's scatter of rows a compiled kernel."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F

rng = np.random.default_rng(7)


def _ops(fn) -> list[str]:
    with kiln.profiler.profile() as prof:
        fn()
    return [e.name for e in prof.events() if e.cat == "op"]


def test_the_forward_is_one_lookup_with_one_bounds_check():
    """index_select moved dim 0 to the front and back (an autograd node each) and checked the
    ids a second time; embedding checked them already."""
    weight = kiln.tensor(rng.normal(size=(10, 4)), requires_grad=True)
    ids = kiln.tensor(rng.integers(0, 10, size=(3, 5)))
    ran = _ops(lambda: F.embedding(ids, weight))
    assert ran.count("take") == 1 and "permute" not in ran and "index_select" not in ran, ran
    out = F.embedding(ids, weight)
    np.testing.assert_array_equal(out.detach().numpy(), weight.detach().numpy()[ids.numpy()])
    with pytest.raises(
        RuntimeError, match=r"embedding: 'weight' must be 2-D \(num_embeddings, dim\), got shape \[10\]"
    ):
        F.embedding(ids, kiln.zeros(10))


def test_the_backward_adds_rows_with_the_compiled_scatter(on):
    """A GPT's token lookup (ids repeat): the gradient's ``index_put`` runs kiln's compiled kernel
    once it is ready (numpy's row-by-row rounds took 110 us here, the kernel 10 us), and sums what
    numpy's ``add.at`` sums."""
    weight = kiln.tensor(rng.normal(size=(256, 128)).astype(np.float32), requires_grad=True)
    ids = rng.integers(0, 256, size=(8, 64))
    ids[0, :20] = 3  # one row twenty times over
    g = rng.normal(size=(8, 64, 128)).astype(np.float32)
    expected = np.zeros((256, 128), np.float32)
    np.add.at(expected, ids.reshape(-1), g.reshape(-1, 128))
    for _ in range(2):  # the first call runs numpy and queues the compile; the second, the compiled kernel
        weight.grad = None
        F.embedding(kiln.tensor(ids), weight).backward(kiln.tensor(g))
        np.testing.assert_allclose(weight.grad.numpy(), expected, rtol=1e-5, atol=1e-5)
        assert on.wait(120)
    with kiln.profiler.profile() as prof:
        F.embedding(kiln.tensor(ids), weight).backward(kiln.tensor(g))
    ran = {e.name: e.args["kernel"] for e in prof.events() if e.cat == "op" and e.name == "index_put"}
    assert ran == {"index_put": "compiled"}
