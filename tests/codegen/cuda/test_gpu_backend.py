"""The CUDA backend on a real GPU (marked ``cuda``): graphs of CUDA tensors choose it by their
device; compiled results against eager CUDA results over several calls, a whole training step
included. Run with ``python -m pytest -m cuda`` on a machine with an NVIDIA GPU and cupy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.codegen.backend import backend_for
from tests.conftest import assert_close

pytestmark = pytest.mark.cuda
rng = np.random.default_rng(0)


def _t(*shape):
    return kiln.tensor(rng.standard_normal(shape).astype(np.float32), device="cuda")


def _agree(fn, make, calls=4, rtol=1e-5, atol=1e-6):
    compiled = kiln.compile(fn)
    for _ in range(calls):
        args = make()
        got, expected = compiled(*args), fn(*args)
        for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple)
                        else (expected,), strict=True):  # fmt: skip
            assert g.is_cuda
            assert_close(g.cpu(), e.cpu(), rtol=rtol, atol=atol)
    return compiled


def test_a_cuda_graph_chooses_the_cuda_backend():
    compiled = _agree(lambda x: (x * 2).exp(), lambda: (_t(100),))
    assert backend_for(compiled.graph).name == "cuda"


def test_elementwise_reductions_softmax_layernorm():
    def f(x, w):
        n = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        return x.softmax(-1), n * w, x.sum(-1), x.amax(-1), nn.functional.gelu(x)

    _agree(f, lambda: (_t(64, 1000), _t(1000)), rtol=1e-5, atol=1e-5)


def test_large_elementwise_uses_the_grid_stride_loop():
    _agree(lambda x, y: (x * y + 1).tanh(), lambda: (_t(1 << 22), _t(1 << 22)), rtol=1e-6, atol=1e-6)


def test_training_step_compiles_to_one_cuda_program(caplog):
    runs = []
    for compiled in (True, False):
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10)).to("cuda")
        opt = kiln.optim.Adam(model.parameters(), lr=1e-3)

        def step(x, y, model=model, opt=opt):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        fn = kiln.compile(step) if compiled else step
        data = np.random.default_rng(1)
        losses = []
        for _ in range(5):
            x = kiln.tensor(data.standard_normal((16, 32)).astype(np.float32), device="cuda")
            y = kiln.tensor(data.integers(0, 10, 16), device="cuda")
            losses.append(fn(x, y).item())
        runs.append((losses, [p.detach().cpu().numpy() for p in model.parameters()]))
    assert not [r.message for r in caplog.records if "running eagerly" in r.message]  # it compiled
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-4)
    for a, b in zip(runs[0][1], runs[1][1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
