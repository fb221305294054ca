"""Dynamic image sizes and joins along a dynamic axis (``frontend/jit/dynamic.py``, ``SymSum``).

A conv's output size ``(H - 3)//1 + 1`` and a cat's ``T + 1`` are sums of symbols and whole numbers
(``kiln.ir.types.SymSum``) that the shape rules derive. Every test compares compiled calls with the
same function run eagerly over several sizes (values, and gradients where the call has a backward),
and counts the specializations the calls made.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.frontend.jit.symbolic_program import SymbolicProgram
from kiln.ir.parser import parse_graph
from kiln.ir.printer import print_graph
from kiln.ir.serialize import graph_from_json, graph_to_json
from kiln.ir.types import Sym, SymbolicShapeError, dim_size, parse_dim, sym_product, sym_sum
from tests.conftest import assert_close


def specs(compiled) -> int:
    return len(compiled.state.specializations)


class FullyConvolutional(nn.Module):
    """Convs with padding and stride 2, a max and an average pool over windows, a transposed conv and
    a global average: every window op over the image's height and width."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 6, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(6, 4, 2, stride=2)
        self.c3 = nn.Conv2d(4, 2, 3)

    def forward(self, x):
        h = F.relu(self.c1(x))
        h = F.max_pool2d(h, 3, 1, 1) + F.avg_pool2d(h, 3, stride=1, padding=1) + F.adaptive_avg_pool2d(h, 1)
        return self.c3(self.up(F.relu(self.c2(h))))


SIZES = [(16, 16), (20, 12), (21, 17), (15, 13), (32, 9), (16, 16)]


def test_a_fully_convolutional_net_over_images_of_many_sizes_has_two_specializations():
    kiln.manual_seed(0)
    net = FullyConvolutional()
    compiled = kiln.compile(net)
    params = list(net.parameters())
    for h, w in SIZES:
        x = kiln.randn(2, 3, h, w)
        actual, expected = compiled(x), net(x)
        assert tuple(actual.shape) == tuple(expected.shape)
        assert_close(actual.detach().numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-5)
        grads = [kiln.autograd.grad((out * out).sum(), params) for out in (actual, expected)]
        for a, e in zip(*grads, strict=True):
            assert_close(a.numpy(), e.numpy(), rtol=1e-4, atol=1e-4)
    explained = kiln.explain(compiled)
    assert len(explained.reasons) == 2, explained.reasons  # the static one, then the dynamic one
    assert "dynamic: argument 0 dim 2, argument 0 dim 3" in explained.reasons[1]


