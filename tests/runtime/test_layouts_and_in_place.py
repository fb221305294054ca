"""The executor's two promises to the compiled kernels, against eager over several calls.

- Layouts: a kernel is compiled for the strides ``infer_layouts`` gives each value. numpy keeps
  its input's layout (``order="K"``), so an extern such as ``index_put`` over a transposed view
  hands back a transposed array; the executor copies such results into the C order it promised
  (issue 10, cause 8).
- In place: an output may be written over an input's memory (an argument updated by ``add_``,
  or a dead intermediate in the arena) only when the kernel reads that memory at the element
  it writes and nothing reads it later. A view anywhere downstream of the read (``a.pow_(2);
  a.T``) re-indexes it (issue 10, cause 9). Only view nodes may alias: an extern whose eager
  kernel hands back its input's memory is copied (issue 10, cause 13: DCGAN's unfold).

Every function is compiled, then called on fresh random inputs (the first call traces, the
others run the ``CompiledProgram``); results and the arguments after the call must match eager
on clones of the same inputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.ir.analysis import reads_at_own_index
from kiln.ir.primitives import PRIMITIVES
from kiln.runtime.executor import CompiledProgram

from ..conftest import assert_close

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _agree(fn, *shapes, calls: int = 4, seed: int = 0, ints: dict | None = None) -> CompiledProgram:
    """Compile ``fn``, call it ``calls`` times on fresh inputs of ``shapes``; compare with eager."""
    rng = np.random.default_rng(seed)
    cf = kiln.compile(fn, fullgraph=True)
    for _ in range(calls):
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        got_args = [kiln.tensor(a.copy()) for a in arrays]
        eager_args = [kiln.tensor(a.copy()) for a in arrays]
        got, expected = cf(*got_args), fn(*eager_args)
        got = got if isinstance(got, tuple) else (got,)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for g, e in zip(got + tuple(got_args), expected + tuple(eager_args), strict=True):
            assert_close(g, e, **TOL)
    spec = cf.state.specializations[-1]
    assert isinstance(spec.program, CompiledProgram) and spec.calls == calls - 1
    return spec.program


# ----------------------------------------------------------------------------- extern layouts
IDX = kiln.tensor([0, 2, 0])
COL = kiln.tensor([[0, 2, 1, 1], [3, 0, 0, 2], [1, 1, 3, 0]])


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda a, s: a.index_add(1, IDX, s).softmax(0), id="index_add_last_axis_softmax_0"),
        pytest.param(lambda a, s: a.index_add(1, IDX, s).T.exp() + 1, id="index_add_transposed_read"),
        pytest.param(lambda a, s: a.T.scatter_add(0, COL.T, s[:, :1].expand(3, 4).T) * 2, id="scatter_add_of_a_view"),
        pytest.param(lambda a, s: a.T.gather(0, COL.T).T.sigmoid(), id="gather_of_a_view"),
        pytest.param(lambda a, s: a.T.cumsum(0).T.tanh() - a, id="cumsum_of_a_view"),
        pytest.param(lambda a, s: a.T.flip(0).T * a, id="flip_of_a_view"),
        pytest.param(lambda a, s: kiln.cat([a.T, a.T], 1).T.exp(), id="cat_of_views"),
    ],
)
def test_extern_results_are_read_in_the_layout_the_kernels_were_built_for(fn):
    _agree(fn, (3, 4), (3, 3))


def test_every_non_view_primitive_returns_memory_of_its_own():
    """The in-place analyses (``write_in_place``, the memory plan) only follow view nodes: an extern
    whose eager kernel handed back a view of an input would hide a reader of the overwritten memory."""
    rng = np.random.default_rng(0)
    for name, prim in PRIMITIVES.items():
        if prim.is_view or prim.samples is None:
            continue
        for sample in prim.samples(rng):
            arrays = [a for a in sample.args if isinstance(a, np.ndarray)]
            for transposed in (False, True):  # C order, then column-major copies of the matrices
                args = [a.T.copy().T if transposed and isinstance(a, np.ndarray) else a for a in sample.args]
                result = prim.eager(np, *args, **sample.attrs)
                for out in result if isinstance(result, tuple | list) else (result,):
                    assert not any(
                        np.shares_memory(np.asarray(out), a)
                        for a in arrays + [a for a in args if isinstance(a, np.ndarray)]
                    ), name


def test_an_interpreted_kernel_with_transposed_results_is_read_in_its_layout(monkeypatch):
    """A kernel the code generator declines runs its body on numpy, which may keep a transposed
    input's layout; a compiled kernel after it reads its (unplanned: a graph output) result as the
    C order ``infer_layouts`` promised."""
    from kiln.codegen.llvm import Unsupported
    from kiln.codegen.llvm.kernels import KernelModule

    add = KernelModule.add
    seen = []

    def decline_the_first(self, node, layouts):
        seen.append(node)
        if len(seen) == 1:
            raise Unsupported("declined for this test")
        return add(self, node, layouts)

    monkeypatch.setattr(KernelModule, "add", decline_the_first)
    w = kiln.randn(4, 4)

    def f(a):
        e = a.T.exp()  # the declined kernel; a graph output, so not in the arena
        return e, (e + e @ w).T.tanh()  # a compiled kernel reads e as C order

    _agree(f, (4, 4))


# ----------------------------------------------------------------------------- in place
def _pow_then_transpose(a):
    a.pow_(2)
    t = a.transpose(0, 1)
    return kiln.where(t > 1.3, -3.0, t)


@pytest.mark.parametrize(
    ("fn", "shapes"),
    [
        pytest.param(_pow_then_transpose, [(3, 3)], id="pow_then_transpose"),
        pytest.param(lambda a: (a.mul_(2), a.T + a)[1], [(5, 5)], id="transpose_plus_self"),
        pytest.param(lambda a: (a.mul_(3), a[:, :1] + a)[1], [(4, 3)], id="broadcast_column"),
        pytest.param(lambda a: (a.add_(1), a[0] * a)[1], [(4, 3)], id="broadcast_row"),
        pytest.param(lambda a: (a.add_(1), a.flip(0) * 2)[1], [(4, 3)], id="flip"),
        pytest.param(lambda a: (a.add_(1), a[1:] - a[:-1])[1], [(4, 3)], id="shifted_slices"),
        pytest.param(lambda a, b: (a.add_(b), a.T * b)[1], [(3, 3), (3, 3)], id="transposed_by_a_second_input"),
        pytest.param(lambda a: (a.sub_(1), kiln.stack([a, a.T]).sum(0))[1], [(3, 3)], id="stack_with_transpose"),
        pytest.param(lambda a: (a.mul_(2), a.reshape(-1).flip(0).reshape(3, 3) + 1)[1], [(3, 3)], id="reversed"),
        pytest.param(lambda a: (a.exp_(), a.sum(0) + a[0])[1], [(4, 3)], id="reduction"),
    ],
)
def test_an_argument_written_in_place_is_read_only_at_the_written_element(fn, shapes):
    _agree(fn, *shapes)


def test_same_element_reads_are_still_written_in_place():
    """The analysis is not merely off: an update read only at its own element writes the caller's memory."""
    program = _agree(lambda a, b: (a.mul_(0.5).add_(b), (a * b).exp())[1], (6, 5), (6, 5))
    in_place = program.written_in_place()
    assert in_place, "the elementwise update of a was not written in place"


