"""Writes into expanded tensors, eager, as PyTorch does them: a copy of a tensor onto the very same
memory writes nothing (``a.t().copy_(a.t())``); an op that writes different values into elements
sharing memory raises PyTorch's RuntimeError (not numpy's read-only ValueError); ``fill_`` and
``zero_`` give every element one value and may; a write into part of an expanded tensor with no
elements sharing memory (a column of a row-expanded tensor) reaches the memory."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

OVERLAP = "more than one element of the written-to tensor refers to a single memory location"


def _column(lib):
    return lib.tensor(np.arange(3.0, dtype=np.float32).reshape(3, 1))


CASES = {
    "copy of the same memory": lambda a: a.t().copy_(a.t()),
    "copy_ of itself": lambda a: a.copy_(a),
    "fill_": lambda a: a.fill_(2.5),
    "zero_": lambda a: a.zero_(),
    "add_ of a column": lambda a: a[:, 0].add_(1),
    "setitem of a column": lambda a: a.__setitem__((slice(None), 1), 5.0),
    "mul_ of a column view": lambda a: a.t()[2].mul_(3),
}
RAISES = {
    "add_": lambda a: a.add_(1),
    "copy_ of other values": lambda a: a.copy_(a.t()),
    "mul_ of a row": lambda a: a[0].mul_(2),
    "setitem of a row": lambda a: a.__setitem__(0, 1.0),
}


def _expected_memory(name: str) -> list[float]:
    """Hand-computed: the base [0, 1, 2] after the write, as PyTorch leaves it."""
    return {"fill_": [2.5] * 3, "zero_": [0.0] * 3, "add_ of a column": [1.0, 2.0, 3.0],
            "setitem of a column": [5.0] * 3, "mul_ of a column view": [0.0, 3.0, 6.0]}.get(name, [0.0, 1.0, 2.0])  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_writes_into_an_expanded_tensor_reach_its_memory(name):
    base = _column(kiln)
    CASES[name](base.expand(3, 3))
    np.testing.assert_array_equal(base.numpy().reshape(-1), _expected_memory(name))


@pytest.mark.parametrize("name", list(RAISES))
def test_different_values_into_shared_elements_raise_runtime_error(name):
    base = _column(kiln)
    with pytest.raises(RuntimeError, match=OVERLAP):
        RAISES[name](base.expand(3, 3))
    np.testing.assert_array_equal(base.numpy().reshape(-1), [0.0, 1.0, 2.0])


def test_a_size_zero_expanded_tensor_takes_a_write():
    empty = kiln.ones(0, 1).expand(0, 3)
    empty.add_(1)
    assert tuple(empty.shape) == (0, 3)


@pytest.mark.parametrize("name", list(CASES) + list(RAISES))
def test_as_pytorch(name, torch):
    results = []
    for lib in (kiln, torch):
        base = _column(lib)
        try:
            {**CASES, **RAISES}[name](base.expand(3, 3))
            results.append(("ok", base.numpy().reshape(-1).tolist()))
        except RuntimeError as error:
            results.append(("RuntimeError", OVERLAP in str(error)))
    assert results[0] == results[1]
