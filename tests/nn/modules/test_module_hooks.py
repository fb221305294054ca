"""A module's hooks as PyTorch's: full backward hooks and backward pre-hooks (their ``grad_input`` and
``grad_output`` entry by entry, replacements, errors), and the forward hooks' ``prepend``,
``with_kwargs`` and ``always_call``; compiled steps with such hooks against eager."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from tests.conftest import assert_close
from tests.frontend.jit.helpers import compiled_calls


def _numpy(grads) -> list:
    return [None if g is None else np.asarray(g.detach().numpy(), dtype=np.float64) for g in grads]


def _same_entries(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None), (got, want)
        if g is not None:
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def _two_outputs(lib, b_needs_grad: bool, k_given: bool, use_second: bool):
    """What the hooks of a two-input, two-output module saw, in order: ("pre", grad_output) and
    ("full", grad_input, grad_output), and the inputs' gradients."""

    class Two(lib.nn.Module):
        def forward(self, a, b, k=1.0):
            return a * b * 2, b * 3 * k

    module, seen = Two(), []
    module.register_full_backward_pre_hook(lambda m, go: seen.append(("pre", _numpy(go))))
    module.register_full_backward_hook(lambda m, gi, go: seen.append(("full", _numpy(gi), _numpy(go))))
    a = lib.tensor([1.0, 2.0], requires_grad=True)
    b = lib.tensor([3.0, -1.0], requires_grad=b_needs_grad)
    x, y = module(a, b, 2.0) if k_given else module(a, b)
    loss = (x * lib.tensor([1.0, 5.0])).sum() + (y.sum() if use_second else 0)
    loss.backward()
    return seen, _numpy([a.grad, b.grad])


@pytest.mark.parametrize("b_needs_grad", [False, True])
@pytest.mark.parametrize("k_given", [False, True])
@pytest.mark.parametrize("use_second", [False, True])
def test_full_backward_hooks_see_torchs_gradients(torch, b_needs_grad, k_given, use_second):
    # an output no gradient reached is None in grad_output; an input tensor none reached is zeros in
    # grad_input; a non-tensor argument is None; an argument left to its default has no entry
    got = _two_outputs(kiln, b_needs_grad, k_given, use_second)
    want = _two_outputs(torch, b_needs_grad, k_given, use_second)
    assert [e[0] for e in got[0]] == [e[0] for e in want[0]] == ["pre", "full"]
    for g, w in zip(got[0], want[0], strict=True):
        for got_entries, want_entries in zip(g[1:], w[1:], strict=True):
            _same_entries(got_entries, want_entries)
    _same_entries(got[1], want[1])


def test_a_module_whose_input_needs_no_gradient_still_calls_its_full_hook():
    lin, seen = kiln.nn.Linear(2, 1), []
    lin.register_full_backward_hook(lambda m, gi, go: seen.append((gi, _numpy(go))))
    lin(kiln.ones(3, 2)).sum().backward()
    assert len(seen) == 1 and seen[0][0] == (None,)
    np.testing.assert_array_equal(seen[0][1][0], np.ones((3, 1)))
    assert lin.weight.grad is not None


