"""Dynamic sizes after the first dimension (issue 33, items 2 and 5): a sequence length in ``(B, T)``
or ``(B, T, C)``, two dynamic sizes at once, ``mark_dynamic(t, 1)``.

Every test compares compiled calls with the same function run eagerly over several sizes and counts
the specializations the calls made (``kiln.explain`` says why each was made).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.frontend.jit.dynamic import NotDynamic, symbolize
from kiln.frontend.jit.symbolic_program import SymbolicProgram
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.types import Sym, TensorType, sym_product
from tests.conftest import assert_close
from tests.frontend.jit.test_dynamic_sizes import check_sizes, specs

rng = np.random.default_rng(1)


def f32(*shape) -> np.ndarray:
    return rng.normal(size=shape).astype(np.float32)


def dynamic_program(compiled) -> SymbolicProgram:
    spec = compiled.state.specializations[-1]
    assert spec.dynamic is not None and isinstance(spec.program, SymbolicProgram)
    return spec.program


def test_an_mlp_over_a_varying_length_compiles_once_more_with_every_kernel_generated():
    kiln.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 6), nn.LayerNorm(6))

    def f(x):
        with kiln.no_grad():
            return mlp(x)

    compiled = check_sizes(f, lambda t: [f32(3, t, 6)], [5, 7, 9, 12, 5, 30])
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 1)]
    assert "dynamic: argument 0 dim 1" in kiln.explain(compiled).reasons[1]
    program = dynamic_program(compiled)
    # (3, T, 16) kernels run over the flattened 3*T rows: generated once, none left to eager kernels
    assert program.report.kernels >= 2 and program.report.declined == []
    # 7 (the trace), 9, 12, 30: code generated once, loaded per size (5 runs the static program made for it)
    assert program.lowerings == 4


def test_two_dynamic_sizes_at_once_become_two_symbols_and_their_product():
    kiln.manual_seed(0)
    proj = nn.Linear(4, 5)

    def f(x):  # time-major (T, B, C): the rows are T*B
        with kiln.no_grad():
            return F.log_softmax(proj(x).view(-1, 5), dim=-1)

    compiled = check_sizes(f, lambda t: [f32(t, t // 2 + 2, 4)], [4, 7, 10, 6, 13])
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 0), (0, 1)]
    assert "s0*s1" in str(compiled.state.specializations[1].traced_graph)
    assert dynamic_program(compiled).report.declined == []


def test_mark_dynamic_on_an_inner_dimension_compiles_once_when_the_second_size_comes():
    compiled = kiln.compile(lambda x: (x * 2.0).sum(1) + x.mean(1))
    for k, t in enumerate([6, 9, 4, 17]):
        x = kiln.tensor(f32(2, t, 3))
        kiln.mark_dynamic(x, 1)
        assert_close(compiled(x).numpy(), ((x * 2.0).sum(1) + x.mean(1)).numpy(), rtol=1e-5, atol=1e-6)
        assert specs(compiled) == (0 if k == 0 else 1)  # the first call's trace waits for a second size
    assert compiled.state.specializations[0].dynamic == [(0, 1)]


def test_a_branch_on_an_inner_size_becomes_a_guard_and_the_other_side_traces_again():
    def f(x):
        return x * 2.0 if x.shape[1] > 8 else x * 3.0  # 12 and 16 take one branch, 4 and 5 the other

    compiled = check_sizes(f, lambda t: [f32(2, t)], [12, 16, 4, 5, 30, 5, 3])
    dynamic = [s for s in compiled.state.specializations if s.dynamic]
    assert len(dynamic) == 1 and [str(g) for g in dynamic[0].size_guards] == ["size > 8"]
    assert "guards: argument 0 dim 1 size > 8" in kiln.explain(compiled).reasons[1]
    # 4 traced again (the guard is False there) and 5, 3 got the other branch's program
    assert len(compiled.state.specializations) <= 5


def test_a_branch_on_a_size_computed_from_an_inner_one_keeps_the_call_static_and_says_why():
    def f(x):
        return x * 2.0 if x.shape[1] - 1 > 8 else x * 3.0  # a computed size: no guard

    compiled = check_sizes(f, lambda t: [f32(2, t)], [12, 16, 4, 5])
    assert all(s.dynamic is None for s in compiled.state.specializations)
    assert "Python branches on a size that would be dynamic" in kiln.explain(compiled).reasons[1]


def test_an_assert_on_the_length_guards_the_dynamic_program_and_raises_past_it():
    def f(x):
        B, T, C = x.shape
        assert T <= 16, "Cannot forward, sequence too long"  # nanoGPT's check
        return x.softmax(-1) * 2.0

    compiled = check_sizes(f, lambda t: [f32(2, t, 3)], [5, 8, 3, 16, 11])
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 1)]
    with pytest.raises(AssertionError, match="sequence too long"):
        compiled(kiln.tensor(f32(2, 17, 3)))
    check_sizes(f, lambda t: [f32(2, t, 3)], [9], compiled)
    assert specs(compiled) == 2


def test_a_dynamic_program_missed_on_state_traces_under_the_calls_own_sizes():
    kiln.manual_seed(0)
    layer = nn.Linear(3, 3)

    def f(x):
        with kiln.no_grad():
            return layer(x) * (2.0 if layer.training else 3.0)

    compiled = kiln.compile(f)
    layer.eval()
    check_sizes(f, lambda t: [f32(2, t, 3)], [4, 6], compiled)
    layer.train()  # the dynamic program misses on the training flag: 8 traces again
    # a static program traced then must not serve 10 or 12 (it was cached under the dynamic key)
    check_sizes(f, lambda t: [f32(2, t, 3)], [8, 10, 12, 8], compiled)
    layer.eval()
    check_sizes(f, lambda t: [f32(2, t, 3)], [5], compiled)


def test_an_input_not_in_c_order_with_a_varying_inner_size_stays_correct():
    def f(x):
        return (x * 2.0).sum(0)

    # x is a transposed view: its strides follow its inner size, so it cannot share a C-order program
    compiled = check_sizes(f, lambda t: [np.ascontiguousarray(f32(4, t)).T.copy().T], [5, 8, 6])
    check_sizes(f, lambda t: [f32(t, 4).T], [5, 8, 6], compiled)


# ---------------------------------------------------------------------- a GPT-like language model
class Block(nn.Module):
    """Pre-norm attention with a causal mask built from T, and an MLP (nanoGPT's block)."""

    def __init__(self, c: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.heads) ** 0.5)
        att = att.masked_fill(kiln.tril(kiln.ones(T, T)) == 0, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 13, c: int = 16, heads: int = 2, block: int = 32) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, c), nn.Embedding(block, c)
        self.block, self.ln, self.head = Block(c, heads), nn.LayerNorm(c), nn.Linear(c, vocab)

    def forward(self, idx):
        B, T = idx.shape
        x = self.tok(idx) + self.pos(kiln.arange(T))  # positions built from T: a range in the graph
        return self.head(self.ln(self.block(x)))