def test_a_compiled_conv_step_over_images_of_three_sizes_trains_as_eager():
    kiln.manual_seed(1)
    nets = [nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 1, 3)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [kiln.optim.SGD(n.parameters(), lr=0.1) for n in nets]

    def step(net, opt, x):
        opt.zero_grad()
        loss = (net(x) - 0.5).pow(2).mean()  # the mean divides by a product of the derived sizes
        loss.backward()
        opt.step()
        return loss

    compiled = kiln.compile(step)
    for h, w in [(10, 12), (14, 9), (11, 13), (10, 12), (23, 7), (6, 40)]:  # H != W: equal ones share a symbol
        x = kiln.randn(3, 1, h, w)
        assert_close(compiled(nets[0], opts[0], x).item(), step(nets[1], opts[1], x).item(), rtol=1e-4, atol=1e-6)
    for a, e in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert_close(a.detach().numpy(), e.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic  # static, then dynamic
    assert isinstance(compiled.state.specializations[1].program, SymbolicProgram)  # code generated once


def test_an_image_smaller_than_the_kernel_fails_as_eager_naming_the_op():
    conv = nn.Conv2d(1, 1, 5)
    compiled = kiln.compile(lambda x: conv(x).sum())
    for n in (8, 11, 9):
        compiled(kiln.randn(1, 1, n, n))
    with pytest.raises(RuntimeError, match="Kernel size can't be greater than actual input size"):
        conv(kiln.randn(1, 1, 3, 3))
    # the dynamic program does not take the size: the call traces again, and raises as eager does
    with pytest.raises(RuntimeError, match="Kernel size can't be greater than actual input size"):
        compiled(kiln.randn(1, 1, 3, 3))


def test_cat_along_a_dynamic_axis_is_a_sum_and_one_program_serves_every_length():
    def grow(cache, new):  # a KV cache grown by one step
        return kiln.cat([cache, new], dim=1) * 2.0

    compiled = kiln.compile(grow)
    rng = np.random.default_rng(0)
    for t in (4, 6, 9, 17, 2, 6):
        args = [rng.normal(size=(2, t, 8)).astype(np.float32), rng.normal(size=(2, 1, 8)).astype(np.float32)]
        xs = [[kiln.tensor(a, requires_grad=True) for a in args] for _ in range(2)]
        actual, expected = compiled(*xs[0]), grow(*xs[1])
        assert tuple(actual.shape) == (2, t + 1, 8)
        assert_close(actual.detach().numpy(), expected.detach().numpy(), rtol=1e-6, atol=1e-6)
        grads = [kiln.autograd.grad((out * out).sum(), x) for out, x in zip((actual, expected), xs, strict=True)]
        for a, e in zip(*grads, strict=True):
            assert_close(a.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    assert specs(compiled) == 2 and compiled.state.specializations[1].dynamic == [(0, 1)]
    assert "(s0+1)" in str(compiled.state.specializations[1].traced_graph)


def test_cat_of_two_dynamic_lengths_is_their_sum():
    def f(a, b):
        return kiln.cat([a, b]).sum(0)

    compiled = kiln.compile(f)
    for m, n in ((3, 5), (4, 7), (9, 2), (6, 6)):
        a, b = kiln.randn(m, 4), kiln.randn(n, 4)
        assert_close(compiled(a, b).numpy(), f(a, b).numpy(), rtol=1e-5, atol=1e-6)
    assert "(s0+s1)" in str(compiled.state.specializations[1].traced_graph)


def test_a_whole_stop_on_a_dynamic_dim_stays_static():
    # two traces cannot tell x[:2] from x[:n // 2] at sizes 4 and 5: a whole stop stays static
    compiled = kiln.compile(lambda x: x[: x.shape[0] // 2] * 2.0)
    for n in (4, 5, 10):
        assert compiled(kiln.ones(n, 3)).shape[0] == n // 2
    assert all(s.dynamic is None for s in compiled.state.specializations)


def test_an_export_with_dynamic_height_and_width_runs_at_other_sizes(tmp_path):
    kiln.manual_seed(2)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 3, stride=2), nn.ReLU())
    program = kiln.export(net, kiln.randn(1, 3, 12, 10), dynamic_shapes=[{0: "n", 2: "h", 3: "w"}])
    assert program.graph.inputs[0].type.shape == (Sym("n"), 3, Sym("h"), Sym("w"))
    program.save(tmp_path / "fcn.kiln")
    loaded = kiln.load_exported(tmp_path / "fcn.kiln")
    for shape in ((1, 3, 12, 10), (2, 3, 17, 9), (3, 3, 8, 31)):
        x = kiln.randn(*shape)
        assert_close(loaded(x).numpy(), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- the sizes themselves
def test_sym_sum_simplifies_and_binds():
    h, w = Sym("H"), Sym("W")
    assert sym_sum([h]) == h and sym_sum([3, 4]) == 7
    assert str(sym_sum([h], -2)) == "(H-2)" and str(sym_sum([h, w], 1)) == "(H+W+1)"
    half = sym_sum([h], 1, 2)  # a stride-2 window's count
    assert str(half) == "(H+1)//2" and [dim_size(half, {h: n}) for n in (7, 8)] == [4, 4]
    assert sym_sum([half], 3, 2) == sym_sum([h], 7, 4)  # ((H+1)//2 + 3)//2 == (H+7)//4
    assert sym_sum([sym_product(2, [half])], 0, 2) == half  # a transposed stride-2 conv, then stride 2
    for n in range(1, 40):
        assert dim_size(sym_sum([half], 3, 2), {h: n}) == ((n + 1) // 2 + 3) // 2
    with pytest.raises(SymbolicShapeError, match="floor-divided"):
        sym_sum([half, w])


@pytest.mark.parametrize("text", ["(H-2)", "(H+1)//2", "(H+W+1)", "3*W*(H-2)", "(H+W+3*W*(H-2)+1)", "(H)//2"])
def test_the_text_form_of_a_sum_reads_back(text):
    assert str(parse_dim(text)) == text or parse_dim(str(parse_dim(text))) == parse_dim(text)
    with pytest.raises(ValueError):
        parse_dim("(H-W)")  # sizes are added, only whole numbers subtracted


def test_a_graph_with_derived_sizes_round_trips_through_text_and_json():
    conv = nn.Conv2d(2, 3, 3, stride=2)
    program = kiln.export(conv, kiln.randn(1, 2, 9, 11), dynamic_shapes=[{2: "h", 3: "w"}])
    graph = program.graph
    text = print_graph(graph, locations=False)
    assert "(h-1)//2" in text
    constants = dict(graph.constants)
    assert print_graph(parse_graph(text, constants), locations=False) == text
    assert print_graph(graph_from_json(graph_to_json(graph), constants), locations=False) == text


def test_a_winograd_conv_traced_at_sizes_of_one_remainder_stays_right_at_the_others():
    # conv2d pads a plane to whole Winograd tiles by a number Python computes from its size: widths
    # 27 and 43 (both 3 mod 4) trace alike, and a program made from them would leave 26's last
    # columns zero. tile_transform takes no symbolic size, so such a conv keeps its call static.
    kiln.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3))
    compiled = kiln.compile(lambda x: net(x))
    with kiln.no_grad():
        for h, w in [(20, 27), (36, 43), (21, 26), (22, 28), (12, 9)]:
            x = kiln.randn(2, 16, h, w)
            assert_close(compiled(x).numpy(), net(x).numpy(), rtol=1e-4, atol=1e-4)
    assert "tile_transform does not take a symbolic spatial dimension" in kiln.explain(compiled).reasons[1]


def test_a_means_count_is_the_element_count_not_a_size_that_coincides_at_the_traced_sizes():
    """Traced at (3, 3, 14, 25) and (2, 3, 21, 26), a mean's count of elements (3150, then 3276) is also
    126 times the last size (25, then 26): the count was taken for that, and the program then divided
    by the wrong number at every other height (a silent error in 8edb180). The count of the reduced
    value's elements, which the graph has, is the spelling to take."""
    rng = np.random.default_rng(0)
    step = kiln.compile(lambda x: (kiln.relu(x) ** 2).mean())
    for shape in [(3, 3, 14, 25), (2, 3, 21, 26), (3, 3, 13, 24), (2, 3, 5, 7), (3, 3, 9, 30)]:
        a = rng.standard_normal(shape).astype(np.float32)
        expected = (np.maximum(a.astype(np.float64), 0) ** 2).mean()
        np.testing.assert_allclose(step(kiln.tensor(a)).item(), expected, rtol=1e-5, atol=1e-6)
    assert len(step.state.specializations) == 2


def test_a_program_dynamic_in_other_dims_than_an_earlier_one_guards_the_dims_it_keeps_static():
    """Batch 3 then 2 made one program dynamic in the batch; heights and widths then made another,
    whose batch stayed 3. The call key leaves out every dim some program made dynamic, so a batch of 2
    found the second program and ran it with a batch of 3 (broadcast errors; a silent wrong result
    where shapes happen to broadcast). The dims it keeps static are guarded now."""
    rng = np.random.default_rng(3)
    kiln.manual_seed(0)
    net = nn.Sequential(nn.AvgPool2d(2, stride=1), nn.ConvTranspose2d(3, 1, 2), nn.ConvTranspose2d(1, 4, 1))

    def f(x):
        y = net(x)
        return (y * y).mean() + y.sum(dim=(2, 3)).mean()

    step = kiln.compile(f)
    for shape in [(3, 3, 13, 22), (2, 3, 22, 22), (3, 3, 28, 17), (2, 3, 21, 23), (3, 3, 15, 19)]:
        a = rng.standard_normal(shape).astype(np.float32)
        found, expected = [], []
        for fn, out in ((f, expected), (step, found)):
            x = kiln.tensor(a, requires_grad=True)
            loss = fn(x)
            loss.backward()
            out += [loss.item(), x.grad.numpy()]
        assert_close(found[0], expected[0], rtol=1e-5, atol=1e-6)
        assert_close(found[1], expected[1], rtol=1e-4, atol=1e-6)