def test_hooks_replace_gradients_as_torchs(torch):
    def run(lib):
        out = []
        for register in ("full", "pre"):
            lin = lib.nn.Linear(2, 1)
            with lib.no_grad():
                lin.weight.copy_(lib.tensor([[1.0, -2.0]]))
                lin.bias.zero_()
            if register == "full":  # the input's gradient scaled; the weight's unchanged
                lin.register_full_backward_hook(lambda m, gi, go: (gi[0] * 10,))
            else:  # the output's gradient scaled: every gradient below it is
                lin.register_full_backward_pre_hook(lambda m, go: (go[0] * 10,))
            x = lib.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
            lin(x).sum().backward()
            out += _numpy([x.grad, lin.weight.grad])
        return out

    for g, w in zip(run(kiln), run(torch), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_a_hook_returning_the_wrong_number_of_gradients_is_an_error():
    lin = kiln.nn.Linear(2, 1)
    lin.register_full_backward_hook(lambda m, gi, go: (gi[0], gi[0]))
    with pytest.raises(RuntimeError, match="invalid number of grad_input, got 2, but expected 1"):
        lin(kiln.ones(1, 2, requires_grad=True)).sum().backward()
    pre = kiln.nn.Linear(2, 1)
    pre.register_full_backward_pre_hook(lambda m, go: (go[0], go[0]))
    with pytest.raises(RuntimeError, match="invalid number of grad_output, got 2, but expected 1"):
        pre(kiln.ones(1, 2, requires_grad=True)).sum().backward()
    first = kiln.nn.Linear(2, 1)  # its input needs no gradient: the hook may not replace grad_input
    first.register_full_backward_hook(lambda m, gi, go: (kiln.ones(1, 2),))
    with pytest.raises(RuntimeError, match="inputs need no gradient should always return None"):
        first(kiln.ones(1, 2)).sum().backward()


def test_removed_and_prepended_backward_hooks():
    lin, order = kiln.nn.Linear(2, 1), []
    lin.register_full_backward_hook(lambda m, gi, go: order.append("second"))
    lin.register_full_backward_hook(lambda m, gi, go: order.append("first"), prepend=True)
    handle = lin.register_full_backward_pre_hook(lambda m, go: order.append("pre"))
    lin(kiln.ones(1, 2, requires_grad=True)).sum().backward()
    handle.remove()
    lin(kiln.ones(1, 2, requires_grad=True)).sum().backward()
    assert order == ["pre", "first", "second", "first", "second"]


def test_no_hook_runs_without_a_gradient():
    lin, seen = kiln.nn.Linear(2, 1), []
    lin.register_full_backward_hook(lambda m, gi, go: seen.append(1))
    with kiln.no_grad():
        out = lin(kiln.ones(1, 2, requires_grad=True))
    assert out.grad_fn is None and seen == []


def test_forward_hooks_with_kwargs_prepend_and_always_call_as_torchs(torch):
    def run(lib):
        class Scale(lib.nn.Module):
            def forward(self, x, *, factor=1.0):
                if factor < 0:
                    raise ValueError("negative factor")
                return x * factor

        m, seen = Scale(), []
        m.register_forward_hook(lambda mod, args, out: seen.append("plain"))
        m.register_forward_hook(lambda mod, args, out: seen.append("prepended"), prepend=True)
        m.register_forward_pre_hook(lambda mod, args, kwargs: (args, {"factor": kwargs["factor"] * 2}),
                                    with_kwargs=True)  # fmt: skip
        m.register_forward_hook(lambda mod, args, kwargs, out: seen.append(("kwargs", kwargs["factor"])),
                                with_kwargs=True)  # fmt: skip
        m.register_forward_hook(lambda mod, args, out: seen.append(("always", out is None)), always_call=True)
        result = m(lib.ones(2), factor=1.5)
        with pytest.raises(ValueError, match="negative factor"):
            m(lib.ones(2), factor=-1.0)
        return seen, result.numpy().tolist()

    assert run(kiln) == run(torch)


def test_a_removed_hook_forgets_its_flags():
    m = kiln.nn.Identity()
    handle = m.register_forward_hook(lambda mod, args, kwargs, out: None, with_kwargs=True, always_call=True)
    handle.remove()
    assert not m._forward_hooks and not m._forward_hooks_with_kwargs and not m._forward_hooks_always_called


def test_a_compiled_step_with_a_gradient_scaling_hook_equals_eager():
    def make():
        kiln.manual_seed(0)
        net = kiln.nn.Sequential(kiln.nn.Linear(4, 8), kiln.nn.Tanh(), kiln.nn.Linear(8, 1))
        net[2].register_full_backward_hook(lambda m, gi, go: (gi[0].clamp(-0.01, 0.01),))
        net[0].register_full_backward_pre_hook(lambda m, go: (go[0] * 0.5,))
        opt = kiln.optim.SGD(net.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = ((net(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss.detach()

        return net, step

    (eager_net, eager_step), (net, step) = make(), make()
    compiled = kiln.compile(step)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x, y = (
            kiln.tensor(rng.standard_normal((5, 4), dtype=np.float32)),
            kiln.tensor(rng.standard_normal((5, 1), dtype=np.float32)),
        )
        assert_close(compiled(x, y), eager_step(x, y), rtol=1e-5, atol=1e-6)
    for p, q in zip(net.parameters(), eager_net.parameters(), strict=True):
        assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert sum(compiled_calls(compiled)) >= 2  # it really ran compiled, hooks and all
