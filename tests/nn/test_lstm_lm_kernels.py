"""The benchmark's LSTM LM (V=500, H=128, B=16, T=35: issue 34's sizes) with eager kernels on, as a
user runs it: its products on kiln's own product kernel and its recurrences native, eager and
compiled, take PyTorch's steps (losses equal over several steps)."""

from __future__ import annotations

import numpy as np

import kiln
from benchmarks import programs
from kiln.codegen.llvm.product_call import Product
from kiln.codegen.llvm.recurrence_call import LSTMKernels
from kiln.frontend import eager_kernels


def test_lstm_lm_on_kiln_kernels_takes_pytorchs_steps(torch, monkeypatch):
    calls = {"product": 0, "recurrence": 0}

    def counting(cls, method, key):
        original = getattr(cls, method)

        def run(self, *arrays):
            result = original(self, *arrays)
            calls[key] += result is not False and result is not None
            return result

        monkeypatch.setattr(cls, method, run)

    counting(Product, "__call__", "product")
    counting(LSTMKernels, "forward", "recurrence")
    monkeypatch.setattr(eager_kernels.CACHE, "synchronous", True)
    eager_kernels.CACHE.clear()
    eager_kernels.set_enabled(True)
    try:
        program = programs.PROGRAMS["lstm_lm"]
        sizes = program.sizes[False]
        batch_list = programs.batches(program, sizes, 2)
        ours = programs.setup(program, kiln, sizes, dropout=False)
        theirs = programs.setup(program, torch, sizes, dropout=False, reference=ours)
        compiled = kiln.compile(programs.setup(program, kiln, sizes, dropout=False).step)
        expected = programs.losses(programs.cycling(theirs.step, programs.on(torch, batch_list)), 4)
        eager = programs.losses(programs.cycling(ours.step, programs.on(kiln, batch_list)), 4)
        eager_calls = dict(calls)
        found = programs.losses(programs.cycling(compiled, programs.on(kiln, batch_list)), 4)
    finally:
        eager_kernels.set_enabled(False)
        eager_kernels.CACHE.clear()
    assert not np.allclose(expected[0], expected[-1])  # the steps train
    np.testing.assert_allclose(eager, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-5)
    # per eager step: the 2 input projections, the decoder, its 2 gradients and 3 products per layer
    assert eager_calls["product"] >= 4 * 9 and eager_calls["recurrence"] >= 4 * 2
    assert calls["product"] > eager_calls["product"] and calls["recurrence"] > eager_calls["recurrence"]
