"""Eager embedding: the forward is one lookup, the backward's scatter of rows a compiled kernel (or
numpy's rows in rounds); both equal PyTorch's for int32 and int64 ids of any shape."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.ir.primitives import indexing

rng = np.random.default_rng(7)


def _ops(fn) -> list[str]:
    with kiln.profiler.profile() as prof:
        fn()
    return [e.name for e in prof.events() if e.cat == "op"]


def test_the_forward_is_one_lookup_with_one_bounds_check():
    """index_select moved dim 0 to the front and back (an autograd node each) and checked the
    ids a second time; embedding checked them already. The ids' shape is the lookup's own: no
    reshape of the ids before or of the rows after (a node each, forward and backward)."""
    weight = kiln.tensor(rng.normal(size=(10, 4)), requires_grad=True)
    ids = kiln.tensor(rng.integers(0, 10, size=(3, 5)))
    ran = _ops(lambda: F.embedding(ids, weight))
    assert ran == ["take"], ran
    out = F.embedding(ids, weight)
    backward = _ops(lambda: out.backward(kiln.ones(3, 5, 4)))
    assert "index_put" in backward and "reshape" not in backward, backward
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


def _lookup_grad(ids, table, g, **kwargs):
    weight = kiln.tensor(table, requires_grad=True)
    out = F.embedding(kiln.tensor(ids), weight, **kwargs)
    out.backward(kiln.tensor(g))
    return out.detach().numpy(), weight.grad.numpy()


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_ids_of_either_dtype_and_many_repeats_match_torch(torch, dtype):
    """An LSTM LM's (batch, time) ids into its table, one token 200 times over (more repeats than
    numpy's rows-in-rounds kernel takes): the rows and the summed gradient equal PyTorch's."""
    ids = rng.integers(0, 50, size=(16, 35)).astype(dtype)
    ids.reshape(-1)[rng.permutation(ids.size)[:200]] = 3
    table = rng.normal(size=(50, 128)).astype(np.float32)
    g = rng.normal(size=(16, 35, 128)).astype(np.float32)
    out, grad = _lookup_grad(ids, table, g)
    t_weight = torch.tensor(table, requires_grad=True)
    t_out = torch.nn.functional.embedding(torch.tensor(ids), t_weight)
    t_out.backward(torch.tensor(g))
    np.testing.assert_array_equal(out, t_out.detach().numpy())
    np.testing.assert_allclose(grad, t_weight.grad.numpy(), rtol=1e-5, atol=1e-4)
    expected = np.zeros_like(table)  # (no torch: numpy's element-by-element sum, the same order)
    np.add.at(expected, ids.reshape(-1).astype(np.int64), g.reshape(-1, 128))
    np.testing.assert_array_equal(grad, expected)


def test_index_put_of_rows_over_ids_of_any_shape_adds_rows_in_rounds(monkeypatch):
    """``w[ids]`` with (batch, time) ids: its gradient is whole rows, added in rounds (or one flat
    ``add.at`` for a row repeated past ``_MAX_ROUNDS``), not numpy's row-wise ``add.at`` (480 us
    against 90 for 560 rows of 128); the sum is ``add.at``'s, bit for bit."""
    calls = []
    add_rows = indexing._add_rows
    monkeypatch.setattr(indexing, "_add_rows", lambda out, v, i: calls.append(i.shape) or add_rows(out, v, i))
    for repeats in (1, indexing._MAX_ROUNDS + 5):
        ids = rng.integers(0, 40, size=(8, 70))
        ids[0, :repeats] = 7
        table = rng.normal(size=(40, 2, 64))
        g = rng.normal(size=(8, 70, 2, 64))
        weight = kiln.tensor(table, requires_grad=True)
        weight[kiln.tensor(ids)].backward(kiln.tensor(g))
        expected = np.zeros_like(table)
        np.add.at(expected, ids, g)
        np.testing.assert_array_equal(weight.grad.numpy(), expected)
    assert calls == [(560,), (560,)]


def test_rows_repeated_past_the_rounds_sum_as_add_at_in_any_layout():
    """The flat ``add.at`` for many repeats, and ``add.at`` itself where the table is not in C order."""
    ids = np.array([2, 0, 2, -1] + [2] * (indexing._MAX_ROUNDS + 3))
    values = rng.normal(size=(len(ids), 3, 4))
    for table in (rng.normal(size=(5, 3, 4)), np.asfortranarray(rng.normal(size=(5, 3, 4)))):
        expected = table.copy()
        np.add.at(expected, ids, values)
        out = table.copy(order="K")
        indexing._add_rows(out, values, ids)
        np.testing.assert_array_equal(out, expected)


def test_transposed_ids_take_the_compiled_scatter(on):
    """Ids in another layout (``ids.t()``) are made C order for the lookup, so that the gradient's
    compiled scatter, which walks the ids with one stride, takes them."""
    weight = kiln.tensor(rng.normal(size=(256, 128)).astype(np.float32), requires_grad=True)
    ids = kiln.tensor(rng.integers(0, 256, size=(64, 8))).t()
    g = rng.normal(size=(8, 64, 128)).astype(np.float32)
    expected = np.zeros((256, 128), np.float32)
    np.add.at(expected, ids.numpy().reshape(-1), g.reshape(-1, 128))
    for _ in range(2):
        weight.grad = None
        F.embedding(ids, weight).backward(kiln.tensor(g))
        np.testing.assert_allclose(weight.grad.numpy(), expected, rtol=1e-5, atol=1e-5)
        assert on.wait(120)
    with kiln.profiler.profile() as prof:
        F.embedding(ids, weight).backward(kiln.tensor(g))
    ran = {e.name: e.args["kernel"] for e in prof.events() if e.cat == "op" and e.name == "index_put"}
    assert ran == {"index_put": "compiled"}


