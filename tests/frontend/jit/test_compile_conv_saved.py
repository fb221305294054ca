"""A compiled convolution's backward raises where the eager one does (and PyTorch's): an in-place
change of its input or weight, inside the call or between the call and the backward, though the
compiled backward reads only copies of them (the padded input, its windows). Eager and compiled over
several calls: the same error (type and message start), and the same values and gradients without one."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

F = kiln.nn.functional
MESSAGE = "one of the variables needed for gradient computation has been modified by an inplace operation"
# the fuzzer's finding (seeds 8484003549, 8484003871) at each stride, then Winograd's and im2col's paths
CASES = {
    "direct": ((2, 2, 7, 5), (2, 2, 3, 3), {"padding": 1}),
    "strided": ((2, 2, 7, 5), (2, 2, 3, 3), {"padding": 1, "stride": 2}),
    "winograd": ((1, 16, 6, 6), (16, 16, 3, 3), {"padding": 1}),
    "groups": ((2, 4, 6, 6), (4, 2, 3, 3), {"padding": 1, "groups": 2}),
}


def _conv(kw: dict, mutate_inside: bool):
    def f(x, w, s):
        y = F.conv2d(x, w * 0.5, padding=kw["padding"], stride=kw.get("stride", 1), groups=kw.get("groups", 1))
        if mutate_inside:
            x.lerp_(s, 0.25)  # the input changed in place after the convolution saved it
        return y

    return f


def _outcome(fn, case: str, seed: int, mutate_after: bool):
    """("raised", message start) or ("ok", y, grad of w) for one call and its backward."""
    x_shape, w_shape, _ = CASES[case]
    rng = np.random.default_rng(seed)
    x = kiln.tensor(rng.standard_normal(x_shape).astype(np.float32))
    w = kiln.tensor(rng.standard_normal(w_shape).astype(np.float32), requires_grad=True)
    s = kiln.tensor(rng.standard_normal(x_shape[-1]).astype(np.float32))
    try:
        y = fn(x, w, s)
        if mutate_after:
            x.add_(1.0)
        (y * y).sum().backward()
    except RuntimeError as error:
        return ("raised", type(error), str(error)[: len(MESSAGE)])
    return ("ok", y.detach().numpy(), w.grad.numpy())


def _same(actual, expected) -> None:
    assert actual[0] == expected[0], (actual, expected)
    if actual[0] == "raised":
        assert actual[1:] == expected[1:] and actual[2] == MESSAGE
    else:
        for a, e in zip(actual[1:], expected[1:], strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("inside", "after"), [(True, False), (False, True), (False, False)])
def test_compiled_conv_raises_as_eager_over_several_calls(case, inside, after):
    f = _conv(CASES[case][2], inside)
    g = kiln.compile(f, wait=True)
    for seed in range(3):
        expected = _outcome(f, case, seed, after)
        assert expected[0] == ("raised" if inside or after else "ok")
        _same(_outcome(g, case, seed, after), expected)


def test_the_compiled_backward_checks_the_input_it_reads_a_copy_of():
    # cached calls run the compiled backward (no eager node): it holds the input's version itself
    f = _conv(CASES["direct"][2], False)
    g = kiln.compile(f, wait=True)
    for seed in range(3):
        _outcome(g, "direct", seed, False)
    (spec,) = g.state.specializations
    assert spec.backward.checked_inputs == [0]  # the argument x (the weight w * 0.5 is made in the call)
    assert _outcome(g, "direct", 5, True)[0] == "raised"
    assert _outcome(g, "direct", 6, False)[0] == "ok"


def test_matches_pytorch(torch):
    def torch_outcome(stride: int) -> str:
        x = torch.randn(2, 2, 7, 5)
        w = torch.randn(2, 2, 3, 3, requires_grad=True)
        y = torch.nn.functional.conv2d(x, w * 0.5, padding=1, stride=stride)
        x.lerp_(torch.randn(5), 0.25)
        try:
            y.sum().backward()
        except RuntimeError as error:
            assert str(error).startswith(MESSAGE)
            return "raised"
        return "ok"

    for case, stride in (("direct", 1), ("strided", 2)):
        g = kiln.compile(_conv(CASES[case][2], True), wait=True)
        assert _outcome(g, case, 0, False)[0] == torch_outcome(stride) == "raised"


TRANSPOSED = {
    "convolution of copies": ((2, 3, 5, 5), (3, 4, 3, 3), {"padding": 1}),
    "adjoint": ((2, 3, 4, 4), (3, 4, 3, 3), {"padding": 1, "stride": 2}),
    "adjoint, groups": ((2, 4, 4, 4), (4, 2, 3, 3), {"padding": 1, "stride": 2, "groups": 2}),
}


@pytest.mark.parametrize("case", TRANSPOSED)
@pytest.mark.parametrize("changed", ["input", "weight"])
def test_compiled_conv_transpose_checks_what_eager_checks(case, changed):
    x_shape, w_shape, kw = TRANSPOSED[case]

    def f(x, w):
        return F.conv_transpose2d(x, w, **kw)

    g = kiln.compile(f, wait=True)
    for seed, fn in enumerate((f, g, g, g)):
        rng = np.random.default_rng(seed)
        x = kiln.tensor(rng.standard_normal(x_shape).astype(np.float32), requires_grad=changed == "weight")
        w = kiln.tensor(rng.standard_normal(w_shape).astype(np.float32), requires_grad=changed == "input")
        y = fn(x, w)
        with kiln.no_grad():
            (x if changed == "input" else w).add_(1.0)
        with pytest.raises(RuntimeError, match=MESSAGE):
            y.sum().backward()
    assert len(g.state.specializations) == 1  # the last calls ran the compiled backward
