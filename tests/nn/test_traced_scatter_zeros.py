"""The gradients of a gather (cross-entropy's pick of the target's log-probability) and of a take (an
embedding's rows) scatter into zeros of their input's shape. Traced, those zeros are a 0-d constant
broadcast, not a constant array of that shape: an LSTM LM's (B T, V) logits made an 11 MiB constant at
T=350, copied by the trace, hashed by the passes and the program cache, and read by every call."""

from __future__ import annotations

import numpy as np

import kiln
import kiln.nn as nn
from tests.conftest import assert_close


def _step(model, optimizer):
    def step(idx, targets):
        optimizer.zero_grad()
        logits = model(idx)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def _model():
    kiln.manual_seed(0)
    return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 40))


def _batches(rows: int, calls: int) -> list:
    rng = np.random.default_rng(rows)
    return [(kiln.from_numpy(rng.integers(0, 50, (rows, 3))), kiln.from_numpy(rng.integers(0, 40, (rows, 3))))
            for _ in range(calls)]  # fmt: skip


def test_scattered_gradients_trace_no_constant_of_their_inputs_shape():
    largest = []
    for rows in (4, 40):
        model = _model()
        fn = kiln.compile(_step(model, kiln.optim.SGD(model.parameters(), lr=0.5)))
        for batch in _batches(rows, 2):
            fn(*batch)
        assert fn.state.specializations
        sizes = [a.size for spec in fn.state.specializations for a in spec.traced_graph.constants.values()]
        largest.append(max(sizes, default=0))
    # the logits' gradient was a constant of (rows * 3, 40) zeros (480 and 4,800 elements), the table's (50, 8)
    assert largest[0] == largest[1] and largest[1] < 8 * 40, largest


def test_compiled_steps_equal_eager_ones():
    results = []
    for compiled in (True, False):
        model = _model()
        step = _step(model, kiln.optim.SGD(model.parameters(), lr=0.5))
        fn = kiln.compile(step) if compiled else step
        losses = [fn(*batch) for batch in _batches(6, 3)]
        results.append([*losses, *(p.detach().clone() for p in model.parameters())])
    for got, want in zip(*results, strict=True):
        assert_close(got, want, rtol=1e-5, atol=1e-6)