@pytest.mark.parametrize("bad", [7, -1])
def test_an_id_out_of_range_says_the_range_and_the_id(bad):
    weight = kiln.tensor(rng.normal(size=(5, 3)), requires_grad=True)
    ids = kiln.tensor(np.array([[0, 4], [bad, 1]], dtype=np.int32))
    with pytest.raises(
        IndexError, match=rf"embedding: index out of range in self \(got {bad}; indices must be in \[0, 4\]\)"
    ):
        F.embedding(ids, weight)


def test_a_padding_row_costs_no_pass_over_the_rows():
    """The padding row's zero gradient is made by zeroing that row of the scattered gradient: a
    ``where`` choosing detached rows cost a pass over all of them, forward and backward (and an
    ``eq`` over the ids), 200 us where PyTorch took 58 for (16, 35) ids into (500, 128)."""
    weight = kiln.tensor(rng.normal(size=(10, 4)), requires_grad=True)
    ids = kiln.tensor(np.array([[0, 2, 0], [1, 0, 3]]))
    assert _ops(lambda: F.embedding(ids, weight, padding_idx=0)) == ["take"]
    out = F.embedding(ids, weight, padding_idx=0)
    backward = _ops(lambda: out.backward(kiln.ones(2, 3, 4)))
    assert backward.count("index_put") == 1 and "where" not in backward, backward
    assert weight.grad.numpy()[0].tolist() == [0.0] * 4 and weight.grad.numpy()[2].tolist() == [1.0] * 4


def test_the_padding_row_gets_a_zero_gradient_however_often_it_is_looked_up(torch):
    ids = rng.integers(0, 12, size=(6, 30))
    ids[:, :20] = 2  # the padding token, 120 times
    table = rng.normal(size=(12, 16))
    g = rng.normal(size=(6, 30, 16))
    out, grad = _lookup_grad(ids, table, g, padding_idx=2)
    assert not grad[2].any()
    t_weight = torch.tensor(table, requires_grad=True)
    torch.nn.functional.embedding(torch.tensor(ids), t_weight, padding_idx=2).backward(torch.tensor(g))
    np.testing.assert_allclose(grad, t_weight.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(out, table[ids])


def test_gradcheck_float64():
    """Repeated ids and an unused row (the padding row's zero gradient is by design, not the
    derivative: the test above checks it against PyTorch)."""
    ids = kiln.tensor(np.array([[1, 3, 1], [0, 3, 3]]))
    weight = kiln.tensor(rng.normal(size=(5, 4)), requires_grad=True)
    assert kiln.autograd.gradcheck(lambda w: F.embedding(ids, w), (weight,))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8])
def test_the_bounds_check_of_ids_at_its_edges(dtype):
    """``check_range`` with low 0 reads signed ids as unsigned (one pass): a negative id is out of
    range, as are ``high`` and above; other bounds take min and max."""
    for values, low, high in [([0, 4], 0, 5), ([0, 5], 0, 5), ([-1, 2], 0, 5), ([-128 + 1, 3], 0, 5), ([3], 0, 0),
                              ([2, 4], 2, 5), ([1, 4], 2, 5), ([-7, 4], None, 5), ([0, 4], 0, None)]:  # fmt: skip
        if np.dtype(dtype).kind == "u" and min(values) < 0:
            continue
        ids = kiln.tensor(np.array(values, dtype=dtype))
        inside = all((low is None or v >= low) and (high is None or v < high) for v in values)
        if inside:
            kiln.jit.check_range(ids, low, high, IndexError, "id {value} out of range")
        else:
            bad = next(v for v in values if not ((low is None or v >= low) and (high is None or v < high)))
            with pytest.raises(IndexError, match=f"id {bad} out of range"):
                kiln.jit.check_range(ids, low, high, IndexError, "id {value} out of range")


def test_a_compiled_training_step_with_a_padding_row_equals_eager():
    """The padding lookup's own backward (scatter, then the padding row zeroed) traced: several calls
    of (batch, time) ids with many padding tokens, losses and tables equal to eager."""

    def run(compiled: bool) -> list[np.ndarray]:
        kiln.manual_seed(0)
        table, head = kiln.nn.Embedding(30, 8, padding_idx=0), kiln.nn.Linear(8, 1)
        optimizer = kiln.optim.SGD([*table.parameters(), *head.parameters()], lr=0.5)
        ids = np.random.default_rng(5).integers(0, 30, size=(4, 6, 10))
        ids[:, :, 6:] = 0

        def step(idx):
            loss = head(table(idx)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss.detach()

        fn = kiln.compile(step) if compiled else step
        losses = [fn(kiln.tensor(batch)).numpy() for batch in ids]
        return [*losses, table.weight.detach().numpy().copy()]

    ours, theirs = run(True), run(False)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not ours[-1][0].any()  # the padding row: zero at the start, no gradient since
