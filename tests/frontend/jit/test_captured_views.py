"""Views from outside the call (a row of a buffer a module holds, ``w.detach()``) and their base,
written and read in one compiled call. Each is a graph input reading its memory as it was when the
call began, so a write through the view was not seen by a later read of the base (or the other way
round): compiled calls returned 9 where eager returns 12. A tensor first read after the call changed
another tensor sharing its memory in place now stops the trace (the call runs eagerly, the reason
said), as a write to one of two inputs sharing memory already did. The first two cases fail on that
code."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

from .helpers import mean_square_step


def _view_then_base(lib):
    base = lib.zeros(6)
    v = base[2:5]
    w = lib.ones(3)

    def step():
        v.add_(w)
        return base.sum() + v.sum()

    return step, base


def _base_then_view(lib):
    base = lib.zeros(6)
    v = base[2:5]
    w = lib.arange(6, dtype=lib.float32)

    def step():
        base.add_(w)
        return v.sum() * 10 + base.sum()

    return step, base


def _two_rows(lib):
    base = lib.zeros(2, 4)
    rows = [base[0], base[1]]
    w = lib.ones(4)

    def step():
        rows[1].mul_(2).add_(w)
        rows[0].add_(rows[1])
        return base.sum() + rows[0][1]

    return step, base


def _detached_alias(lib):
    w = lib.ones(3, requires_grad=True)
    d = w.detach()

    def step():
        with lib.no_grad():
            w.mul_(2)
        return (w * d).sum()

    return step, w


CASES = [_view_then_base, _base_then_view, _two_rows, _detached_alias]


def _calls(make, lib, compiled: bool, n: int = 4) -> tuple[list[float], np.ndarray]:
    step, state = make(lib)
    fn = kiln.compile(step) if compiled else step
    out = [float(fn().detach()) for _ in range(n)]
    return out, state.detach().numpy().copy()


@pytest.mark.parametrize("make", CASES, ids=lambda m: m.__name__.strip("_"))
def test_a_view_from_outside_and_its_base_see_each_others_writes(make):
    (eager, s_eager), (compiled, s_compiled) = _calls(make, kiln, False), _calls(make, kiln, True)
    np.testing.assert_allclose(compiled, eager, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s_compiled, s_eager, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", CASES, ids=lambda m: m.__name__.strip("_"))
def test_a_view_from_outside_matches_pytorch(torch, make):
    (ours, s_ours), (theirs, s_theirs) = _calls(make, kiln, True), _calls(make, torch, False)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s_ours, s_theirs, rtol=1e-6, atol=1e-6)


def test_the_reason_is_said():
    step, _ = _view_then_base(kiln)
    fn = kiln.compile(step)
    with pytest.warns(kiln.CompileWarning, match="sharing its memory in place"):
        fn()


def test_views_read_but_not_written_still_compile():
    base = kiln.arange(6, dtype=kiln.float32)
    v = base[1:4]
    fn = kiln.compile(lambda: base.sum() + v.sum() * 2)
    for _ in range(3):
        assert float(fn()) == 15.0 + 2 * 6.0
    assert len(fn.state.specializations) == 1 and not fn.state.events[1:]


def test_gradients_through_a_captured_view_of_a_parameter():
    """A slice of a weight taken outside the call (a positional table's first rows): the gradient
    reaches the weight as eager's does, over several calls."""

    def run(compiled: bool):
        kiln.manual_seed(0)
        table = kiln.nn.Parameter(kiln.randn(6, 3))
        rows = table[:4]  # a view with history, from outside the call
        x = kiln.randn(4, 3)

        def step():
            table.grad = None
            loss = (rows * x).pow(2).sum() + table.sum()
            loss.backward()
            return loss

        fn = kiln.compile(step) if compiled else step
        out = []
        for _ in range(3):
            out.append(float(fn().detach()))
            out.extend(table.grad.numpy().ravel().tolist())
        return out

    np.testing.assert_allclose(run(True), run(False), rtol=1e-5, atol=1e-6)


def test_an_in_place_activation_on_a_convs_permuted_result_is_a_permute_not_an_index_table():
    # kiln's conv returns an (N, C, H, W) view of (C, N, H, W) memory; LeakyReLU(inplace=True) after it
    # (DCGAN's discriminator) was recorded as index_put with an index table of the tensor's size
    def make():
        kiln.manual_seed(0)
        net = kiln.nn.Sequential(kiln.nn.Conv2d(3, 64, 4, 2, 1, bias=False), kiln.nn.LeakyReLU(0.2, inplace=True),
                                 kiln.nn.Conv2d(64, 16, 4, 2, 1, bias=False), kiln.nn.BatchNorm2d(16),
                                 kiln.nn.LeakyReLU(0.2, inplace=True)).double()  # fmt: skip
        # (float64: Adam amplifies float32's rounding)
        return net, mean_square_step(net, kiln.optim.Adam(net.parameters(), lr=1e-2))

    (eager_net, eager), (net, step) = make(), make()
    compiled = kiln.compile(step, wait=True)
    for _ in range(4):
        x = kiln.randn(16, 3, 16, 16, dtype=kiln.float64)
        np.testing.assert_allclose(compiled(x).numpy(), eager(x).numpy(), rtol=1e-10, atol=1e-12)
    for a, b in zip(net.parameters(), eager_net.parameters(), strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10, atol=1e-12)
    graph = compiled.state.specializations[0].traced_graph
    assert not {"index_put", "take_flat"} & {n.op for n in graph.nodes}
    assert all(c.size <= 64 for c in graph.constants.values())
