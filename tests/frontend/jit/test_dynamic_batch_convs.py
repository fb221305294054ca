"""CNN training steps over a dynamic batch compiled once (issue 33, item 2): direct convolutions and
their filter gradients over a symbolic batch are generated once (kiln/codegen/llvm/conv.py), the
sums across the batch are split into two compiled sums (frontend/jit/symbolic_reductions.py), and a
BatchNorm's running variance reads the count from the graph, so the step becomes one dynamic program.

Compiled calls are compared with eager ones over several batch sizes: values and gradients (of the
input and of the parameters), the running statistics, the parameters after optimizer steps.
"""

from __future__ import annotations

import numpy as np

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.codegen.llvm import engine, kernel_cache
from kiln.compiler import program_cache
from kiln.frontend.jit.dynamic_binding import bind_graph
from kiln.frontend.jit.symbolic_program import SymbolicProgram
from kiln.frontend.jit.symbolic_reductions import split_batch_sums
from kiln.ir.dtypes import float32
from kiln.ir.graph import GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.types import Sym, TensorType
from kiln.runtime.cache import DiskCache
from tests.conftest import assert_close
from tests.frontend.jit.test_dynamic_sizes import specs

rng = np.random.default_rng(3)
BATCHES = [4, 3, 7, 2, 4, 5]


def _program(compiled) -> SymbolicProgram:
    spec = compiled.state.specializations[-1]
    assert spec.dynamic is not None and isinstance(spec.program, SymbolicProgram), compiled.state.events
    return spec.program


def _compiled_ops(program: SymbolicProgram) -> list[str]:
    """The ops of the nodes the program of the last call ran as compiled kernels."""
    return [call.node.op for call in program.kernel_calls]


def _equals_eager_over_batches(step, params: list, image: tuple, atol: float = 1e-4):
    """``kiln.compile(step)`` against ``step`` at every batch of ``BATCHES`` (``image``: the input's
    other dims): its result, the input's and ``params``' gradients. Two programs made: the first
    batch's, then one dynamic program for every other batch. Returns the compiled function."""
    compiled = kiln.compile(step)
    for n in BATCHES:
        a = rng.standard_normal((n, *image)).astype(np.float32)
        found = []
        for fn in (step, compiled):
            x = kiln.tensor(a, requires_grad=True)
            for p in params:
                p.grad = None
            found.append((fn(x).detach().numpy(), x.grad.numpy(), *(p.grad.numpy() for p in params)))
        for actual, expected in zip(found[1], found[0], strict=True):
            assert_close(actual, expected, rtol=1e-4, atol=atol)
    assert specs(compiled) == 2
    return compiled


def test_convolutions_and_their_gradients_over_a_dynamic_batch_equal_eager_with_compiled_kernels():
    kiln.manual_seed(0)
    w = kiln.randn(5, 3, 3, 3, requires_grad=True)

    def step(x):
        y = F.conv2d(x, w, padding=1)
        (y * y).sum().backward()
        return y

    compiled = _equals_eager_over_batches(step, [w], (3, 9, 11))
    program = _program(compiled)
    ops = _compiled_ops(program)
    assert "conv" in ops and "conv_weight" in ops, (ops, program.report.declined)
    assert not any(name in ("(conv)", "(conv_weight)") for name, _ in program.report.declined)


def test_an_input_gradient_by_fold_over_a_dynamic_batch_equals_eager_with_a_compiled_fold(monkeypatch):
    # 32 output channels: the transposed filter is too long for a direct convolution (32 * 9 >
    # DIRECT_MAX_INNER), so the input gradient is its product with the output gradient folded back
    # into the image (windows laid out batch inner, whose strides follow the batch); Winograd, which
    # such a conv would take, is off
    monkeypatch.setattr(kiln.backends.cpu, "winograd", False)
    kiln.manual_seed(4)
    w = kiln.randn(32, 4, 3, 3, requires_grad=True)

    def step(x):
        y = F.conv2d(x, w, padding=1)
        (y * y).sum().backward()
        return y

    compiled = _equals_eager_over_batches(step, [w], (4, 6, 7), atol=1e-3)
    program = _program(compiled)
    assert "fold" in _compiled_ops(program), (_compiled_ops(program), program.report.declined)


