"""Optimizer steps on the arrays (``kiln/optim/_on_arrays.py``): the update a step runs while its
compiled program is not ready (the tests run with eager kernels off) equals the per-parameter
loop's (``fused=False``) bit for bit, and PyTorch's."""

import numpy as np
import pytest

import kiln
from kiln.optim import _on_arrays

SHAPES = [(30, 40), (500,), (7, 9, 11), (1,)]


def _pair(make, dtype=np.float32, shapes=SHAPES):
    rng = np.random.default_rng(3)
    values = [rng.normal(size=s).astype(dtype) for s in shapes]
    grads = [[rng.normal(size=s).astype(dtype) for s in shapes] for _ in range(4)]
    loops = [kiln.tensor(v.copy(), requires_grad=True) for v in values]
    arrays = [kiln.tensor(v.copy(), requires_grad=True) for v in values]
    return (loops, make(loops, fused=False)), (arrays, make(arrays)), grads


def _steps_equal(make, dtype=np.float32, skip=None, shapes=SHAPES, on_arrays=True):
    (loops, loop_opt), (arrays, array_opt), grads = _pair(make, dtype, shapes)
    ran = []
    real = _on_arrays.run_on_arrays

    def counting(*args):
        ran.append(real(*args))
        return ran[-1]

    _on_arrays.run_on_arrays = counting
    try:
        for step, step_grads in enumerate(grads):
            for params in (loops, arrays):
                for i, (p, g) in enumerate(zip(params, step_grads, strict=True)):
                    p.grad = None if skip == (step, i) else kiln.tensor(g)
            versions = [p._version[0] for p in arrays]
            loop_opt.step()
            array_opt.step()
            assert all(p._version[0] > v for p, v in zip(arrays, versions, strict=True) if p.grad is not None)
            for a, b in zip(loops, arrays, strict=True):
                assert b.dtype == a.dtype
                np.testing.assert_array_equal(b.detach().numpy(), a.detach().numpy())
                for key, value in loop_opt.state[a].items():
                    assert array_opt.state[b][key].dtype == value.dtype
                    np.testing.assert_array_equal(array_opt.state[b][key].numpy(), value.numpy())
    finally:
        _on_arrays.run_on_arrays = real
    assert ran and all(ran) == on_arrays  # the arrays' path ran every step (or declined every one)


ADAM = [{}, {"amsgrad": True, "weight_decay": 0.1, "maximize": True}, {"weight_decay": 0.05, "decoupled_weight_decay": True},
        {"betas": (0.5, 0.999), "eps": 1e-3}]  # fmt: skip


@pytest.mark.parametrize("kwargs", ADAM)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_on_the_arrays_equals_its_loop_bit_for_bit(kwargs, dtype):
    _steps_equal(lambda params, **f: kiln.optim.Adam(params, lr=0.01, **kwargs, **f), dtype)


def test_adamw_on_the_arrays_equals_its_loop_and_a_missing_gradient_is_skipped():
    _steps_equal(lambda params, **f: kiln.optim.AdamW(params, lr=0.01, **f), skip=(1, 2))


def test_a_group_with_a_0d_parameter_runs_the_loop():
    # (its state meets the 0-d float64 hyperparameters as an equal: the loop rounds each in-place
    # product to float32, which one expression on the arrays would not)
    _steps_equal(lambda params, **f: kiln.optim.Adam(params, lr=0.01, **f), shapes=[(3, 4), ()], on_arrays=False)


SGD = [{}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
       {"momentum": 0.5, "maximize": True}]  # fmt: skip


@pytest.mark.parametrize("kwargs", SGD)
def test_sgd_on_the_arrays_equals_its_loop_bit_for_bit(kwargs):
    _steps_equal(lambda params, **f: kiln.optim.SGD(params, lr=0.1, **kwargs, **f))


def test_adam_on_the_arrays_matches_pytorch(torch):
    rng = np.random.default_rng(4)
    values = [rng.normal(size=s).astype(np.float32) for s in [(64, 64), (4096,)]]
    ours = [kiln.tensor(v.copy(), requires_grad=True) for v in values]
    theirs = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    opt = kiln.optim.Adam(ours, lr=0.01, weight_decay=0.01, amsgrad=True)
    reference = torch.optim.Adam(theirs, lr=0.01, weight_decay=0.01, amsgrad=True)
    for _ in range(3):
        for a, b in zip(ours, theirs, strict=True):
            g = rng.normal(size=a.shape).astype(np.float32)
            a.grad, b.grad = kiln.tensor(g), torch.tensor(g)
        opt.step()
        reference.step()
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"):
            np.testing.assert_allclose(opt.state[a][key].numpy(), reference.state[b][key].numpy(), rtol=1e-5, atol=1e-7)


def test_a_traced_step_still_records_the_loop():
    w = kiln.zeros(300, requires_grad=True)
    opt = kiln.optim.Adam([w], lr=0.1)

    @kiln.compile
    def step(g):
        w.grad = g
        opt.step()

    for _ in range(3):
        step(kiln.ones(300))
    np.testing.assert_allclose(w.detach().numpy(), np.full(300, -0.3, np.float32), rtol=1e-5)


def test_a_float16_parameter_takes_the_loop():
    w = kiln.ones(4, dtype=kiln.float16, requires_grad=True)
    assert not _on_arrays.may_run([w])
    opt = kiln.optim.SGD([w], lr=0.5)
    w.grad = kiln.ones(4, dtype=kiln.float16)
    opt.step()
    np.testing.assert_array_equal(w.detach().numpy(), np.full(4, 0.5, np.float16))
