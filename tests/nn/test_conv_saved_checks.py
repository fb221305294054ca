"""A convolution's backward raises where PyTorch's does: its node saves the input and the weight
whenever it exists (any of input, weight and bias requires grad), never the bias, and an in-place
change of either before the backward is an error -- on every path kiln takes (the one eager node,
direct, Winograd, im2col with groups, the transposed convolution's adjoint and its convolution of
copies), as PyTorch 2.13 does for conv1d/2d/3d and conv_transpose with any stride, padding or groups."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.nn import _conv

F = kiln.nn.functional
MESSAGE = "one of the variables needed for gradient computation has been modified by an inplace operation"

# name: (op, input shape, weight shape, keywords) -- each takes another of kiln's paths
CASES = {
    "direct": ("conv2d", (2, 2, 7, 5), (3, 2, 3, 3), {"padding": 1}),
    "one node, strided": ("conv2d", (2, 2, 7, 5), (3, 2, 3, 3), {"padding": 1, "stride": 2}),
    "winograd": ("conv2d", (1, 16, 6, 6), (16, 16, 3, 3), {"padding": 1}),
    "im2col, groups": ("conv2d", (2, 4, 6, 6), (4, 2, 3, 3), {"padding": 1, "groups": 2}),
    "conv1d": ("conv1d", (2, 3, 9), (4, 3, 3), {"padding": 1}),
    "conv3d": ("conv3d", (1, 2, 4, 4, 4), (2, 2, 2, 2, 2), {"padding": 1}),
    "unbatched": ("conv2d", (2, 7, 5), (3, 2, 3, 3), {"padding": 1}),
    "transposed, convolution of copies": ("conv_transpose2d", (2, 3, 5, 5), (3, 4, 3, 3), {"padding": 1}),
    "transposed, one node": ("conv_transpose2d", (2, 3, 4, 4), (3, 4, 3, 3), {"padding": 1, "stride": 2}),
    "transposed, groups": ("conv_transpose2d", (2, 4, 4, 4), (4, 2, 3, 3), {"padding": 1, "stride": 2, "groups": 2}),
}
REQUIRE = ["w", "x", "b", "xwb"]  # which of input, weight and bias require grad


def _channels(op: str, w_shape, groups: int) -> int:
    return w_shape[1] * groups if op.startswith("conv_transpose") else w_shape[0]


def _tensors(lib, op, x_shape, w_shape, kw, require: str, seed: int = 0):
    """x, w, b of ``lib`` (kiln or torch), made by an op from leaves (so each may change in place)."""
    rng = np.random.default_rng(seed)
    shapes = {"x": x_shape, "w": w_shape, "b": (_channels(op, w_shape, kw.get("groups", 1)),)}
    made = {}
    for name, shape in shapes.items():
        leaf = lib.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=name in require)
        made[name] = leaf * 1.0 if name in require else leaf
    return made


def _raises(lib, case: str, require: str, target: str) -> str:
    """The outcome of a backward after an in-place change of ``target``: "raised" (PyTorch's message),
    "ok", or "no node" (nothing requires grad)."""
    op, x_shape, w_shape, kw = CASES[case]
    t = _tensors(lib, op, x_shape, w_shape, kw, require)
    y = getattr(F if lib is kiln else lib.nn.functional, op)(t["x"], t["w"], t["b"], **kw)
    with lib.no_grad():
        t[target].add_(1.0)
    if not y.requires_grad:
        return "no node"
    try:
        y.sum().backward()
    except RuntimeError as error:
        assert str(error).startswith(MESSAGE), error
        return "raised"
    return "ok"


@pytest.mark.parametrize("case", CASES)
def test_an_in_place_change_of_the_input_or_weight_raises_at_backward_on_every_path(case):
    for require in REQUIRE:
        for target in "xwb":
            # PyTorch's rule (the parity test below asks it): both saved whenever the node exists
            expected = "ok" if target == "b" else "raised"
            assert _raises(kiln, case, require, target) == expected, (require, target)


def test_the_cases_take_their_paths():
    _, x_shape, w_shape, kw = CASES["direct"]
    x, w = kiln.zeros(*x_shape), kiln.zeros(*w_shape)
    assert _conv._direct(x, w, (1, 1), 1)
    _, x_shape, w_shape, kw = CASES["winograd"]
    x, w = kiln.zeros(*x_shape), kiln.zeros(*w_shape)
    assert _conv._winograd_variant(x, w, ((1, 1), (1, 1)), (1, 1), (1, 1), 1) is not None


def test_without_a_node_nothing_is_checked():
    assert _raises(kiln, "direct", "", "x") == "no node"


@pytest.mark.parametrize("case", ["direct", "one node, strided", "winograd", "transposed, convolution of copies"])
def test_the_rule_is_pytorchs(torch, case):
    for require in REQUIRE:
        for target in "xwb":
            assert _raises(kiln, case, require, target) == _raises(torch, case, require, target), (require, target)


@pytest.mark.parametrize("case", ["direct", "winograd", "im2col, groups", "transposed, convolution of copies"])
def test_unchanged_inputs_give_pytorchs_gradients(torch, case):
    op, x_shape, w_shape, kw = CASES[case]
    grads = []
    for lib in (kiln, torch):
        t = _tensors(lib, op, x_shape, w_shape, kw, "xwb", seed=3)
        leaves = list(t.values())
        y = getattr(F if lib is kiln else lib.nn.functional, op)(*leaves, **kw)
        grads.append([g.detach().numpy() for g in lib.autograd.grad((y * y).sum(), leaves)])
    for a, e in zip(*grads, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


def test_the_check_holds_with_the_paths_switched_off(monkeypatch):
    # without Winograd and the direct kernel the same convolutions take im2col: checked there too
    monkeypatch.setattr(kiln.backends.cpu, "winograd", False)
    monkeypatch.setattr(kiln.backends.cpu, "direct_conv", False)
    for case in ("direct", "winograd"):
        assert _raises(kiln, case, "w", "x") == "raised"
        assert _raises(kiln, case, "x", "w") == "raised"