def test_strided_convs_and_pools_over_a_dynamic_batch_equal_eager_with_compiled_window_kernels():
    # a stride-2 convolution goes through windows (unfold, batch inner; its input gradient a fold),
    # a 3x3/2 max pool through windows led by the batch, a 2x2 average pool's gradient is a fold of
    # windows broadcast over the kernel offsets (stride 0)
    kiln.manual_seed(6)
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1)
    net = nn.Sequential(conv, nn.ReLU(), nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(2))

    def step(x):
        y = net(x)
        (y * y).sum().backward()
        return y

    compiled = _equals_eager_over_batches(step, [conv.weight, conv.bias], (3, 17, 18))
    program = _program(compiled)
    ops = _compiled_ops(program)
    assert ops.count("unfold") >= 2 and ops.count("fold") >= 2, (ops, program.report.declined)
    assert not any(name in ("(unfold)", "(fold)") for name, _ in program.report.declined), program.report.declined


def test_a_dynamic_programs_kernels_are_taken_from_the_kernel_cache_the_second_time(tmp_path, monkeypatch):
    programs, kernels = DiskCache(tmp_path / "programs"), DiskCache(tmp_path / "kernels")
    programs.enabled = False  # each compile reaches the backend
    monkeypatch.setattr(program_cache, "disk_cache", lambda: programs)
    monkeypatch.setattr(kernel_cache, "kernel_cache", lambda: kernels)
    compile_many, modules = engine.compile_many, []

    def counted(texts, timeout=None):
        modules.append(len(texts))
        return compile_many(texts, timeout)

    monkeypatch.setattr(engine, "compile_many", counted)
    kiln.manual_seed(5)
    w = kiln.randn(4, 3, 3, 3, requires_grad=True)

    def step(x):
        (F.conv2d(x, w, padding=1).relu() ** 2).sum().backward()
        return w.grad.clone()

    compiled_modules = []
    for _ in range(2):
        compiled = kiln.compile(step)
        for n in (3, 5, 4):
            x = kiln.tensor(rng.standard_normal((n, 3, 6, 6)).astype(np.float32))
            w.grad = None
            expected = step(x).numpy()
            w.grad = None
            assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)
        assert specs(compiled) == 2
        compiled_modules.append(sum(modules))
        modules.clear()
    assert compiled_modules[0] > 0 and compiled_modules[1] == 0, compiled_modules


def test_a_call_that_sets_its_arguments_grad_is_served_by_its_dynamic_program_at_later_sizes():
    # The dynamic program's key was taken from the arguments after its traced call, whose ``.grad``
    # the backward inside had set: calls (which come without one) missed it, and each new batch
    # size made another dynamic program.
    kiln.manual_seed(2)
    w = kiln.randn(4, 3, requires_grad=True)

    def step(x):
        (x @ w).tanh().sum().backward()

    compiled = kiln.compile(step)
    for n in BATCHES:
        a = rng.standard_normal((n, 4)).astype(np.float32)
        grads = []
        for fn in (step, compiled):
            x = kiln.tensor(a, requires_grad=True)
            fn(x)
            grads.append(x.grad.numpy())
        assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)
    assert specs(compiled) == 2, compiled.state.events


def test_a_static_program_runs_the_sizes_it_was_made_for_after_a_dynamic_one_exists():
    # A dynamic program may run slower than the static one at its sizes (Winograd's tile transforms
    # over a symbolic batch run on numpy): a DataLoader's last, smaller batch made the dynamic
    # program, which then ran every full batch too.
    kiln.manual_seed(3)
    w = kiln.randn(4, 3)

    def f(x):
        return (x @ w).relu()

    compiled = kiln.compile(f)
    full, last = kiln.randn(8, 4), kiln.randn(5, 4)
    compiled(full)
    compiled(last)
    static, dynamic = compiled.state.specializations
    assert static.dynamic is None and dynamic.dynamic is not None, compiled.state.events
    ran = []
    for spec in (static, dynamic):
        spec.run = lambda leaves, run=spec.run, spec=spec: (ran.append(spec), run(leaves))[1]
    for x in (full, last, full, kiln.randn(6, 4)):
        assert_close(compiled(x), f(x), rtol=1e-6, atol=1e-6)
    assert ran == [static, dynamic, static, dynamic]


