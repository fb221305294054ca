"""``torch.hann_window``..., ``histogram``, ``gradient``, ``nextafter``, ``mvlgamma``, ``range``,
``poisson``/``binomial``, ``rsub``, ``fill``, the predicates, ``frombuffer``, the ``*_copy`` views,
``split_with_sizes``, ``diagonal_scatter`` and ``cumulative_trapezoid``, against torch; gradients
by finite differences in float64, compiled calls against eager."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln
from kiln.frontend.autograd import gradcheck
from tests.conftest import assert_results_close, torch_pair

RNG = np.random.default_rng(1)


_pair = torch_pair


def _close(ours, theirs, rtol=1e-10, atol=1e-12):
    assert_results_close(ours, theirs, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["hann_window", "hamming_window", "blackman_window", "bartlett_window",
                                  "kaiser_window"])  # fmt: skip
def test_windows_match_torch(torch, name):
    ours, theirs = getattr(kiln, name), getattr(torch, name)
    for length in (0, 1, 2, 5, 8):
        for periodic in (True, False):
            _close(ours(length, periodic), theirs(length, periodic), rtol=1e-6, atol=1e-6)
            _close(ours(length, periodic, dtype=kiln.float64), theirs(length, periodic, dtype=torch.float64))
    extra = {"hamming_window": (0.6, 0.4), "kaiser_window": (5.0,)}.get(name)
    if extra:
        _close(ours(7, False, *extra, dtype=kiln.float64), theirs(7, False, *extra, dtype=torch.float64))
    assert ours(4, requires_grad=True).requires_grad
    with pytest.raises(RuntimeError, match="floating point"):
        ours(4, dtype=kiln.int64)
    with pytest.raises(RuntimeError, match="non-negative"):
        ours(-1)


def test_histogram_matches_torch(torch):
    array = RNG.standard_normal(50)
    ours, theirs = _pair(torch, array)
    _close(kiln.histogram(ours, 7), torch.histogram(theirs, 7))
    _close(ours.histogram(5, range=(-1.0, 1.0), density=True), theirs.histogram(5, range=(-1.0, 1.0), density=True))
    weight, tweight = _pair(torch, RNG.random(50))
    edges, tedges = _pair(torch, np.array([-2.0, -0.5, 0.0, 2.0]))
    _close(kiln.histogram(ours, edges, weight=weight), torch.histogram(theirs, tedges, weight=tweight))
    small, tsmall = _pair(torch, np.array([0.0, 1, 1, 2, 3, 3, 3, 10], dtype=np.float32))
    _close(kiln.histogram(small, 7), torch.histogram(tsmall, 7), rtol=1e-6, atol=1e-6)
    result = kiln.histogram(small, 3)
    assert type(result).__name__ == "histogram" and result.hist is result[0]
    for values in ([], [2.0, 2.0]):  # an empty range widens: [0, 1] without data, +-0.5 around one value
        _close(kiln.histogram(kiln.tensor(values), 2), torch.histogram(torch.tensor(values), 2), rtol=1e-6)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        kiln.histogram(ours, 0)
    with pytest.raises(RuntimeError, match="min should not exceed max"):
        kiln.histogram(ours, 3, range=(2.0, 1.0))
    with pytest.raises(RuntimeError, match="not implemented for"):
        kiln.histogram(kiln.tensor([1, 2]), 3)


def test_gradient_matches_torch(torch):
    array = RNG.standard_normal((4, 5))
    ours, theirs = _pair(torch, array)
    coords, tcoords = _pair(torch, np.array([0.0, 1.0, 1.5, 3.0, 4.0]))
    for kwargs in ({}, {"spacing": 2.0}, {"spacing": [2.0, 0.5]}, {"dim": 1}, {"dim": -1, "edge_order": 2},
                   {"spacing": 3.0, "edge_order": 2}, {"dim": (0,), "spacing": [0.5]}):  # fmt: skip
        _close(kiln.gradient(ours, **kwargs), torch.gradient(theirs, **kwargs))
    for edge_order in (1, 2):
        _close(kiln.gradient(ours, spacing=(coords,), dim=1, edge_order=edge_order),
               torch.gradient(theirs, spacing=(tcoords,), dim=1, edge_order=edge_order))  # fmt: skip
    _close(kiln.gradient(kiln.tensor([1, 4, 9, 16])), torch.gradient(torch.tensor([1, 4, 9, 16])))  # int: float32
    _close(kiln.gradient(kiln.tensor([1.0, 3, 7]), spacing=kiln.tensor(2.0)),
           torch.gradient(torch.tensor([1.0, 3, 7]), spacing=torch.tensor(2.0)))  # fmt: skip
    with pytest.raises(RuntimeError, match="at least edge_order\\+1"):
        kiln.gradient(kiln.ones(2), edge_order=2)
    with pytest.raises(IndexError, match="Dimension out of range"):
        kiln.gradient(ours, dim=2)
    with pytest.raises(RuntimeError, match="same length"):
        kiln.gradient(ours, spacing=[1.0, 2.0, 3.0])


def test_gradient_is_differentiable_and_compiles():
    x = kiln.tensor(RNG.standard_normal((4, 5)), requires_grad=True)
    coords = kiln.tensor([0.0, 1.0, 1.5, 3.0, 4.0], dtype=kiln.float64)
    assert gradcheck(lambda t: kiln.gradient(t, spacing=(coords,), dim=1, edge_order=2)[0], (x,),
                     eps=1e-6, atol=1e-5, rtol=1e-4)  # fmt: skip

    def f(t):
        return kiln.gradient(t, spacing=[2.0, 0.5], edge_order=2)

    compiled = kiln.compile(f, fullgraph=True)
    y = kiln.randn(4, 5)
    for _ in range(3):
        for a, b in zip(compiled(y), f(y), strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)


def test_nextafter_and_mvlgamma_match_torch(torch):
    a, ta = _pair(torch, np.array([1.0, 2.0, 0.0, -1.0, 5.0]))
    b, tb = _pair(torch, np.array([3.0, 0.0, -1.0, -1.0, np.inf]))
    _close(kiln.nextafter(a, b), torch.nextafter(ta, tb), rtol=0, atol=0)
    _close(a.float().nextafter(b.float()), ta.float().nextafter(tb.float()), rtol=0, atol=0)
    c, tc = a.clone(), ta.clone()
    c.nextafter_(b)
    tc.nextafter_(tb)
    _close(c, tc, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="not implemented"):
        kiln.nextafter(kiln.tensor([1, 2]), kiln.tensor([3, 3]))
    x, tx = _pair(torch, np.array([0.2, 0.5, 1.7, 3.0, 10.0, -1.5]))
    for p in (1, 2, 3):
        _close(kiln.mvlgamma(x, p), torch.mvlgamma(tx, p))
        _close(x.mvlgamma(p), tx.mvlgamma(p))
    _close(kiln.mvlgamma(kiln.tensor([2, 3]), 2), torch.mvlgamma(torch.tensor([2, 3]), 2), rtol=1e-6)
    y, ty = x.clone(), tx.clone()
    y.mvlgamma_(2)
    ty.mvlgamma_(2)
    _close(y, ty)
    with pytest.raises(RuntimeError, match="greater than or equal to 1"):
        kiln.mvlgamma(x, 0)
    z = kiln.tensor([2.5, 4.0, 7.0], dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda t: kiln.mvlgamma(t, 3), (z,), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_range_is_inclusive_and_deprecated(torch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args, kwargs in [((1, 4), {}), ((0, 1, 0.3), {}), ((1, 4), {"dtype": torch.int64}), ((5, 1, -2), {}),
                             ((0.5, 2.5), {"dtype": torch.float64})]:  # fmt: skip
            ours_kwargs = {"dtype": kiln.int64 if kwargs["dtype"] is torch.int64 else kiln.float64} if kwargs else {}
            _close(kiln.range(*args, **ours_kwargs), torch.range(*args, **kwargs), rtol=1e-7)
    with pytest.warns(UserWarning, match="deprecated"):
        kiln.range(0, 2)
    with pytest.raises(TypeError):
        kiln.range(5)
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.range(3, 1)


def test_poisson_and_binomial_sample_repeatably():
    kiln.manual_seed(3)
    rates = kiln.tensor([0.0, 1.0, 4.0, 100.0]).expand(4000, 4)
    first = kiln.poisson(rates)
    kiln.manual_seed(3)
    again = kiln.poisson(rates)
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    assert first.dtype is kiln.float32 and (first.numpy()[:, 0] == 0).all()
    np.testing.assert_allclose(first.numpy().mean(0), [0.0, 1.0, 4.0, 100.0], rtol=0.05, atol=0.05)
    assert not np.array_equal(kiln.poisson(rates).numpy(), first.numpy())  # the generator moved on
    count = kiln.full((4000, 3), 10.0, dtype=kiln.float64)
    draws = kiln.binomial(count, kiln.tensor([0.0, 0.3, 1.0], dtype=kiln.float64))
    assert draws.dtype is kiln.float64
    np.testing.assert_allclose(draws.numpy().mean(0), [0.0, 3.0, 10.0], rtol=0.05, atol=0.05)
    with pytest.raises(RuntimeError, match="rate"):
        kiln.poisson(kiln.tensor([-1.0]))
    with pytest.raises(RuntimeError):
        kiln.binomial(kiln.tensor([3.0]), kiln.tensor([1.5]))


def test_small_names_match_torch(torch):
    a, ta = _pair(torch, np.array([1.0, 2.0, 3.0]))
    _close(kiln.rsub(a, 5, alpha=2), torch.rsub(ta, 5, alpha=2))
    _close(kiln.rsub(a, a * 3), torch.rsub(ta, ta * 3))
    _close(kiln.rsub(kiln.tensor([1, 2]), 5), torch.rsub(torch.tensor([1, 2]), 5))
    _close(kiln.fill(a, 3), torch.fill(ta, 3))
    _close(kiln.fill(kiln.ones(2, dtype=kiln.int64), 2.7), torch.fill(torch.ones(2, dtype=torch.int64), 2.7))
    _close(kiln.fill(a, kiln.tensor(4.0)), torch.fill(ta, torch.tensor(4.0)))
    assert kiln.is_same_size(a, a * 2) and not kiln.is_same_size(a, kiln.ones(2))
    for ours, theirs in [(kiln.uint8, torch.uint8), (kiln.bool, torch.bool), (kiln.int8, torch.int8),
                         (kiln.float16, torch.float16)]:  # fmt: skip
        assert kiln.is_signed(kiln.ones(1, dtype=ours)) == torch.is_signed(torch.ones(1, dtype=theirs))
    assert not kiln.is_inference_mode_enabled()
    with kiln.inference_mode():
        assert kiln.is_inference_mode_enabled()
    assert kiln.typename(kiln.ones(2)) == torch.typename(torch.ones(2)) == "torch.FloatTensor"
    assert kiln.typename(1) == torch.typename(1) == "int"
    assert kiln.typename(kiln.nn.Linear(1, 1)) == "kiln.nn.modules.linear.Linear"


def test_frombuffer_shares_memory(torch):
    buffer = bytearray(np.arange(6, dtype=np.float32).tobytes())
    ours = kiln.frombuffer(buffer, dtype=kiln.float32, count=3, offset=4)
    theirs = torch.frombuffer(buffer, dtype=torch.float32, count=3, offset=4)
    _close(ours, theirs)
    ours[0] = 9.0
    assert theirs[0].item() == 9.0  # both over the same bytes
    with pytest.raises(ValueError):
        kiln.frombuffer(bytearray(b"abc"), dtype=kiln.float32)
    with pytest.warns(UserWarning, match="not writable"):
        kiln.frombuffer(b"abcd", dtype=kiln.uint8)


COPIES = [("view_copy", ((3, 4),)), ("permute_copy", ((2, 0, 1),)), ("transpose_copy", (0, 2)),
          ("expand_copy", ((2, 2, 3, 4),)), ("slice_copy", (1, 1, None, 2)), ("slice_copy", ()),
          ("select_copy", (2, -1)), ("squeeze_copy", ()), ("unsqueeze_copy", (-1,)), ("diagonal_copy", (1, 1, 2)),
          ("unbind_copy", (1,)), ("split_copy", (2, 2)), ("split_with_sizes_copy", ([1, 3], 2)), ("alias_copy", ()),
          ("detach_copy", ()), ("as_strided_copy", ((2, 2), (1, 2), 1)), ("unfold_copy", (2, 2, 1)),
          ("split_with_sizes", ([2, 1], 1)), ("unsafe_split", (1, 0)), ("unsafe_chunk", (3, -1))]  # fmt: skip


@pytest.mark.parametrize(("name", "args"), COPIES, ids=[f"{c[0]}-{i}" for i, c in enumerate(COPIES)])
def test_copies_and_splits_match_torch(torch, name, args):
    x, tx = _pair(torch, RNG.standard_normal((2, 3, 4)) if name != "view_copy" else RNG.standard_normal((2, 6)))
    ours, theirs = getattr(kiln, name)(x, *args), getattr(torch, name)(tx, *args)
    _close(ours, tuple(theirs) if isinstance(theirs, (tuple, list)) else theirs)
    if name.endswith("_copy"):
        for piece in ours if isinstance(ours, tuple) else (ours,):
            assert not np.shares_memory(piece.numpy(), x.numpy())


def test_copy_errors_and_the_t_copy():
    x = kiln.ones(2, 3)
    assert kiln.t_copy(x).shape == (3, 2)
    with pytest.raises(RuntimeError, match="sum exactly to 3"):
        kiln.split_with_sizes(x, [1, 1], 1)
    with pytest.raises(IndexError):
        kiln.select_copy(x, 0, 5)


def test_diagonal_scatter_and_cumulative_trapezoid_match_torch(torch):
    x, tx = _pair(torch, RNG.standard_normal((3, 4)))
    src, tsrc = _pair(torch, RNG.standard_normal(3))
    _close(kiln.diagonal_scatter(x, src, 1), torch.diagonal_scatter(tx, tsrc, 1))
    _close(x.diagonal_scatter(src[:2], -1), tx.diagonal_scatter(tsrc[:2], -1))
    cube, tcube = _pair(torch, RNG.standard_normal((2, 3, 3)))
    side, tside = _pair(torch, RNG.standard_normal((3, 2)))
    _close(kiln.diagonal_scatter(cube, side, 0, 0, 2), torch.diagonal_scatter(tcube, tside, 0, 0, 2))
    with pytest.raises(RuntimeError, match="size equal to the slice"):
        kiln.diagonal_scatter(x, kiln.ones(2, dtype=kiln.float64), 1)
    y, ty = _pair(torch, RNG.standard_normal((2, 5)))
    pts, tpts = _pair(torch, np.array([0.0, 1.0, 1.5, 3.0, 4.0]))
    grid, tgrid = _pair(torch, np.cumsum(RNG.random((2, 5)), 1))
    _close(kiln.cumulative_trapezoid(y), torch.cumulative_trapezoid(ty))
    _close(kiln.cumulative_trapezoid(y, dx=0.5), torch.cumulative_trapezoid(ty, dx=0.5))
    _close(kiln.cumulative_trapezoid(y, pts), torch.cumulative_trapezoid(ty, tpts))
    _close(kiln.cumulative_trapezoid(y, grid), torch.cumulative_trapezoid(ty, tgrid))
    _close(kiln.cumulative_trapezoid(y, dim=0), torch.cumulative_trapezoid(ty, dim=0))
    _close(kiln.cumulative_trapezoid(kiln.tensor([1, 2, 4])), torch.cumulative_trapezoid(torch.tensor([1, 2, 4])))
    for shape in ((3, 0), (3, 1)):
        _close(kiln.cumulative_trapezoid(kiln.ones(*shape)), torch.cumulative_trapezoid(torch.ones(*shape)))
    with pytest.raises(RuntimeError, match="one `x` value for each sample point"):
        kiln.cumulative_trapezoid(y, kiln.ones(4, dtype=kiln.float64))


def test_diagonal_scatter_and_cumulative_trapezoid_gradients_and_compile():
    x = kiln.tensor(RNG.standard_normal((3, 4)), requires_grad=True)
    src = kiln.tensor(RNG.standard_normal(3), requires_grad=True)
    assert gradcheck(lambda a, b: kiln.diagonal_scatter(a, b, 1) * 2.0, (x, src), eps=1e-6, atol=1e-5, rtol=1e-4)
    pts = kiln.tensor([0.0, 1.0, 1.5, 4.0], dtype=kiln.float64)
    assert gradcheck(lambda a: kiln.cumulative_trapezoid(a, pts), (x,), eps=1e-6, atol=1e-5, rtol=1e-4)

    def f(a, b):
        return kiln.diagonal_scatter(a, b, 1), kiln.cumulative_trapezoid(a, dx=0.5), kiln.view_copy(a, (2, 6))

    compiled = kiln.compile(f, fullgraph=True)
    a, b = kiln.randn(3, 4), kiln.randn(3)
    for _ in range(3):
        for got, want in zip(compiled(a, b), f(a, b), strict=True):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_value_reading_names_finish_compiled_calls_eagerly():
    """histogram and nextafter read the values: the compiled call says so and runs eagerly."""

    def f(t):
        return kiln.histogram(t, 4).hist, kiln.nextafter(t, t + 1)

    compiled = kiln.compile(f)
    x = kiln.randn(20)
    with pytest.warns(kiln.CompileWarning, match="histogram has no compiled form"):
        compiled(x)
    for _ in range(2):
        for got, want in zip(compiled(x), f(x), strict=True):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(Exception, match="histogram"):
        kiln.compile(f, fullgraph=True)(x)


SIGNAL_WINDOWS = [("hann", {}), ("hamming", {}), ("blackman", {}), ("bartlett", {}), ("kaiser", {"beta": 5.0}),
                  ("cosine", {}), ("exponential", {"tau": 2.0}), ("gaussian", {"std": 0.7}), ("nuttall", {}),
                  ("general_cosine", {"a": [0.4, 0.5, 0.1]}), ("general_hamming", {"alpha": 0.6})]  # fmt: skip


@pytest.mark.parametrize(("name", "kwargs"), SIGNAL_WINDOWS, ids=[w[0] for w in SIGNAL_WINDOWS])
def test_signal_windows_match_torch(torch, name, kwargs):
    ours, theirs = getattr(kiln.signal.windows, name), getattr(torch.signal.windows, name)
    for length in (0, 1, 2, 5, 8):
        for sym in (True, False):
            _close(ours(length, sym=sym, **kwargs), theirs(length, sym=sym, **kwargs), rtol=1e-6, atol=1e-6)
            _close(ours(length, sym=sym, dtype=kiln.float64, **kwargs),
                   theirs(length, sym=sym, dtype=torch.float64, **kwargs))  # fmt: skip
    with pytest.raises(RuntimeError, match="non-negative"):
        ours(-1, **kwargs)


def test_signal_window_options_and_errors(torch):
    _close(kiln.signal.windows.exponential(5, center=1.0, sym=False),
           torch.signal.windows.exponential(5, center=1.0, sym=False), rtol=1e-6)  # fmt: skip
    with pytest.raises(ValueError, match="Center must be None"):
        kiln.signal.windows.exponential(5, center=1.0)
    for call in (lambda w: w.gaussian(4, std=0.0), lambda w: w.exponential(4, tau=0.0), lambda w: w.kaiser(4, beta=-1.0),
                 lambda w: w.general_cosine(4, a=[])):  # fmt: skip
        with pytest.raises(ValueError):
            call(kiln.signal.windows)
        with pytest.raises(ValueError):
            call(torch.signal.windows)
