"""BatchNorm(momentum=None), the cumulative moving average: the weight 1/n of the n-th batch is read
from ``num_batches_tracked`` as a tensor, so a compiled training step does not break on ``.item()``
(kiln issue 35) and reads the counter on every call. Compiled == eager over several calls (outputs,
running statistics, counter); the running statistics are the averages of the batch statistics
(hand-computed) and PyTorch's."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn

STEPS = 5


def _batches(lib, shape):
    return [
        lib.tensor(np.random.default_rng(s).standard_normal(shape).astype(np.float32) * (s + 1)) for s in range(STEPS)
    ]


def _train(module, batches, compiled: bool):
    step = kiln.compile(lambda x: module(x) * 1) if compiled else (lambda x: module(x) * 1)
    return step, [step(x).detach().numpy() for x in batches]


CASES = [(nn.BatchNorm1d, (4, 3, 5)), (nn.BatchNorm2d, (2, 3, 4, 4)), (nn.BatchNorm1d, (6, 3))]


@pytest.mark.parametrize(("layer", "shape"), CASES)
def test_compiled_cumulative_average_matches_eager_and_the_batch_averages(layer, shape):
    eager_module, compiled_module = layer(3, momentum=None), layer(3, momentum=None)
    batches = _batches(kiln, shape)
    _, eager = _train(eager_module, batches, compiled=False)
    step, compiled = _train(compiled_module, batches, compiled=True)
    assert not [e for e in step.state.events if e.kind == "break"], step.state.events
    assert step.state.specializations[0].calls == STEPS - 1, "every later step ran compiled"
    for k, (a, b) in enumerate(zip(compiled, eager, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"output of step {k}")
    axes = (0, *range(2, len(shape)))
    means = [x.numpy().mean(axis=axes, dtype=np.float64) for x in batches]
    variances = [x.numpy().var(axis=axes, ddof=1, dtype=np.float64) for x in batches]
    for m in (eager_module, compiled_module):
        assert int(m.num_batches_tracked.item()) == STEPS
        np.testing.assert_allclose(m.running_mean.numpy(), np.mean(means, axis=0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m.running_var.numpy(), np.mean(variances, axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("layer", "shape"), CASES)
def test_running_statistics_as_pytorch(layer, shape, torch):
    module = layer(3, momentum=None)
    reference = getattr(torch.nn, layer.__name__)(3, momentum=None)
    step, _ = _train(module, _batches(kiln, shape), compiled=True)
    for x in _batches(torch, shape):
        reference(x)
    np.testing.assert_allclose(module.running_mean.numpy(), reference.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(module.running_var.numpy(), reference.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert int(module.num_batches_tracked.item()) == int(reference.num_batches_tracked.item())
