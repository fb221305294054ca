"""Eager scaled_dot_product_attention on one compiled program (``eager_composites``), with its
compiled backward; with dropout it stays eager, on the generator's stream."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.frontend import eager_kernels

rng = np.random.default_rng(11)


def _inputs(shape=(2, 3, 16, 8)):
    return [kiln.tensor(rng.normal(size=shape).astype(np.float32), requires_grad=True) for _ in range(3)]


def _mask(kind: str):
    if kind == "bool":
        return kiln.tensor(rng.uniform(size=(16, 16)) < 0.7) | kiln.eye(16, dtype=kiln.bool)
    if kind == "float":
        return kiln.tensor(rng.normal(size=(16, 16)).astype(np.float32))
    return None


@pytest.mark.parametrize("kind", ["causal", "bool", "float"])
def test_attention_runs_one_compiled_program_and_equals_torch(on, torch, kind):
    q, k, v = _inputs()
    mask, causal = _mask(kind), kind == "causal"
    g = rng.normal(size=(2, 3, 16, 8)).astype(np.float32)
    for _ in range(2):  # the first call runs eagerly and queues the compile; the second, the program
        for t in (q, k, v):
            t.grad = None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        out.backward(kiln.tensor(g))
        assert eager_kernels.wait(120)
    programs = [e.program for key, e in eager_kernels.CACHE.entries.items() if key[0] == "scaled_dot_product_attention"]
    assert len(programs) == 1 and programs[0] is not None
    tq, tk, tv = (torch.tensor(t.detach().numpy(), requires_grad=True) for t in (q, k, v))
    tmask = None if mask is None else torch.tensor(mask.numpy())
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask, is_causal=causal)
    expected.backward(torch.tensor(g))
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
    for got, want in zip((q, k, v), (tq, tk, tv), strict=True):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_attention_with_dropout_stays_eager_and_follows_the_generator(on):
    q, k, v = _inputs()
    runs = [F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, generator=kiln.Generator().manual_seed(3))
            for _ in range(2)]  # fmt: skip
    assert eager_kernels.wait(120)
    assert not [key for key in eager_kernels.CACHE.entries if key[0] == "scaled_dot_product_attention"]
    # the same dropout from the same generator seed: equal to rounding (a product's blocking may follow
    # the BLAS thread count, which a product in a background compile can change between the two runs)
    np.testing.assert_allclose(runs[0].detach().numpy(), runs[1].detach().numpy(), rtol=1e-5, atol=1e-6)
    plain = F.scaled_dot_product_attention(q, k, v)
    assert not np.allclose(runs[0].detach().numpy(), plain.detach().numpy())
