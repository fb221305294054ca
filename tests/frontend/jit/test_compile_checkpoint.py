"""Activation checkpointing inside compiled code (issue 33: programs compile whole).

``checkpoint`` saves the generator's state before the forward and restores it for backward's
recomputation, so that dropout draws the forward's mask again. The state is a tensor the call
reads and writes back: saving and restoring it are ops of the graph, so a compiled training step
with a checkpointed dropout block runs compiled (no trace break), with eager's numbers on every
call and at every batch size, and leaves the generator where eager leaves it.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.utils.checkpoint import checkpoint
from tests.conftest import assert_close

from .helpers import compiled_calls

rng = np.random.default_rng(3)


def _model() -> nn.Module:
    kiln.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.4), nn.Linear(8, 3))


def _step(model, use_checkpoint: bool = True, use_reentrant: bool = False):
    def step(x):
        for p in model.parameters():
            p.grad = None
        out = checkpoint(model, x, use_reentrant=use_reentrant) if use_checkpoint else model(x)
        (out**2).sum().backward()
        return out.detach(), [p.grad for p in model.parameters()]

    return step


def _calls(step, batches, seed: int):
    """Each batch through ``step`` after ``manual_seed(seed)``: the results, the generator's state
    after each call, and the next eager draw after the last."""
    kiln.manual_seed(seed)
    results, states = [], []
    for xb in batches:
        out, grads = step(kiln.tensor(xb, requires_grad=True))
        results.append([out.numpy().copy()] + [g.numpy().copy() for g in grads])
        states.append(kiln.get_rng_state().numpy().copy())
    return results, states, kiln.rand(5).numpy()


def _assert_same_runs(got, expected) -> None:
    (results, states, draw), (ref_results, ref_states, ref_draw) = got, expected
    for i, (r, e) in enumerate(zip(results, ref_results, strict=True)):
        assert (r[0] == 0).tolist() == (e[0] == 0).tolist(), f"call {i}: a different dropout mask"
        for a, b in zip(r, e, strict=True):
            assert_close(a, b, rtol=1e-5, atol=1e-6)
    for i, (s, e) in enumerate(zip(states, ref_states, strict=True)):
        np.testing.assert_array_equal(s, e, err_msg=f"generator state after call {i}")
    np.testing.assert_array_equal(draw, ref_draw)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_dropout_step_compiles_with_eagers_numbers(use_reentrant):
    batches = [rng.normal(size=(6, 4)).astype(np.float32) for _ in range(4)]
    model = _model()
    compiled = kiln.compile(_step(model, use_reentrant=use_reentrant))
    got = _calls(compiled, batches, seed=11)
    assert compiled_calls(compiled) == [3]  # no trace break: the calls after the first ran compiled
    _assert_same_runs(got, _calls(_step(model, use_reentrant=use_reentrant), batches, seed=11))
    # and checkpointing changes nothing: the plain block's gradients from the same seed
    _assert_same_runs(got, _calls(_step(model, use_checkpoint=False), batches, seed=11))


def test_checkpointed_dropout_step_over_dynamic_batch_sizes():
    batches = [rng.normal(size=(n, 4)).astype(np.float32) for n in (5, 7, 5, 9, 3)]
    model = _model()
    compiled = kiln.compile(_step(model), dynamic=True)
    got = _calls(compiled, batches, seed=4)
    # one program for every size: the first call traces, the second (another size) traces it with
    # dynamic sizes, the other three run it
    assert compiled_calls(compiled) == [3]
    _assert_same_runs(got, _calls(_step(model), batches, seed=4))


def test_checkpoint_float64_gradients_match_finite_differences_when_compiled(torch):
    w = rng.normal(size=(3, 3))

    def block(x, weight):
        return kiln.tanh(x @ weight) * x

    weight = kiln.tensor(w, requires_grad=True)

    @kiln.compile
    def grads(x):
        weight.grad = None
        checkpoint(block, x, weight, use_reentrant=False).pow(2).sum().backward()
        return x.grad, weight.grad

    def loss(x: np.ndarray, wt: np.ndarray) -> float:
        return float(((np.tanh(x @ wt) * x) ** 2).sum())

    for _ in range(3):
        x = rng.normal(size=(2, 3))
        gx, gw = grads(kiln.tensor(x, requires_grad=True))
        eps = 1e-6
        for value, grad, which in ((x, gx, 0), (w, gw, 1)):
            numeric = np.zeros_like(value)
            for i in np.ndindex(value.shape):
                up, down = value.copy(), value.copy()
                up[i] += eps
                down[i] -= eps
                args_up, args_down = ((up, w), (down, w)) if which == 0 else ((x, up), (x, down))
                numeric[i] = (loss(*args_up) - loss(*args_down)) / (2 * eps)
            assert_close(grad.numpy(), numeric, rtol=1e-6, atol=1e-7)
        # PyTorch's checkpoint gives the same gradients
        tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
        torch.utils.checkpoint.checkpoint(lambda a, b: torch.tanh(a @ b) * a, tx, tw, use_reentrant=False)
        (torch.utils.checkpoint.checkpoint(lambda a, b: torch.tanh(a @ b) * a, tx, tw, use_reentrant=False) ** 2
         ).sum().backward()  # fmt: skip
        assert_close(gx.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-12)
        assert_close(gw.numpy(), tw.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert compiled_calls(grads) == [2]


def test_a_leaf_made_inside_the_call_keeps_no_grad_state():
    # checkpoint's recomputation makes its inputs leaves and reads their .grad; so does a gradient
    # penalty. Such a tensor is gone after the call: its .grad is nothing to capture or write back.
    w = kiln.tensor(rng.normal(size=(3, 2)).astype(np.float32), requires_grad=True)

    def input_gradient(x):
        w.grad = None
        leaf = x.detach().requires_grad_()
        kiln.tanh(leaf @ w).sum().backward()
        return leaf.grad * 2.0

    compiled = kiln.compile(input_gradient)
    for _ in range(4):
        x = rng.normal(size=(4, 3)).astype(np.float32)
        assert_close(compiled(kiln.tensor(x)), input_gradient(kiln.tensor(x)), rtol=1e-5, atol=1e-6)
    assert compiled_calls(compiled) == [3]


def test_a_training_step_with_an_optimizer_and_a_checkpointed_block_compiles():
    # Here the step's autograd graph outlives the call's trace: what checkpoint keeps for backward
    # (the saved random state) must be the graph's, not state the call stored away.
    def make():
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 16))
        opt = kiln.optim.SGD(model.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad()
            loss = checkpoint(model, x, use_reentrant=False).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()

        return step, model

    (compiled, model), (eager, reference) = make(), make()
    compiled = kiln.compile(compiled)
    batches = [rng.normal(size=(8, 16)).astype(np.float32) for _ in range(5)]
    kiln.manual_seed(21)
    got = [compiled(kiln.tensor(b)).item() for b in batches]
    got_state = kiln.get_rng_state().numpy().copy()
    kiln.manual_seed(21)
    losses = [eager(kiln.tensor(b)).item() for b in batches]
    assert compiled_calls(compiled) == [4]
    assert_close(np.array(got), np.array(losses), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_state, kiln.get_rng_state().numpy())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert_close(p, q, rtol=1e-5, atol=1e-6)
