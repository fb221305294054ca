"""Optimizer hooks (``kiln/optim/_hooks.py``) against torch's: step pre/post hooks, global ones, state-dict
and load-state-dict hooks, and a compiled training step whose optimizer has hooks (its guard)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import kiln
from tests.conftest import assert_close
from tests.frontend.jit.helpers import mean_square_step

W0 = np.random.default_rng(0).standard_normal((2, 3))


def _setup(lib, optimizer: str = "SGD"):
    w = lib.tensor(W0.copy(), requires_grad=True)
    kwargs = {"lr": 0.1, "momentum": 0.9} if optimizer == "SGD" else {"lr": 0.1}
    opt = getattr(lib.optim, optimizer)([w], **kwargs)
    return w, opt


def _steps(lib, w, opt, n: int = 3):
    for k in range(n):
        opt.zero_grad()
        ((w * (k + 1)) ** 2).sum().backward()
        opt.step()


def _record(lib):
    """The same hooks on each library: each call's kind, its args' length and the step count."""
    calls: list = []
    w, opt = _setup(lib)
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append(("pre", len(args), sorted(kwargs))))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append(("post", len(args), sorted(kwargs))))
    module = importlib.import_module(f"{lib.__name__}.optim.optimizer")
    handles = [
        module.register_optimizer_step_pre_hook(lambda o, args, kwargs: calls.append(("global pre", o is opt))),
        module.register_optimizer_step_post_hook(lambda o, args, kwargs: calls.append(("global post", o is opt))),
    ]
    try:
        _steps(lib, w, opt, 2)
    finally:
        for handle in handles:
            handle.remove()
    _steps(lib, w, opt, 1)  # the global hooks removed
    return calls, w.detach().numpy()


def test_step_hooks_run_in_torchs_order_and_global_ones_for_every_optimizer(torch):
    mine, w_mine = _record(kiln)
    theirs, w_theirs = _record(torch)
    assert mine == theirs
    assert mine[:4] == [("global pre", True), ("pre", 1, []), ("post", 1, []), ("global post", True)]
    assert_close(w_mine, w_theirs, rtol=1e-12, atol=1e-12)


def test_a_pre_hook_replaces_the_steps_arguments_and_a_bad_return_raises_as_torch(torch):
    results = {}
    for lib in (kiln, torch):
        w, opt = _setup(lib, "LBFGS")
        closure = lambda w=w, opt=opt: (opt.zero_grad(), ((w - 1) ** 2).sum().backward())  # noqa: E731
        calls = []

        def real(w=w, opt=opt, calls=calls):
            calls.append(1)
            opt.zero_grad()
            loss = ((w - 1) ** 2).sum()
            loss.backward()
            return loss

        handle = opt.register_step_pre_hook(lambda o, args, kwargs, real=real: ((args[0], real), kwargs))
        opt.step(closure)  # runs ``real``, the hook's argument, instead
        handle.remove()
        opt.register_step_pre_hook(lambda o, args, kwargs: 1)
        with pytest.raises(RuntimeError, match="must return None or a tuple of \\(new_args, new_kwargs\\), but got 1"):
            opt.step(real)
        results[lib.__name__] = (len(calls) > 0, w.detach().numpy())
    assert results["kiln"][0] and results["torch"][0]
    assert_close(results["kiln"][1], results["torch"][1], rtol=1e-9, atol=1e-12)


def test_a_removed_hook_and_a_hook_used_as_a_context_manager_run_no_more():
    w, opt = _setup(kiln)
    calls = []
    with opt.register_step_post_hook(lambda o, a, k: calls.append(1)):
        _steps(kiln, w, opt, 2)
    _steps(kiln, w, opt, 2)
    assert calls == [1, 1] and not opt._optimizer_step_post_hooks


def _state_dicts(lib):
    w, opt = _setup(lib)
    _steps(lib, w, opt, 2)
    order = []
    opt.register_state_dict_pre_hook(lambda o: order.append("pre"))
    opt.register_state_dict_pre_hook(lambda o: order.append("pre first"), prepend=True)

    def post(o, sd):
        order.append("post")
        sd["param_groups"][0]["lr"] = 0.5  # (a copy of the group: the optimizer's own is unchanged)
        return sd

    opt.register_state_dict_post_hook(post)
    sd = opt.state_dict()
    other_w, other = _setup(lib)

    def load_pre(o, sd):
        order.append("load pre")
        sd = dict(sd)
        sd["param_groups"] = [dict(g, momentum=0.5) for g in sd["param_groups"]]
        return sd

    other.register_load_state_dict_pre_hook(load_pre)
    other.register_load_state_dict_post_hook(lambda o: order.append("load post"))
    other.load_state_dict(sd)
    _steps(lib, other_w, other, 2)
    group = other.param_groups[0]
    return order, (group["lr"], group["momentum"], opt.param_groups[0]["lr"]), other_w.detach().numpy()


def test_state_dict_and_load_state_dict_hooks_as_torch(torch):
    mine, theirs = _state_dicts(kiln), _state_dicts(torch)
    assert mine[0] == theirs[0] == ["pre first", "pre", "post", "load pre", "load post"]
    assert mine[1] == theirs[1] == (0.5, 0.5, 0.1)
    assert_close(mine[2], theirs[2], rtol=1e-10, atol=1e-12)


def test_a_compiled_step_runs_its_optimizers_hooks_and_traces_again_when_they_change():
    def make():
        kiln.manual_seed(0)
        model = kiln.nn.Linear(4, 3)
        opt = kiln.optim.Adam(model.parameters(), lr=0.01)
        ema = [p.detach().clone() for p in model.parameters()]

        def update_ema(o, args, kwargs):  # an exponential moving average of the weights, after each step
            with kiln.no_grad():
                for e, p in zip(ema, model.parameters(), strict=True):
                    e.mul_(0.9).add_(p, alpha=0.1)

        return model, opt, ema, update_ema, mean_square_step(model, opt)

    runs = []
    for compiled in (False, True):
        model, opt, ema, update_ema, step = make()
        fn = kiln.compile(step, wait=True) if compiled else step
        losses, handle = [], None
        for k in range(8):
            if k == 2:
                handle = opt.register_step_post_hook(update_ema)
            if k == 6:
                handle.remove()
            losses.append(float(fn(kiln.ones(5, 4) * (k + 1))))
        runs.append((losses, [e.numpy().copy() for e in ema], [p.detach().numpy().copy() for p in model.parameters()]))
        if compiled:
            reasons = "\n".join(kiln.explain(fn).reasons)
            assert "a step hook of Adam was registered or removed" in reasons, reasons
    (eager_losses, eager_ema, eager_params), (losses, ema, params) = runs
    assert_close(np.array(losses), np.array(eager_losses), rtol=1e-5, atol=1e-6)
    for a, b in zip([*ema, *params], [*eager_ema, *eager_params], strict=True):
        assert_close(a, b, rtol=1e-5, atol=1e-6)
