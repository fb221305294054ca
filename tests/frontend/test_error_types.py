"""The exception types code written for PyTorch catches: a broadcast mismatch and a cross_entropy
target that does not fit raise ``RuntimeError`` as in PyTorch, eager and compiled alike, and stay
``ValueError``\\ s (what kiln raised before) so that handlers written for kiln keep working."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from tests.conftest import assert_close, to_torch

BROADCASTS = {
    "add": lambda m, a, b: a + b,
    "mul": lambda m, a, b: m.mul(a, b),
    "where": lambda m, a, b: m.where(a > 0, a, b),
    "maximum": lambda m, a, b: m.maximum(a, b),
}
SHAPES = [((2, 3), (4, 3)), ((3,), (4,)), ((5, 1, 3), (2, 4))]


def _pair(shapes):
    rng = np.random.default_rng(0)
    return [kiln.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]


@pytest.mark.parametrize("op", BROADCASTS.values(), ids=BROADCASTS.keys())
def test_a_broadcast_mismatch_is_a_runtime_error_naming_both_shapes(op):
    for shapes in SHAPES:
        a, b = _pair(shapes)
        with pytest.raises(RuntimeError, match="cannot be broadcast") as caught:
            op(kiln, a, b)
        assert isinstance(caught.value, ValueError)  # what kiln raised before: old handlers still catch it
        for shape in shapes:
            assert str(shape) in str(caught.value)


def test_a_broadcast_mismatch_raises_the_same_compiled_as_eager():
    a, b = _pair(((2, 3), (4, 3)))
    with pytest.raises(RuntimeError) as eager:
        a * 2 + b
    for fullgraph in (False, True):
        compiled = kiln.compile(lambda x, y: x * 2 + y, fullgraph=fullgraph)
        good = _pair(((4, 3), (4, 3)))
        assert_close(compiled(*good), good[0] * 2 + good[1], rtol=1e-6, atol=1e-6)  # compiled first
        for _ in range(2):
            with pytest.raises(RuntimeError) as traced:
                compiled(a, b)
            assert type(traced.value) is type(eager.value) and str(traced.value) == str(eager.value)


def test_pytorch_raises_runtime_error_for_the_same_broadcasts(torch):
    for op in BROADCASTS.values():
        for shapes in SHAPES:
            a, b = _pair(shapes)
            with pytest.raises(RuntimeError):
                op(torch, to_torch(torch, a), to_torch(torch, b))
            with pytest.raises(RuntimeError):
                op(kiln, a, b)


# ----------------------------------------------------------------------------- cross_entropy targets
FLOAT_CLASS_TARGETS = [  # (input shape, float target shape that is not the input's)
    ((4, 3), (4,)),
    ((4, 3, 2), (4, 2)),
    ((3,), ()),
]


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
@pytest.mark.parametrize("shapes", FLOAT_CLASS_TARGETS, ids=str)
def test_float_class_index_targets_raise_a_runtime_error_about_the_dtype(shapes, dtype):
    logits = kiln.zeros(*shapes[0])
    target = kiln.zeros(*shapes[1], dtype=dtype)
    name = {kiln.float32: "Float", kiln.float64: "Double"}[dtype]
    message = f"expected target dtype to be Long or Byte, but got {name}"
    with pytest.raises(RuntimeError, match=message) as eager:
        F.cross_entropy(logits, target)
    assert isinstance(eager.value, ValueError)
    assert str(list(shapes[0])) in str(eager.value)  # says which shape probabilities would need
    with pytest.raises(RuntimeError) as compiled:
        kiln.compile(F.cross_entropy)(logits, target)
    assert type(compiled.value) is type(eager.value) and str(compiled.value) == str(eager.value)


def test_class_index_targets_of_the_wrong_shape_raise_a_runtime_error():
    with pytest.raises(RuntimeError, match=r"expected target of shape \[4\] .* got \[4, 5\]"):
        F.cross_entropy(kiln.zeros(4, 3), kiln.zeros(4, 5, dtype=kiln.int64))


@pytest.mark.parametrize("shapes", FLOAT_CLASS_TARGETS, ids=str)
def test_pytorch_gives_the_same_dtype_message(torch, shapes):
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte, but got Float"):
        torch.nn.functional.cross_entropy(torch.zeros(shapes[0]), torch.zeros(shapes[1]))
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte, but got Float"):
        F.cross_entropy(kiln.zeros(shapes[0]), kiln.zeros(shapes[1]))


def test_float_probability_targets_of_the_input_shape_stay_valid(torch):
    rng = np.random.default_rng(1)
    logits = kiln.tensor(rng.standard_normal((4, 3, 2)))
    probs = kiln.softmax(kiln.tensor(rng.standard_normal((4, 3, 2))), dim=1)
    expected = torch.nn.functional.cross_entropy(to_torch(torch, logits), to_torch(torch, probs))
    assert_close(F.cross_entropy(logits, probs), expected, rtol=1e-10, atol=1e-12)
    assert_close(kiln.compile(F.cross_entropy)(logits, probs), expected, rtol=1e-10, atol=1e-12)


def test_float_probability_targets_by_hand():
    # uniform logits over 2 classes: -log(1/2) whatever the probabilities
    loss = F.cross_entropy(kiln.zeros(3, 2), kiln.tensor([[1.0, 0.0], [0.25, 0.75], [0.5, 0.5]]))
    assert_close(loss, np.log(2.0), rtol=1e-6, atol=1e-7, check_dtype=False)


def test_class_index_targets_must_be_long_or_byte_as_in_pytorch(torch):
    """kiln took int32 targets, so code that ran on kiln failed on PyTorch (issue 38)."""
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for name in ("int32", "int16", "int8", "uint8", "int64"):
        target = np.array([0, 1, 2], dtype=name)
        for loss in ("cross_entropy", "nll_loss"):
            try:
                getattr(torch.nn.functional, loss)(torch.tensor(x), torch.tensor(target))
                expected = None
            except RuntimeError as error:
                expected = str(error)
            if expected is None:
                getattr(F, loss)(kiln.tensor(x), kiln.tensor(target))
            else:
                with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte"):
                    getattr(F, loss)(kiln.tensor(x), kiln.tensor(target))
