"""Elementwise kernels over rows of a symbolic length (issue 33, item 2): attention's ``(B, H, T, T)``
scores with a dynamic ``T`` run as ``(B*H*T, T)`` kernels generated once
(kiln/codegen/llvm/symbolic_rows.py), not on their eager kernels.

Each test compares compiled calls with the same function run eagerly over several sizes (values and
gradients), and checks that the row kernels were generated (a kernel reading two sizes: ``R``, ``n``).
"""

from __future__ import annotations

import threading

import numpy as np

import kiln
import kiln.nn.functional as F
from kiln.frontend.jit.symbolic_program import SymbolicProgram
from tests.conftest import assert_close
from tests.frontend.jit.test_dynamic_sizes import specs

rng = np.random.default_rng(7)


def f32(*shape) -> np.ndarray:
    return rng.normal(size=shape).astype(np.float32)


def no_kernel_declined_for_its_sizes(compiled) -> None:
    report = compiled.state.specializations[-1].report
    assert not any("symbolic dimension after its first" in why or "several symbolic" in why
                   for _, why in report.declined), report.declined  # fmt: skip


def row_kernels(compiled) -> list:
    """The dynamic program's kernels that read a row count and a row length (both symbolic)."""
    spec = compiled.state.specializations[-1]
    assert spec.dynamic is not None and isinstance(spec.program, SymbolicProgram), compiled.state.events
    return [info for info in spec.program._code.kernels.values() if len(info.symbols) == 2]


def masked_scores(x, mask, bias):
    """Causal softmax of scaled scores, then a row value and a column value broadcast in."""
    att = (x * 0.5).masked_fill(mask, float("-inf"))
    return F.softmax(att, dim=-1) * 3.0 + x.amax(-1, keepdim=True) + bias


def test_masked_softmax_over_a_varying_length_runs_row_kernels_and_equals_eager():
    compiled = kiln.compile(masked_scores)
    for t in [6, 9, 4, 17, 9, 2, 33]:
        x, mask, bias = f32(2, 3, t, t), np.triu(np.ones((t, t), bool), 1), f32(t)
        args = [kiln.tensor(a) for a in (x, mask, bias)]
        assert_close(compiled(*args).numpy(), masked_scores(*args).numpy(), rtol=1e-5, atol=1e-6)
    assert specs(compiled) == 2
    no_kernel_declined_for_its_sizes(compiled)
    # one kernel over the rows: the scaling, the mask, the softmax's max, sum and division, the row values added
    assert len(row_kernels(compiled)) == 1
    assert compiled.state.specializations[-1].report.declined == []  # no reduction left to an eager kernel


def attention(q, k, v):
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / q.shape[-1] ** 0.5)
    att = att.masked_fill(kiln.tril(kiln.ones(t, t)) == 0, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def test_attention_gradients_over_varying_lengths_equal_eager():
    weights = [kiln.tensor(f32(4, 4), requires_grad=True) for _ in range(3)]

    def step(x):
        q, k, v = ((x @ w).view(2, x.shape[1], 2, 2).transpose(1, 2) for w in weights)
        out = attention(q, k, v)
        (out * out).sum().backward()
        return out

    compiled = kiln.compile(step)
    for t in [5, 8, 3, 12, 8]:
        x = kiln.tensor(f32(2, t, 4))
        for w in weights:
            w.grad = None
        expected = step(x)
        grads = [w.grad.numpy().copy() for w in weights]
        for w in weights:
            w.grad = None
        assert_close(compiled(x).detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-5)
        for w, grad in zip(weights, grads, strict=True):
            assert_close(w.grad.numpy(), grad, rtol=1e-4, atol=1e-5)
    assert specs(compiled) == 2, compiled.state.events
    no_kernel_declined_for_its_sizes(compiled)
    assert len(row_kernels(compiled)) >= 2  # the softmax and its backward


def test_a_transposed_view_of_the_scores_stays_correct():
    """A kernel reading the (T, T) scores transposed is not one of rows (its index crosses rows): it
    must run otherwise, never read the view as if it were C order."""

    def f(y):
        return kiln.exp(y.transpose(-2, -1) - y.amax(-1, keepdim=True)) * y

    compiled = kiln.compile(f)
    for t in [4, 7, 11, 7, 2]:
        y = kiln.tensor(f32(3, t, t))
        assert_close(compiled(y).numpy(), f(y).numpy(), rtol=1e-5, atol=1e-6)
    assert specs(compiled) == 2


def test_a_buffer_sliced_to_the_length_is_not_read_as_rows_of_that_length():
    """``buf[:t, :t]`` of a (16, 16) buffer has the row stride 16 at every length: a kernel over rows
    of length ``t`` must not take it for C order (it did: wrong values from the third size on)."""
    buf = kiln.tensor(f32(16, 16))

    def f(x):
        t = x.shape[0]
        return (x - x.amax(-1, keepdim=True)) * buf[:t, :t]

    compiled = kiln.compile(f)
    for t in [4, 7, 11, 7, 5]:
        x = kiln.tensor(f32(t, t))
        assert_close(compiled(x).numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)
    assert specs(compiled) == 2
    declined = compiled.state.specializations[-1].report.declined
    assert any("not in C order" in why for _, why in declined), declined


def test_attention_compiled_alone_with_its_backward_outside_is_one_program_for_every_length():
    """``kiln.compile`` of the forward alone, ``backward()`` outside it: the compiled backward over the
    symbolic length too (symbolic_backward.py), so one specialization serves every length."""
    compiled = kiln.compile(attention)
    for t in [5, 8, 3, 12, 8]:
        arrays = [f32(2, 2, t, 4) for _ in range(3)]
        grads = []
        for fn in (attention, compiled):
            inputs = [kiln.tensor(a, requires_grad=True) for a in arrays]
            out = fn(*inputs)
            (out * out).sum().backward()
            grads.append([out.detach().numpy(), *(x.grad.numpy() for x in inputs)])
        for actual, expected in zip(grads[1], grads[0], strict=True):
            assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    assert specs(compiled) == 2, compiled.state.events
    assert isinstance(compiled.state.specializations[1].backward.program, SymbolicProgram)


def test_a_length_that_comes_while_the_first_compiles_in_the_background_makes_the_dynamic_program(monkeypatch):
    """The first call's program compiles in the background; its backward graph, which a trace at
    another length is compared with, exists once the partition ran (``PendingEntry.sizes_source``)."""
    from kiln.frontend.jit.build import PendingSpecialization  # noqa: PLC0415

    partitioned, release = threading.Event(), threading.Event()
    compile_pending = PendingSpecialization.compile

    def held(self):
        if not partitioned.is_set():  # the first compile: partitioned, then held until released
            self.partition()
            partitioned.set()
            assert release.wait(60)
        return compile_pending(self)

    monkeypatch.setattr(PendingSpecialization, "compile", held)
    compiled = kiln.compile(attention, wait=False)
    try:
        for t in (5, 8):
            inputs = [kiln.tensor(f32(2, 2, t, 4), requires_grad=True) for _ in range(3)]
            compiled(*inputs).sum().backward()
            assert partitioned.wait(60)
            jobs = [entry.job for entry in compiled.state.pending]
    finally:
        release.set()
    assert all(job.wait(60) for job in jobs)  # the first program too, before the test ends
    # both compile in the background, so either may be ready first
    dynamic = sorted(str(s.dynamic) for s in compiled.state.specializations)
    assert dynamic == ["None", "[(0, 2), (1, 2), (2, 2)]"]
