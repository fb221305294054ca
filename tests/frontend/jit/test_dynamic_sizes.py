"""Dynamic leading sizes in kiln.compile: one specialization serves every size (``frontend/jit/dynamic.py``).

Every test compares compiled calls with the same function run eagerly, over several sizes, and
counts the specializations that the calls made.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.frontend.jit.dynamic import NotDynamic, size_symbols, symbolize
from kiln.frontend.jit.dynamic_binding import bind_graph
from kiln.frontend.jit.symbolic_program import SymbolicProgram
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder
from kiln.ir.types import Sym, TensorType
from tests.conftest import assert_close

rng = np.random.default_rng(0)


def f32(*shape) -> np.ndarray:
    return rng.normal(size=shape).astype(np.float32)


def specs(compiled) -> int:
    return len(compiled.state.specializations)


def check_sizes(fn, make_args, sizes, compiled=None, rtol=1e-5, atol=1e-6):
    """Call ``fn`` eagerly and compiled at each size; the results must agree."""
    compiled = compiled or kiln.compile(fn)
    for n in sizes:
        args = make_args(n)
        expected = fn(*[kiln.tensor(a) for a in args])
        actual = compiled(*[kiln.tensor(a) for a in args])
        assert tuple(actual.shape) == tuple(expected.shape), n
        assert_close(actual.detach().numpy(), expected.detach().numpy(), rtol=rtol, atol=atol)
    return compiled


def softmax_rows(x, w):
    return F.softmax(x @ w, dim=-1) * 2.0 + x.sum(1, keepdim=True)


W = f32(5, 3)


def test_a_second_size_makes_the_leading_size_dynamic_and_later_sizes_reuse_it():
    compiled = check_sizes(softmax_rows, lambda n: [f32(n, 5), W], [8, 8, 13])
    assert specs(compiled) == 2
    assert compiled.state.specializations[1].dynamic == [(0, 0)]
    check_sizes(softmax_rows, lambda n: [f32(n, 5), W], [2, 9, 31, 8, 13, 100], compiled)
    assert specs(compiled) == 2  # no trace after the dynamic one
    assert "dynamic: argument 0 dim 0" in kiln.explain(compiled).reasons[1]
    program = compiled.state.specializations[1].program
    assert isinstance(program, SymbolicProgram)  # its kernels generated once, loaded per size
    # 2, 9, 31, 13, 100 (the 13 that traced ran eagerly; 8 runs the static program made for it)
    assert program.report.kernels >= 1 and program.lowerings == 5


def test_sizes_zero_and_one_specialize():
    compiled = check_sizes(softmax_rows, lambda n: [f32(n, 5), W], [8, 13])
    check_sizes(softmax_rows, lambda n: [f32(n, 5), W], [1, 1, 5], compiled)
    assert specs(compiled) == 3  # size 1 is a static specialization of its own, 5 reuses the dynamic one
    assert compiled.state.specializations[2].dynamic is None


def test_arguments_of_equal_sizes_share_a_symbol_and_a_call_that_breaks_it_traces_again():
    def f(x, y):
        return x * 2.0 + y

    compiled = check_sizes(f, lambda n: [f32(n, 3), f32(n, 3)], [4, 6, 9])
    assert specs(compiled) == 2

    # Unequal leading sizes (broadcasting a size-1 y) break the relation x.shape[0] == y.shape[0].
    def broadcast(n):
        return [f32(n, 3), f32(1, 3)]

    check_sizes(f, broadcast, [7], compiled)
    assert specs(compiled) == 3
    check_sizes(f, lambda n: [f32(n, 3), f32(n, 3)], [11], compiled)
    assert specs(compiled) == 3


def test_two_independent_sizes_become_two_symbols():
    def f(x, y):
        return x.sum(0) + y.sum(0)

    compiled = check_sizes(f, lambda n: [f32(n, 3), f32(n + 1, 3)], [4, 6, 9, 20])
    assert specs(compiled) == 2
    check_sizes(f, lambda n: [f32(n, 3), f32(3 * n, 3)], [5], compiled)
    assert specs(compiled) == 2  # two size classes either way: the same key


def test_a_size_read_by_python_in_arithmetic_and_view_follows_the_call():
    def f(x):
        flat = x.view(x.shape[0], -1)  # view(batch, -1): the batch is an attribute that follows the size
        return flat.sum() / x.shape[0] + flat.mean(0)  # a divisor equal to the size: the size, counted

    compiled = check_sizes(f, lambda n: [f32(n, 2, 3)], [4, 6, 9, 17])
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 0)]


def test_a_size_computed_from_the_dynamic_one_keeps_the_call_static_and_says_why():
    def f(x):
        return x[: x.shape[0] // 2] * 2.0  # half the size: no whole symbol, a slice's stop follows it

    compiled = check_sizes(f, lambda n: [f32(n, 3)], [4, 6, 10])
    assert specs(compiled) == 3  # every size is its own static specialization, never a stale one
    assert all(s.dynamic is None for s in compiled.state.specializations)
    assert "its sizes stay static" in kiln.explain(compiled).reasons[1]


def test_a_branch_on_a_size_keeps_the_call_static_where_two_sizes_alone_could_not_tell():
    def f(x):
        n = x.shape[0]
        return x * 2.0 if n - 1 > 8 else x * 3.0  # 16 and 12 take one branch, 4 the other

    compiled = check_sizes(f, lambda n: [f32(n, 3)], [16, 12, 4, 5])
    assert all(s.dynamic is None for s in compiled.state.specializations)
    assert (
        "Python branches on a size that would be dynamic (a comparison of the dynamic size 11"
        in (kiln.explain(compiled).reasons[1])
    )


TEXTS_AND_HASHES = {  # Python reads of a size besides comparisons: 16 and 12 take one branch, 4 the other
    "a set of it": lambda n: {4} - {n},
    "str": lambda n: str(n) != "4",
    "an f-string": lambda n: f"{n}" != "4",
    "repr": lambda n: repr(n) != "4",
}


@pytest.mark.parametrize("read", list(TEXTS_AND_HASHES), ids=list(TEXTS_AND_HASHES))
def test_a_branch_on_the_text_or_hash_of_a_size_keeps_the_call_static(read):
    def f(x):
        return x * 2.0 if TEXTS_AND_HASHES[read](x.shape[0]) else x * 3.0

    compiled = check_sizes(f, lambda n: [f32(n, 3)], [16, 12, 4, 5])
    assert all(s.dynamic is None for s in compiled.state.specializations)


FOLDINGS = {  # a number computed from the size, and two sizes it is the same number at
    "floordiv": (lambda n: n // 4, (5, 7)),
    "mod": (lambda n: n % 2, (5, 7)),
    "shift": (lambda n: n >> 1, (4, 5)),
    "and": (lambda n: n & ~3, (5, 7)),
    "rfloordiv": (lambda n: 40 // n, (7, 8)),
    "abs": (lambda n: abs(n - 6), (5, 7)),
    "int of a float": (lambda n: int(n * 0.15), (20, 21)),  # BERT's share of tokens to mask
    "floor of a quotient": (lambda n: math.floor(n / 4), (5, 7)),
    "ceil of a quotient": (lambda n: math.ceil(n / 8), (5, 7)),
}


# numbers Python computes from a size through int's other methods and conversions, each the same at 5
# and 7 (so one constant in both traces) and another at 9
INT_METHODS = {
    "int()": lambda n: int(n) // 4,
    "float()": lambda n: math.floor(float(n) / 4),
    "float() of a quotient": lambda n: math.floor(float(n / 4)),
    "__index__()": lambda n: n.__index__() // 4,
    "bit_length": lambda n: n.bit_length(),
    "bit_count": lambda n: (n + 1).bit_count(),  # at 3 and 7 (4 and 8): 1; at 9 (10): 2
    "divmod": lambda n: divmod(n, 4)[0],
    "rdivmod": lambda n: divmod(8, n)[0],
    "numerator": lambda n: n.numerator // 4,
    "real": lambda n: n.real // 4,
    "conjugate": lambda n: n.conjugate() // 4,
    "math.floor": lambda n: math.floor(n) // 4,
    "round to tens": lambda n: round(n, -1),
}


@pytest.mark.parametrize("method", list(INT_METHODS), ids=list(INT_METHODS))
def test_a_number_from_a_size_through_ints_other_methods_follows_it_or_keeps_the_call_static(method):
    fn = INT_METHODS[method]

    def f(x):
        return x.sum(0) * fn(x.shape[0])

    sizes = {"bit_count": [3, 7, 9, 13, 6, 2], "round to tens": [12, 14, 16, 9, 5, 2]}.get(method, [5, 7, 9, 13, 6, 2])
    check_sizes(f, lambda n: [f32(n, 3)], sizes)


@pytest.mark.parametrize("fold", list(FOLDINGS), ids=list(FOLDINGS))
def test_a_number_that_folds_two_sizes_together_keeps_the_call_static(fold):
    # the two traces saw one constant where the size differed: a dynamic program would use it at
    # every size (x * (T // 4) gave 1 at T=9)
    scale, first = FOLDINGS[fold]

    def f(x):
        return x * scale(x.shape[1]) + 1.0

    sizes = [*first, 9, 13, 6, 11]
    compiled = check_sizes(f, lambda n: [f32(2, n)], sizes)
    assert all(s.dynamic is None for s in compiled.state.specializations), compiled.state.events
    reason = kiln.explain(compiled).reasons[1]
    assert "a number computed from a dynamic size that is the same at both sizes" in reason, reason


def test_len_of_a_dynamic_size_keeps_the_call_static_and_says_to_read_the_shape():
    # len() hands Python a plain int: len(x) // 4 gave 1 at batches 5 and 7, and 1 at 9 too
    def f(x):
        return x * (len(x) // 4)

    compiled = check_sizes(f, lambda n: [f32(n, 2)], [5, 7, 9, 13])
    assert all(s.dynamic is None for s in compiled.state.specializations)
    reason = kiln.explain(compiled).reasons[1]
    assert "len() of a tensor whose leading size would be dynamic" in reason and "x.shape[0] is followed" in reason


def test_a_number_computed_from_the_size_that_follows_it_keeps_the_program_dynamic():
    def f(x):
        n = x.shape[1]
        return x.reshape(x.shape[0] * n) * 2.0 + (n * 3 - n)  # 2n at both sizes: a multiple of the size

    compiled = check_sizes(f, lambda n: [f32(2, n)], [5, 7, 9, 13])
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 1)]


VIEWS = {
    "slice": lambda x: x[:, 1:],
    "transpose": lambda x: x.t(),
    "flatten": lambda x: x.view(-1),
    "narrow": lambda x: x.narrow(1, 1, x.shape[1] - 2),
    "two results on one buffer": lambda x: (lambda y: (y, y[:, 1:]))(x * 2),
}


@pytest.mark.parametrize("view", list(VIEWS), ids=list(VIEWS))
def test_a_result_viewing_an_argument_or_another_result_follows_each_calls_size(view):
    # such a result was rebuilt with the traced shape: x[:, 1:] of a (3, 9) argument came back (3, 6),
    # and of a (3, 4) one read past its end
    f = VIEWS[view]
    compiled = kiln.compile(f)
    for n in [5, 7, 9, 4, 12]:
        x = kiln.arange(float(3 * n)).reshape(3, n)
        got, expected = compiled(x), f(x)
        got, expected = (got, expected) if isinstance(got, tuple) else ((got,), (expected,))
        for a, b in zip(got, expected, strict=True):
            assert tuple(a.shape) == tuple(b.shape), n
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        if view != "two results on one buffer":  # the result still views the argument, as eager's does
            got[0].mul_(0)
            assert float(x.abs().sum()) < float(kiln.arange(float(3 * n)).sum())
    assert all(s.dynamic is None for s in compiled.state.specializations)
    assert "a result views the memory of an argument" in kiln.explain(compiled).reasons[1]


def test_dynamic_false_never_makes_sizes_dynamic():
    compiled = kiln.compile(softmax_rows, dynamic=False)
    check_sizes(softmax_rows, lambda n: [f32(n, 5), W], [4, 6, 9], compiled)
    assert specs(compiled) == 3


@pytest.mark.parametrize("how", ["dynamic=True", "mark_dynamic"])
def test_dynamic_up_front_compiles_once_when_the_second_size_comes(how):
    compiled = kiln.compile(softmax_rows, dynamic=True) if how == "dynamic=True" else kiln.compile(softmax_rows)

    def make(n):
        x = f32(n, 5)
        return [x, W]

    for k, n in enumerate([8, 13, 4, 21]):
        x, w = make(n)
        tx = kiln.tensor(x)
        if how == "mark_dynamic":
            kiln.mark_dynamic(tx, 0)
        actual = compiled(tx, kiln.tensor(w))
        assert_close(actual.numpy(), softmax_rows(kiln.tensor(x), kiln.tensor(w)).numpy(), rtol=1e-5, atol=1e-6)
        assert specs(compiled) == (0 if k == 0 else 1)
    assert compiled.state.specializations[0].dynamic == [(0, 0)]


def test_mark_dynamic_checks_its_arguments():
    with pytest.raises(IndexError, match="out of range"):
        kiln.mark_dynamic(kiln.ones(2, 3), 2)
    with pytest.raises(IndexError, match="out of range"):
        kiln.mark_dynamic(kiln.ones(2, 3), True)
    with pytest.raises(TypeError, match="expected a tensor"):
        kiln.mark_dynamic([1, 2], 0)


def _mlp_step(optimizer):
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = optimizer(model.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, step


@pytest.mark.parametrize("optimizer", [lambda p: kiln.optim.SGD(p, lr=0.1, momentum=0.9),
                                       lambda p: kiln.optim.Adam(p, lr=0.01)], ids=["sgd", "adam"])  # fmt: skip
def test_a_ragged_epoch_of_training_steps_compiles_once_more_and_equals_eager(optimizer):
    sizes = [64, 64, 64, 37, 64, 50, 64, 23, 64, 41]
    batches = [(f32(n, 20), rng.integers(0, 10, n)) for n in sizes]
    eager_model, eager_step = _mlp_step(optimizer)
    model, step = _mlp_step(optimizer)
    compiled = kiln.compile(step)
    for k, (x, y) in enumerate(batches):
        expected = eager_step(kiln.tensor(x), kiln.tensor(y))
        actual = compiled(kiln.tensor(x), kiln.tensor(y))
        assert_close(actual.detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
        for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
            assert_close(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
            assert_close(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6)
        if k == 3:
            made = specs(compiled)
    # the static program, then the dynamic one at the first 37, and none after
    assert specs(compiled) == made <= 2, compiled.state.events
    assert compiled.state.specializations[-1].dynamic == [(0, 0), (1, 0)]


def test_a_sequence_model_over_varying_lengths_compiles_once_more():
    kiln.manual_seed(0)
    vocab, hidden = 11, 8

    def make():
        kiln.manual_seed(0)
        emb, out = nn.Embedding(vocab, hidden), nn.Linear(hidden, vocab)
        opt = kiln.optim.SGD([*emb.parameters(), *out.parameters()], lr=0.5)

        def step(tokens, targets):
            opt.zero_grad()
            logits = out(kiln.tanh(emb(tokens)))
            loss = F.cross_entropy(logits, targets)
            loss.backward()
            opt.step()
            return loss

        return step

    eager, compiled = make(), kiln.compile(make())
    lengths = [12, 12, 12, 7, 30, 12, 5, 19]
    for k, t in enumerate(lengths):
        tokens = rng.integers(0, vocab, t)
        targets = np.roll(tokens, -1)
        expected = eager(kiln.tensor(tokens), kiln.tensor(targets))
        actual = compiled(kiln.tensor(tokens), kiln.tensor(targets))
        assert_close(actual.detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
        if k == 2:  # plain SGD: the first call and the first with .grad set are two static ones (issue 33, item 5)
            static = specs(compiled)
    assert specs(compiled) == static + 1, compiled.state.events  # one dynamic specialization, then none
    assert compiled.state.specializations[-1].dynamic == [(0, 0), (1, 0)]


# ---------------------------------------------------------------------- the graph comparison itself
def _scale_graph(n: int, divisor: float, fill_shape=None):
    b = GraphBuilder()
    x = b.input(TensorType((n, 4), dt.float32))
    c = b.constant(np.array(divisor, np.float32), TensorType((), dt.float32))
    y = b.node("div", [x, c])
    if fill_shape is not None:
        z = b.constant(np.zeros(fill_shape, np.float32), TensorType(fill_shape, dt.float32))
        y = b.node("add", [y, z])
    return b.build([b.node("reshape", [y], {"shape": (n * 4,) if fill_shape == "flat" else (n, 2, 2)})])


def test_symbolize_turns_sizes_constants_and_fills_into_the_symbol():
    s = Sym("s0")
    graph = symbolize(_scale_graph(6, 6.0, (6, 4)), _scale_graph(9, 9.0, (9, 4)), {s: (6, 9)})
    assert graph.inputs[0].type.shape == (s, 4) and graph.outputs[0].type.shape == (s, 2, 2)
    x = f32(5, 4)
    (out,) = kiln.ir.interpreter.interpret(graph, [x])
    assert_close(out, (x / 5.0).reshape(5, 2, 2), rtol=1e-6, atol=0)
    bound = bind_graph(graph, {s: 3})
    assert bound.inputs[0].type.shape == (3, 4) and bound.outputs[0].type.shape == (3, 2, 2)
    # a whole multiple of the size (a mean over every element: batch * 4 of them)
    graph = symbolize(_scale_graph(6, 24.0), _scale_graph(9, 36.0), {s: (6, 9)})
    (out,) = kiln.ir.interpreter.interpret(graph, [x])
    assert_close(out, (x / 20.0).reshape(5, 2, 2), rtol=1e-6, atol=0)


def test_symbolize_refuses_what_a_whole_symbol_cannot_say():
    s = Sym("s0")
    with pytest.raises(NotDynamic, match="holds other values"):
        symbolize(_scale_graph(6, 3.0), _scale_graph(9, 4.5), {s: (6, 9)})  # size / 2: computed from it
    with pytest.raises(NotDynamic, match="nodes at one size"):
        b = GraphBuilder()
        x = b.input(TensorType((9, 4), dt.float32))
        symbolize(_scale_graph(6, 6.0), b.build([b.node("neg", [x])]), {s: (6, 9)})
    assert size_symbols([(6, 9), (6, 10), (6, 9)]) == {Sym("s0"): (6, 9), Sym("s1"): (6, 10)}


# ---------------------------------------------------------------------- export with a dynamic batch
def _classifier():
    kiln.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4), nn.Softmax(-1)).eval()


def test_an_exported_program_with_a_dynamic_batch_runs_compiled_at_any_batch(tmp_path):
    model = _classifier()
    program = kiln.export(model, kiln.randn(8, 16), dynamic_shapes=[{0: "batch"}])
    assert program.graph.inputs[0].type.shape == (Sym("batch"), 16)
    program.save(tmp_path / "m.kiln")
    loaded = kiln.load_exported(tmp_path / "m.kiln")
    for n in (1, 3, 8, 50, 3):
        x = kiln.randn(n, 16)
        assert_close(loaded(x).numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert isinstance(loaded._program, SymbolicProgram) and loaded._program.report.kernels >= 1
    assert loaded._program.lowerings == 4  # 1, 3, 8, 50: code generated once
    with pytest.raises(ValueError, match=r"must be f32\[batch, 16\], got f32\[3, 15\]"):
        loaded(kiln.randn(3, 15))


def test_export_dynamic_shapes_one_size_per_name_and_bad_specs():
    def f(x, y):
        return x * 2.0 + y

    program = kiln.export(f, kiln.ones(4, 3), kiln.ones(4, 3), dynamic_shapes=[{0: "n"}, {0: "n"}])
    assert_close(program(kiln.ones(6, 3), kiln.ones(6, 3)).numpy(), np.full((6, 3), 3.0, np.float32), rtol=0, atol=0)
    with pytest.raises(ValueError, match="dynamic dimension n is 6 in one argument and 5 in argument 1"):
        program(kiln.ones(6, 3), kiln.ones(5, 3))
    with pytest.raises(kiln.jit.ExportError, match="one entry per positional argument"):
        kiln.export(f, kiln.ones(4, 3), kiln.ones(4, 3), dynamic_shapes=[{0: "n"}])
    with pytest.raises(kiln.jit.ExportError, match="must be None or"):
        kiln.export(f, kiln.ones(4, 3), kiln.ones(4, 3), dynamic_shapes=[{}, None])
    with pytest.raises(kiln.jit.ExportError, match="two sizes"):  # half the batch: no whole symbol
        kiln.export(lambda x: x[: x.shape[0] // 2], kiln.ones(4, 3), dynamic_shapes=[{0: "n"}])


def test_a_size_times_another_becomes_their_product():
    # a time-major language model flattens (length, batch) into length * batch rows: the product 3*s0
    vocab, batch = 7, 3
    kiln.manual_seed(0)
    emb, out = nn.Embedding(vocab, 4), nn.Linear(4, vocab)

    def f(tokens):
        with kiln.no_grad():
            return F.log_softmax(out(emb(tokens)).view(-1, vocab), dim=-1)

    compiled = check_sizes(f, lambda t: [rng.integers(0, vocab, (t, batch))], [5, 8, 6, 11])
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 0)]
    assert "3*s0" in str(compiled.state.specializations[1].traced_graph)


def test_a_size_that_is_no_product_of_the_dynamic_ones_stays_static_and_says_why():
    def f(x):
        return x * kiln.zeros(x.shape[0] // 2 + 1).sum()  # a constant of n // 2 + 1 zeros: no product or sum

    compiled = check_sizes(f, lambda n: [f32(n, 3)], [5, 8, 6])
    assert specs(compiled) == 3 and all(s.dynamic is None for s in compiled.state.specializations)
    assert (
        "kiln's symbolic dimensions are whole sizes, their products and the sums" in kiln.explain(compiled).reasons[1]
    )


def test_results_that_need_gradients_outside_the_call_get_one_backward_for_every_size():
    """``compiled(x, w).sum()`` then a backward outside the call: the compiled backward is compared
    with the earlier trace's and lowered once over the symbolic size (symbolic_backward.py)."""
    w = kiln.tensor(W, requires_grad=True)
    compiled = kiln.compile(softmax_rows)
    for n in (4, 6, 9, 4, 17):
        x = f32(n, 5)
        xs = [kiln.tensor(x, requires_grad=True) for _ in range(2)]
        actual, expected = compiled(xs[0], w), softmax_rows(xs[1], w)
        assert_close(actual.detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
        grads = [kiln.autograd.grad((out * out).sum(), [x_, w]) for out, x_ in zip((actual, expected), xs, strict=True)]
        for a, e in zip(*grads, strict=True):
            assert_close(a.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 0)]
    backward = compiled.state.specializations[1].backward
    # loaded at 9 and 17 (the traced call at 6 returned eager results, with eager autograd; 4 runs
    # the static program made for it)
    assert isinstance(backward.program, SymbolicProgram) and backward.program.lowerings == 2
    assert backward.traced.inputs[0].type.symbols  # the backward graph over the symbolic size
