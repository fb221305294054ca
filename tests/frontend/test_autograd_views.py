"""Gradients through views whose memory was changed in place through *another* tensor.

An in-place op on a view rebases the base's history (a scatter of the new values) and the
view's own; every other view of that memory still pointed at the base's old history, so a
gradient through it skipped the in-place op: ``v = a.index_add(1, idx, src)`` is a view (a
``movedim`` of the scatter), ``v[:, 1:] *= 3`` wrote through a view of that view, and
``v.sum().backward()`` gave ``a.grad`` of ones (issue 10). A view whose memory's version moved
since its history was set is now rebuilt from its base when next used, as PyTorch does.

Each program runs on kiln and on PyTorch in float64 (the same source: only methods both
share); gradients must agree with PyTorch's and with central finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close, to_torch


def _index_add_then_scale_a_view_of_it(a, b, index):
    v = a.index_add(1, index[:1], b[:, :1])
    v[:, 1:] *= 3
    return v.sum()


def _index_add_rows_then_scale_a_column(a, b, index):
    v = a.index_add(0, index[:1], b[:1])
    v[:, 0] *= b[0]
    return (v * v).sum()


def _transpose_read_after_a_write_through_the_base(a, b, index):
    base = a * 1
    t = base.T
    base[0] *= 3  # through another view of the memory t sees
    return (t * b.T).sum()


def _slice_read_after_the_base_is_updated_in_place(a, b, index):
    base = a + 0
    rows = base[1:]
    base.mul_(b)
    return (rows**2).sum()


def _view_of_a_view_written_then_the_outer_view_read(a, b, index):
    t = (a * 2).T
    t[0].add_(b[:, 0])
    return (t.exp() * b.T).sum()


def _two_writes_through_sibling_views(a, b, index):
    base = a * 1
    left, right = base[:, :1], base[:, 1:]
    left *= 2
    right += b[:, 1:] * 2  # (not left * b: that would save left, which the write makes stale)
    return (base * b).sum() + left.sum()


def _index_select_then_write_a_column(a, b, index):
    v = a.index_select(1, index)
    v[:, :1] *= b[:, :1]
    return (v * v).sum()


def _copy_a_stale_view_into_a_fresh_tensor(a, b, index):
    base = a * 1
    t = base.T
    base[0] *= 3
    y = b * 0  # owns its memory: copy_ hands it t's history as it stands
    y.copy_(t)  # copy_ takes t's history as it is: it must be current
    return (y * b).sum()


PROGRAMS = [
    _index_add_then_scale_a_view_of_it,
    _index_add_rows_then_scale_a_column,
    _transpose_read_after_a_write_through_the_base,
    _slice_read_after_the_base_is_updated_in_place,
    _view_of_a_view_written_then_the_outer_view_read,
    _two_writes_through_sibling_views,
    _index_select_then_write_a_column,
    _copy_a_stale_view_into_a_fresh_tensor,
]


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2, 2)), rng.standard_normal((2, 2)) + 1.5, np.array([0, 1])


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__.strip("_"))
def test_gradients_match_pytorch(program, torch):
    a, b, index = _inputs()
    ka, kb = kiln.tensor(a, requires_grad=True), kiln.tensor(b, requires_grad=True)
    ta, tb = (to_torch(torch, x).requires_grad_() for x in (a, b))
    loss = program(ka, kb, kiln.tensor(index))
    expected = program(ta, tb, torch.from_numpy(index))
    loss.backward()
    expected.backward()
    assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    assert_close(ka.grad, ta.grad, rtol=1e-12, atol=1e-12)
    assert_close(kb.grad, tb.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__.strip("_"))
def test_gradients_match_finite_differences(program):
    a, b, index = _inputs(1)
    inputs = (kiln.tensor(a, requires_grad=True), kiln.tensor(b, requires_grad=True))
    assert gradcheck(lambda x, y: program(x, y, kiln.tensor(index)), inputs)


def test_the_issues_repro_by_hand():
    a = kiln.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    v = a.index_add(1, kiln.tensor([0]), kiln.tensor([[10.0], [20.0]]))
    v[:, 1:] *= 3
    v.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [[1.0, 3.0], [1.0, 3.0]])


def test_a_view_not_written_since_keeps_its_history():
    """Rebuilding only when the version moved: an untouched view's grad_fn is the view op's."""
    a = kiln.randn(3, 4, dtype=kiln.float64, requires_grad=True)
    t = (a * 1).T
    node = t.grad_fn
    (t * 2).sum().backward()
    assert t.grad_fn is node
    np.testing.assert_array_equal(a.grad.numpy(), np.full((3, 4), 2.0))


@pytest.mark.parametrize("program", PROGRAMS[:5], ids=lambda p: p.__name__.strip("_"))
def test_compiled_backward_through_rewritten_views_matches_eager(program):
    """The same programs inside ``kiln.compile`` (backward traced into the graph) over several calls."""

    def step(a, b, index):
        loss = program(a, b, index)
        loss.backward()
        return loss.detach()

    compiled = kiln.compile(step)
    index = kiln.tensor(np.array([0, 1]))
    for seed in range(4):
        a, b, _ = _inputs(seed)
        a, b = a.astype(np.float32), b.astype(np.float32)
        ka, kb = kiln.tensor(a, requires_grad=True), kiln.tensor(b, requires_grad=True)
        ea, eb = kiln.tensor(a, requires_grad=True), kiln.tensor(b, requires_grad=True)
        assert_close(compiled(ka, kb, index), step(ea, eb, index), rtol=1e-5, atol=1e-6)
        assert_close(ka.grad, ea.grad, rtol=1e-5, atol=1e-6)
        assert_close(kb.grad, eb.grad, rtol=1e-5, atol=1e-6)
    assert compiled.state.specializations[-1].calls >= 3
