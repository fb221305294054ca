"""``check_saved``: a node that checks tensors a composite op reads only through copies, and passes
the gradient through unchanged (``kiln/frontend/autograd/checked.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.autograd.checked import check_saved

MESSAGE = "one of the variables needed for gradient computation has been modified by an inplace operation"


def _product(x, w):
    """``x.clone() * w``, its backward checking ``x`` (which it reads a copy of)."""
    return check_saved(x.clone() * w, (x,), "ExampleBackward")


def test_the_gradient_passes_through_unchanged():
    x, w = kiln.tensor([1.0, 2.0, 3.0]), kiln.tensor([4.0, 5.0, 6.0], requires_grad=True)
    (_product(x, w) ** 2).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * np.array([4.0, 10.0, 18.0]) * np.array([1.0, 2.0, 3.0]))


def test_an_in_place_change_raises_and_names_the_node():
    x, w = kiln.ones(3), kiln.ones(3, requires_grad=True)
    y = _product(x, w)
    x.mul_(2)
    with pytest.raises(RuntimeError, match=f"^{MESSAGE}: it was saved by ExampleBackward at version 0"):
        y.sum().backward()


def test_without_history_there_is_no_node():
    x = kiln.ones(3)
    y = x.clone()
    assert check_saved(y, (x,), "ExampleBackward") is y and y.grad_fn is None


def test_retain_graph_keeps_it_and_a_second_backward_without_raises_as_freed():
    x, w = kiln.ones(3), kiln.ones(3, requires_grad=True)
    y = _product(x, w).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 2.0, 2.0])
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()