def test_a_dead_intermediate_is_not_reused_by_a_kernel_that_reads_it_transposed():
    w = kiln.randn(6, 6)
    program = _agree(lambda x: ((x @ w) * 2).T + (x @ w).exp(), (6, 6))
    plan = program.plan
    for out, inp in plan.inplace.items():
        node = next(n for n in program.graph.nodes if out in n.outputs)
        assert reads_at_own_index(node, inp, out)


def test_unfold_whose_windows_tile_the_input_exactly_is_a_copy():
    """The case that made an extern alias the arena: a 2x2 kernel over a 2x2 image, one window."""
    x = np.random.default_rng(0).standard_normal((2, 3, 2, 2)).astype(np.float32)
    windows = PRIMITIVES["unfold"].eager(np, x, kernel_size=(2, 2), stride=(1, 1), dilation=(1, 1))
    assert windows.shape == (2, 3, 2, 2, 1, 1) and not np.shares_memory(windows, x)
    np.testing.assert_array_equal(windows[..., 0, 0], x)


# ----------------------------------------------------------------------------- a real program
def _discriminator():
    kiln.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 4, 2, 1, bias=False), nn.LeakyReLU(0.2),
        nn.Conv2d(4, 8, 4, 2, 1, bias=False), nn.BatchNorm2d(8), nn.LeakyReLU(0.2),
        nn.Conv2d(8, 1, 2, 1, 0, bias=False), nn.Sigmoid(),
    )  # fmt: skip


def _discriminator_step(model):
    criterion = nn.BCELoss()

    def step(real, fake):  # pytorch/examples' dcgan: two backward passes add into .grad
        model.zero_grad()
        out = model(real).view(-1)
        loss_real = criterion(out, kiln.ones(out.shape))
        loss_real.backward()
        out = model(fake).view(-1)
        loss_fake = criterion(out, kiln.zeros(out.shape))
        loss_fake.backward()
        return loss_real + loss_fake

    return step