def _lm_step(model_type, optimizer):
    kiln.manual_seed(0)
    model = model_type()
    opt = optimizer(model.parameters())

    def step(idx, targets):
        opt.zero_grad()
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        loss.backward()
        opt.step()
        return loss

    return model, step


def _ragged_epoch(model_type, optimizer, lengths, batch=3, vocab=13):
    eager_model, eager_step = _lm_step(model_type, optimizer)
    model, step = _lm_step(model_type, optimizer)
    compiled = kiln.compile(step)
    made = None
    for t in lengths:
        idx, targets = rng.integers(0, vocab, (batch, t)), rng.integers(0, vocab, (batch, t))
        expected = eager_step(kiln.tensor(idx), kiln.tensor(targets))
        actual = compiled(kiln.tensor(idx), kiln.tensor(targets))
        assert_close(actual.detach().numpy(), expected.detach().numpy(), rtol=2e-5, atol=2e-6)
        if made is None and compiled.state.specializations and compiled.state.specializations[-1].dynamic:
            made = specs(compiled)
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        assert_close(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-5)
        assert_close(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-5)
    return compiled, made


def test_a_gpt_training_step_over_varying_lengths_compiles_once_more_and_equals_eager():
    lengths = [8, 8, 5, 11, 3, 16, 8, 9]
    # SGD: the key bias's gradient is zero but for rounding (softmax ignores a shift shared by the keys),
    # which Adam would scale up to whole steps that differ between any two orders of summation
    compiled, made = _ragged_epoch(TinyGPT, lambda p: kiln.optim.SGD(p, lr=0.1, momentum=0.9), lengths)
    assert made == specs(compiled) == 2, compiled.state.events  # the static program, then the dynamic one
    assert compiled.state.specializations[1].dynamic == [(0, 1), (1, 1)]
    report = dynamic_program(compiled).report
    # the kernels over (B, T, C) are generated (flattened to 3*T rows), the elementwise ones over the
    # (B, H, T, T) scores too (rows of T: test_dynamic_row_kernels.py); what is left runs on eager
    # kernels and says why
    assert not any("horizontal" in why or "several symbolic" in why for _, why in report.declined), report.declined
    assert report.kernels >= 20, (report.kernels, report.declined)


