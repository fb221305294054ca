"""Index kernels over symbolic positions (issue 33, item 2): an embedding's ``take`` and its gradient's
``index_put`` over a ``(B, T)`` batch of dynamic length are generated once
(kiln/codegen/llvm/gather_scatter.py), not run on their eager kernels at every size.

Compiled calls are compared with eager ones over several lengths: values, gradients, the error of an
index out of range.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.frontend.jit.symbolic_program import SymbolicProgram
from tests.conftest import assert_close
from tests.frontend.jit.test_dynamic_sizes import specs

rng = np.random.default_rng(11)


def _model():
    kiln.manual_seed(0)
    tok, pos = nn.Embedding(13, 8), nn.Embedding(32, 8)

    def step(idx):
        out = tok(idx) + pos(kiln.arange(idx.shape[1]))
        (out * out).sum().backward()
        return out

    return step, (tok.weight, pos.weight)


def _declined(compiled) -> list:
    spec = compiled.state.specializations[-1]
    assert spec.dynamic is not None and isinstance(spec.program, SymbolicProgram), compiled.state.events
    return spec.report.declined


def test_embeddings_and_their_gradients_over_varying_lengths_equal_eager_with_generated_index_kernels():
    step, weights = _model()
    compiled = kiln.compile(step)
    for t in [4, 7, 11, 7, 5, 16]:
        idx = kiln.tensor(rng.integers(0, 13, (3, t)))  # repeated rows: the gradient adds them up
        for w in weights:
            w.grad = None
        expected = step(idx).detach().numpy()
        grads = [w.grad.numpy().copy() for w in weights]
        for w in weights:
            w.grad = None
        assert_close(compiled(idx).detach().numpy(), expected, rtol=1e-6, atol=1e-6)
        for w, grad in zip(weights, grads, strict=True):
            assert_close(w.grad.numpy(), grad, rtol=1e-5, atol=1e-6)
    assert specs(compiled) == 2
    declined = _declined(compiled)
    assert not any(name in ("(take)", "(index_put)") for name, _ in declined), declined


def test_an_index_out_of_range_at_a_dynamic_length_raises_what_eager_raises():
    step, weights = _model()
    compiled = kiln.compile(step)
    for t in [4, 7]:
        compiled(kiln.tensor(rng.integers(0, 13, (3, t))))
    bad = rng.integers(0, 13, (3, 9))
    bad[1, 2] = 13
    with pytest.raises(IndexError, match="index out of range") as eager:
        step(kiln.tensor(bad))
    with pytest.raises(IndexError, match="index out of range") as traced:
        compiled(kiln.tensor(bad))
    assert str(traced.value) == str(eager.value)
    assert specs(compiled) == 2