def test_a_trace_that_reads_a_grad_the_other_did_not_stays_static_and_says_so():
    # The first call finds no .grad, the second one (w.grad accumulates) reads it: the traces read
    # other tensors, which the reason said as "18 nodes at one size and 18 at the other".
    kiln.manual_seed(7)
    w = kiln.randn(4, 3, requires_grad=True)

    def step(x):
        (x @ w).tanh().sum().backward()

    compiled = kiln.compile(step)
    compiled(kiln.randn(5, 4))
    compiled(kiln.randn(7, 4))
    assert compiled.state.specializations[-1].dynamic is None
    assert "the program reads 3 tensors at one size and 2 at the other" in compiled.state.events[-1].detail


def _cnn():
    # (no conv bias before a BatchNorm: its gradient is zero up to rounding, which Adam would scale
    # up to steps of the learning rate in directions rounding picks)
    kiln.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
    )  # fmt: skip


def test_a_cnn_step_with_batch_norm_over_varying_batches_is_one_dynamic_program_equal_to_eager():
    models = [_cnn(), _cnn()]
    heads = [nn.Linear(6, 10), nn.Linear(6, 10)]
    heads[1].load_state_dict(heads[0].state_dict())
    steps = []
    for model, head in zip(models, heads, strict=True):
        opt = kiln.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-2)

        def step(x, y, model=model, head=head, opt=opt):
            loss = F.cross_entropy(head(model(x).mean(dim=(2, 3))), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        steps.append(step)
    eager, compiled = steps[0], kiln.compile(steps[1])
    for n in BATCHES:
        x = kiln.tensor(rng.standard_normal((n, 3, 8, 8)).astype(np.float32))
        y = kiln.tensor(rng.integers(0, 10, n))
        assert_close(compiled(x, y), eager(x, y), rtol=1e-4, atol=1e-5)
    for a, b in zip(models[1].state_dict().values(), models[0].state_dict().values(), strict=True):
        assert_close(a, b, rtol=1e-3, atol=1e-4)  # parameters after 6 Adam steps, running statistics
    assert specs(compiled) == 2  # the first batch, then one program for every batch
    ops = _compiled_ops(_program(compiled))
    # the two convolutions and the second one's input gradient; the filter gradients
    assert ops.count("conv") == 3 and ops.count("conv_weight") == 2, ops
    assert "reduce_sum" in ops, ops  # the batch norms' sums across the batch, compiled


def test_sums_across_a_symbolic_batch_are_split_into_a_sum_per_sample_and_a_sum_of_rows():
    n = Sym("s0")
    b = GraphBuilder()
    x = b.input(TensorType((n, 3, 4, 5), float32))
    v = b.input(TensorType((n,), float32))
    channels = b.node("reduce_sum", [x], {"axes": (0, 2, 3), "keepdim": True})
    total = b.node("reduce_sum", [v], {"axes": (0,), "keepdim": False})
    per_sample = b.node("reduce_sum", [x], {"axes": (1, 2, 3), "keepdim": False})  # not across the batch
    graph = b.build([channels, total, per_sample])
    split = split_batch_sums(graph)
    sums = [node.attrs["axes"] for node in split.nodes if node.op == "reduce_sum"]
    assert sums == [(2, 3), (0,), (0,), (1, 2, 3)], sums
    for size in (2, 5):
        arrays = [rng.standard_normal((size, 3, 4, 5)).astype(np.float32), rng.standard_normal(size).astype(np.float32)]
        sizes = {n: size}
        expected = interpret(bind_graph(graph, sizes), arrays)
        actual = interpret(bind_graph(split, sizes), arrays)
        assert_close(expected[0], arrays[0].sum(axis=(0, 2, 3), keepdims=True), rtol=1e-5, atol=1e-5)
        for a, e in zip(actual, expected, strict=True):
            assert a.shape == e.shape
            assert_close(a, e, rtol=1e-5, atol=1e-5)