class EmbeddingLM(nn.Module):
    def __init__(self, vocab: int = 13, c: int = 8) -> None:
        super().__init__()
        self.emb, self.mix, self.head = nn.Embedding(vocab, c), nn.Linear(c, c), nn.Linear(c, vocab)

    def forward(self, idx):
        return self.head(kiln.tanh(self.mix(self.emb(idx))))


def test_a_language_model_over_25_lengths_in_40_batches_compiles_twice():
    lengths = [int(n) for n in np.random.default_rng(5).choice(np.arange(4, 40), 25, replace=False)]
    lengths = lengths + lengths[:15]
    assert len(set(lengths)) == 25 and len(lengths) == 40
    compiled, made = _ragged_epoch(EmbeddingLM, lambda p: kiln.optim.Adam(p, lr=1e-2), lengths, batch=4)
    assert made == specs(compiled) == 2, compiled.state.events  # static, then dynamic, none after
    assert [e.kind for e in compiled.state.events].count("compiled") == 2
    assert not any(e.kind in ("recompile limit", "break") for e in compiled.state.events)
    assert dynamic_program(compiled).lowerings <= 25


@pytest.mark.parametrize("mask", ["tril", "triu"])
def test_a_mask_and_positions_built_from_the_size_follow_it(mask):
    def f(x):
        T = x.shape[1]
        keep = kiln.tril(kiln.ones(T, T)) if mask == "tril" else kiln.triu(kiln.ones(T, T), 1)
        return (x @ x.transpose(1, 2)).masked_fill(keep == 0, -1e4) + kiln.arange(T) * 0.5

    compiled = check_sizes(f, lambda t: [f32(2, t, 3)], [4, 6, 9, 5])
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 1)]


# ---------------------------------------------------------------------- the graph comparison itself
def _rows_graph(b: int, t: int):
    """(b, t, 4) flattened to b*t rows, a mean over every element, a range and a causal mask of t."""
    g = GraphBuilder()
    x = g.input(TensorType((b, t, 4), dt.float32))
    rows = g.node("reshape", [x], {"shape": (b * t, 4)})
    count = g.constant(np.array(b * t * 4, np.float32), TensorType((), dt.float32))
    mean = g.node("div", [g.node("reduce_sum", [rows], {"axes": (0, 1), "keepdim": False}), count])
    positions = g.constant(np.arange(t, dtype=np.int64) * 2 + 1, TensorType((t,), dt.int64))
    keep = g.constant(np.tril(np.ones((t, t), bool)), TensorType((t, t), dt.bool_))
    return g.build([rows, mean, positions, keep])


