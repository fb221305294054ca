"""``torch.compile``'s arguments taken by ``kiln.compile`` as a PyTorch program passes them, and
``nn.Module.compile()`` (the module compiled in place), compiled against eager."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from tests.conftest import assert_close


def _net():
    kiln.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "max-autotune"},
        {"mode": "reduce-overhead"},
        {"mode": "default", "fullgraph": True},
        {"options": {"triton.cudagraphs": False, "epilogue_fusion": True}},
        {"backend": "inductor", "dynamic": True},
        {"recompile_limit": 2, "name": "step"},
    ],
)
def test_torch_compiles_arguments_compile_as_kiln_does(kwargs):
    def f(x, w):
        return (x @ w).tanh().sum(0)

    g = kiln.compile(f, wait=True, **kwargs)
    for n in (3, 5, 7):
        x, w = kiln.randn(n, 4), kiln.randn(4, 2)
        assert_close(g(x, w).numpy(), f(x, w).numpy(), rtol=1e-6, atol=1e-6)
    assert g.state.specializations  # compiled, not run as it is
    if "recompile_limit" in kwargs:
        assert g.options.recompile_limit == 2


def test_eager_backends_and_disable_return_the_function_as_it_is():
    def f(x):
        return x + 1

    for kwargs in ({"backend": "eager"}, {"backend": "aot_eager"}, {"disable": True}):
        assert kiln.compile(f, **kwargs) is f
        assert kiln.compile(**kwargs)(f) is f  # as a decorator too
    net = _net()
    assert kiln.compile(net, disable=True) is net


def test_bad_torch_compile_arguments_raise_as_torch_does():
    f = lambda x: x  # noqa: E731
    with pytest.raises(RuntimeError, match="Unrecognized mode=fast, should be one of: default, lite, reduce-overhead"):
        kiln.compile(f, mode="fast")
    with pytest.raises(RuntimeError, match="Either mode or options can be specified, but both can't be specified"):
        kiln.compile(f, mode="max-autotune", options={"a": 1})
    with pytest.raises(RuntimeError, match="Invalid backend: 'nope'"):
        kiln.compile(f, backend="nope")
    with pytest.raises(TypeError, match="is a torch.compile backend, which compiles torch.fx graphs"):
        kiln.compile(f, backend=lambda gm, example_inputs: gm)


def test_module_compile_compiles_its_calls_in_place_and_trains_as_eager():
    def run(compiled: bool):
        net = _net()
        opt = kiln.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        if compiled:
            assert net.compile(mode="max-autotune", wait=True) is None
        losses = []
        for k in range(5):
            x = kiln.ones(6, 4) * (k + 1) / 5
            opt.zero_grad()
            loss = net(x).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return net, losses

    eager, eager_losses = run(False)
    net, losses = run(True)
    assert_close(np.array(losses), np.array(eager_losses), rtol=1e-5, atol=1e-6)
    for a, b in zip(net.parameters(), eager.parameters(), strict=True):
        assert_close(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
    # the module itself: its class, its state dict's names; its calls ran the program
    assert type(net) is nn.Sequential and list(net.state_dict()) == list(eager.state_dict())
    assert net._compiled_call_impl.state.specializations
    # a copy runs uncompiled (the program is the original's), and equals it
    twin = copy.deepcopy(net)
    assert twin._compiled_call_impl is None
    x = kiln.randn(2, 4)
    assert_close(twin(x).detach().numpy(), net(x).detach().numpy(), rtol=1e-6, atol=1e-6)


def test_a_compiled_module_inside_a_compiled_function_or_compiled_again_traces_through():
    net = _net()
    expected = lambda x: net._call_impl(x) * 2  # noqa: E731 - the uncompiled module
    net.compile(wait=True)
    outer = kiln.compile(lambda x: net(x) * 2, wait=True)
    wrapped = kiln.compile(net, wait=True)  # a CompiledModule of a module compiled in place
    for n in (3, 3, 4):
        x = kiln.randn(n, 4)
        want = expected(x).detach().numpy()
        assert_close(outer(x).detach().numpy(), want, rtol=1e-6, atol=1e-6)
        assert_close(wrapped(x).detach().numpy() * 2, want, rtol=1e-6, atol=1e-6)


def test_a_forward_hook_registered_after_module_compile_runs():
    net = _net()
    net.compile(wait=True)
    x = kiln.randn(3, 4)
    before = net(x).detach().numpy()
    net(x)
    net.register_forward_hook(lambda module, inputs, output: output * 3)
    assert_close(net(x).detach().numpy(), before * 3, rtol=1e-6, atol=1e-6)


def test_module_compile_on_a_class_with_its_own_call_runs_it_once():
    class Doubled(nn.Linear):
        def __call__(self, *args, **kwargs):  # the user's, reaching Module.__call__ through super()
            return super().__call__(*args, **kwargs) * 2

    kiln.manual_seed(0)
    net = Doubled(4, 2)
    x = kiln.randn(3, 4)
    want = (net._call_impl(x) * 2).detach().numpy()
    net.compile(wait=True)
    for _ in range(3):
        assert_close(net(x).detach().numpy(), want, rtol=1e-6, atol=1e-6)
    assert net._compiled_call_impl.state.specializations