@pytest.mark.parametrize("aliasing_unfold", [False, True])
def test_dcgan_discriminator_step_matches_eager(aliasing_unfold, monkeypatch):
    """Issue 10, cause 13: the last conv's 2x2 kernel over a 2x2 map unfolds into one window, which
    numpy handed back as a view of the BatchNorm/LeakyReLU output in the arena; the arena then
    reused that memory before the weight gradient read it. With ``aliasing_unfold`` the eager
    kernel does so again: the executor must copy an extern's result that aliases an argument."""
    if aliasing_unfold:
        unfold = PRIMITIVES["unfold"]

        def aliasing(xp, x, **attrs):
            windows = unfold.eager(xp, x, **attrs)
            return x.reshape(windows.shape) if windows.size == x.size else windows

        monkeypatch.setitem(PRIMITIVES, "unfold", dataclasses.replace(unfold, eager=aliasing))
    rng = np.random.default_rng(0)
    model, eager_model = _discriminator(), _discriminator()
    step = kiln.compile(_discriminator_step(model))
    eager_step = _discriminator_step(eager_model)
    for _ in range(5):
        real, fake = (rng.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(2))
        loss = step(kiln.tensor(real), kiln.tensor(fake))
        assert_close(loss, eager_step(kiln.tensor(real), kiln.tensor(fake)), rtol=1e-5, atol=1e-6)
        for p, e in zip(model.parameters(), eager_model.parameters(), strict=True):
            assert_close(p.grad, e.grad, rtol=1e-4, atol=1e-6)
        for b, e in zip(model.buffers(), eager_model.buffers(), strict=True):
            assert_close(b, e, rtol=1e-5, atol=1e-6)
    spec = step.state.specializations[-1]
    assert isinstance(spec.program, CompiledProgram) and spec.calls >= 3


@pytest.mark.parametrize("returns", ["the_input_itself", "a_view_of_it"])
def test_an_extern_whose_eager_kernel_aliases_its_input_gets_memory_of_its_own(returns, monkeypatch):
    """``cat([m])`` handed back as ``m`` (or a view of it): ``m``'s arena buffer dies at the kernel
    making ``k``, which overwrites it in place, while the extern's result is read after it."""
    concatenate = PRIMITIVES["concatenate"]

    def aliasing(xp, *arrays, **attrs):
        if len(arrays) == 1:
            return arrays[0] if returns == "the_input_itself" else arrays[0][...]
        return concatenate.eager(xp, *arrays, **attrs)

    monkeypatch.setitem(PRIMITIVES, "concatenate", dataclasses.replace(concatenate, eager=aliasing))
    w = kiln.randn(5, 5)

    def f(x):
        m = x @ w
        z = kiln.cat([m])
        k = (m * 2 + 1).tanh()  # planned (matmul reads it): takes m's buffer in place
        return z + k @ w

    program = _agree(f, (5, 5))
    assert program.plan.inplace, "the test needs the in-place reuse of m's buffer"


def test_an_input_whose_size_1_dim_has_another_stride_is_read_as_it_is():
    """numpy calls an array contiguous whatever the stride of a size-1 dim is (a permuted row's
    gradient arrives with strides (8, 16) for shape (2, 1)); that stride is never used, so the
    executor takes the array as it is rather than failing to lay it out."""
    from kiln.runtime.executor import same_layout

    assert same_layout((2, 1), (8, 16), (8, 8)) and not same_layout((2, 2), (8, 16), (16, 8))

    def f(x):
        return x.permute(1, 0).abs()

    compiled = kiln.compile(f, fullgraph=True)
    for k in range(3):
        data = np.array([[0.5 + k, -0.9]])
        x, xe = kiln.tensor(data, requires_grad=True), kiln.tensor(data, requires_grad=True)
        y, ye = compiled(x), f(xe)
        (y * kiln.tensor([[2.0], [3.0]])).sum().backward()
        (ye * kiln.tensor([[2.0], [3.0]])).sum().backward()
        assert_close(y, ye, **TOL)
        assert_close(x.grad, xe.grad, **TOL)


def test_a_horizontal_member_never_reads_an_input_another_member_writes_in_place():
    """Two structurally identical updates become one horizontal kernel; the first reads ``g``,
    which the second updates: were the second written into ``g``'s memory, the first member
    could read the new value (the fuzzer's seed 79000742). The update of ``g`` is written back
    after the kernel instead; the one of ``a``, which no other member reads, stays in place."""

    def fn(a, g, b):
        hit = b > 0  # made first: the member that updates g comes first in the horizontal kernel
        a.masked_fill_(g > 0, -0.5)
        g.masked_fill_(hit, -0.5)
        return b * 2.0

    for seed in range(3):  # g > 0 and b > 0 in every combination over the calls
        program = _agree(fn, (4, 4), (4, 4), (4, 4), calls=5, seed=seed)
    kernel = next(n for n in program.graph.nodes if n.op == "kernel" and n.attrs["kind"] == "horizontal")
    assert len(kernel.bodies) == 2, "the updates were not fused horizontally: the test tests nothing"
    g = program.graph.inputs[1]
    assert all(program._slots[v] != program._slots[g] for v in program.written_in_place())
    assert program.written_in_place(), "a's update is no longer written in place"