def test_symbolize_writes_products_ranges_and_masks_with_the_symbols():
    b, t = Sym("s0"), Sym("s1")
    graph = symbolize(_rows_graph(3, 5), _rows_graph(4, 7), {b: (3, 4), t: (5, 7)})
    assert graph.outputs[0].type.shape == (sym_product(1, [b, t]), 4)
    x = f32(2, 6, 4)
    rows, mean, positions, keep = interpret(graph, [x])
    assert_close(rows, x.reshape(12, 4), rtol=0, atol=0)
    assert_close(mean, x.mean(), rtol=1e-6, atol=1e-7)
    assert_close(positions, np.arange(6) * 2 + 1, rtol=0, atol=0)
    assert_close(keep, np.tril(np.ones((6, 6), bool)), rtol=0, atol=0)
    # a size the symbols make no product of: 3 * 5 + 1 rows at one size, 4 * 7 + 1 at the other
    with pytest.raises(NotDynamic, match="not a product of them"):
        symbolize(_rows_graph(3, 5), _rows_graph(4, 7), {b: (3, 4)})


@pytest.mark.parametrize("dim", [0, 1])
def test_a_tensor_made_from_numpy_at_the_size_keeps_the_call_static(dim):
    # kiln.tensor(array) of an array the caller keeps is read at every call (a numpy shadow): had its
    # size become the symbol, a later size would read the traced array (once a broadcasting error).
    # (An array the call computes itself with numpy runs eagerly: test_numpy_state.py.)
    # (a list indexed by the size: int(n) or a dict's hash of it would keep the call static themselves)
    tables = [np.arange(n) ** 2 for n in range(10)]

    def f(x):
        n = x.shape[dim]
        return x + kiln.tensor(tables[n]).view(*((n, 1) if dim == 0 else (1, n)))

    compiled = check_sizes(f, lambda t: [f32(t, 2) if dim == 0 else f32(2, t)], [4, 6, 9])
    assert specs(compiled) == 3 and all(s.dynamic is None for s in compiled.state.specializations)
    assert "a tensor the call reads besides its arguments" in kiln.explain(compiled).reasons[1]


class BufferMaskAttention(nn.Module):
    """nanoGPT's way: a causal mask buffer and a position table of ``block`` rows, sliced to T."""

    def __init__(self, c: int = 8, block: int = 16) -> None:
        super().__init__()
        self.qkv, self.pos = nn.Linear(c, 3 * c), nn.Parameter(kiln.randn(block, c) * 0.1)
        self.register_buffer("bias", kiln.tril(kiln.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x + self.pos[:T]).split(C, dim=2)
        att = q.unsqueeze(1) @ k.unsqueeze(1).transpose(-2, -1)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return (F.softmax(att, dim=-1) @ v.unsqueeze(1)).squeeze(1)


def test_a_buffer_sliced_to_the_length_follows_it_and_a_length_past_its_end_fails_as_eager():
    kiln.manual_seed(0)
    model = BufferMaskAttention()

    def f(x):
        with kiln.no_grad():
            return model(x)

    compiled = check_sizes(f, lambda t: [f32(2, t, 8)], [5, 8, 3, 12, 16])
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 1)]
    x = kiln.tensor(f32(2, 20, 8))
    with pytest.raises(Exception) as eager:  # noqa: PT011 - whichever error eager raises
        f(x)
    # the dynamic program does not take the length (its slices would pass the buffers' end): the call
    # traces again, and fails as eager does
    with pytest.raises(type(eager.value), match=re.escape(str(eager.value))):
        compiled(x)


def test_a_length_past_a_slices_end_where_eager_stops_there_runs_as_eager():
    # eager slicing stops at the table's end (16 rows) and nothing else needs the length: the call
    # must return eager's result, not fail where eager does not
    table = kiln.randn(16, 4)

    def f(x):
        return x.sum(0) + table[: x.shape[0]].sum(0)

    compiled = check_sizes(f, lambda t: [f32(t, 4)], [6, 11, 20, 9, 16, 25])
    assert compiled.state.specializations[1].dynamic == [(0, 0)]
    assert (
        "the dynamic program missed: this call's dynamic size 20 slices past the end of a dimension of size 16"
        in (kiln.explain(compiled).reasons[2])
    )
