"""Eager ops on kiln's compiled kernels (kiln/frontend/eager_kernels.py, fused_steps.py): each
compiled eager kernel against its numpy kernel over the registry's samples, the switch from numpy
to the compiled kernel once its background compile is done, a failing compile said once, the
disk cache in a second process, the LRU bound, the off switches, and Adam's fused step against
its per-parameter loop (and PyTorch's)."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import kiln
from kiln.frontend import eager_kernels
from kiln.ir.primitives import PRIMITIVES


def _entry(name: str):
    (entry,) = [e for key, e in eager_kernels.CACHE.entries.items() if key[0] == name]
    return entry


@pytest.mark.parametrize("name", eager_kernels.PRIMITIVES_ON)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_compiled_eager_kernel_equals_its_numpy_kernel_over_the_samples(on, monkeypatch, name, dtype):
    monkeypatch.setattr(eager_kernels, "MIN_BYTES", 0)  # the samples are small
    prim = PRIMITIVES[name]
    kernel = eager_kernels.route(prim)
    compiled = 0
    for sample in prim.samples(np.random.default_rng(0)):
        arrays = [np.asarray(a) for a in sample.args]
        arrays = [a.astype(dtype) if a.dtype.kind == "f" else a for a in arrays]
        expected = prim.eager(np, *arrays, **sample.attrs)
        first = kernel(np, *arrays, **sample.attrs)  # numpy, while the compile runs
        assert eager_kernels.wait(120)
        second = kernel(np, *arrays, **sample.attrs)
        entry = eager_kernels.CACHE.entries[eager_kernels.key_of(name, arrays, tuple(sorted(sample.attrs.items())))]
        assert not entry.failed, entry.reason
        compiled += entry.program is not None
        tol = 1e-5 if dtype == np.float32 else 1e-12  # (compiled transcendental functions: within an ulp or two)
        for result in (first, second):
            assert result.dtype == expected.dtype and result.shape == expected.shape
            np.testing.assert_allclose(
                result, expected, rtol=tol, atol=tol * max(1.0, float(np.abs(expected).max(initial=0)))
            )
    assert compiled >= 1, f"no sample of {name} ran a compiled kernel"


def test_an_op_switches_to_its_compiled_kernel_when_the_compile_is_done_and_gradients_use_it_too(on):
    rng = np.random.default_rng(1)
    x = kiln.tensor(rng.normal(size=(8, 3, 20, 20)).astype(np.float32), requires_grad=True)
    w = kiln.tensor(rng.normal(size=(6, 3, 5, 5)).astype(np.float32), requires_grad=True)
    g = kiln.tensor(rng.normal(size=(8, 6, 16, 16)).astype(np.float32))
    results = []
    for _ in range(2):  # the first call runs numpy and queues the compiles; the second, compiled kernels
        y = kiln.nn.functional.conv2d(x, w)
        y.backward(g)
        results.append((y.detach().numpy().copy(), x.grad.numpy().copy(), w.grad.numpy().copy()))
        x.grad = w.grad = None
        if not results[1:]:
            assert {key[0] for key in eager_kernels.CACHE.entries} == {"conv", "conv_weight"}
            assert eager_kernels.wait(120)
    assert _entry("conv_weight").program is not None  # the filter's gradient
    assert all(e.program is not None for e in eager_kernels.CACHE.entries.values())
    with kiln.profiler.profile() as prof:
        kiln.nn.functional.conv2d(x, w).backward(g)
    ran = {e.name: e.args["kernel"] for e in prof.events() if e.cat == "op" and e.name.startswith("conv")}
    assert ran == {"conv": "compiled", "conv_weight": "compiled"}
    for numpy_result, compiled_result in zip(results[0], results[1], strict=True):
        np.testing.assert_allclose(compiled_result, numpy_result, rtol=1e-4, atol=1e-4)


def test_a_failing_compile_leaves_the_op_on_numpy_and_says_why_once(on, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("no code for you")

    monkeypatch.setattr(eager_kernels, "primitive_graph", broken)
    rng = np.random.default_rng(2)
    x = kiln.tensor(rng.normal(size=(4, 2, 24, 24)).astype(np.float32))
    w = kiln.tensor(rng.normal(size=(3, 2, 5, 5)).astype(np.float32))
    expected = PRIMITIVES["conv"].eager(np, x.numpy(), w.numpy(), stride=(1, 1), dilation=(1, 1))
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="kiln"):
        warnings.simplefilter("always")
        for _ in range(4):
            y = kiln.nn.functional.conv2d(x, w)
            eager_kernels.wait(120)
            np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)
        kiln.nn.functional.conv2d(x[:2], w)  # another key of the same op: said already
        eager_kernels.wait(120)
        kiln.nn.functional.conv2d(x[:2], w)
    said = [w for w in caught if issubclass(w.category, kiln.CompileWarning)]
    assert len(said) == 1 and "conv" in str(said[0].message) and "no code for you" in str(said[0].message)
    assert said[0].filename == __file__  # at the user's line
    assert [r.getMessage() for r in caplog.records if "no code for you" in r.getMessage()] == [str(said[0].message)]


def test_the_in_memory_cache_keeps_the_most_recently_used_keys(on, monkeypatch):
    monkeypatch.setattr(eager_kernels.CACHE, "capacity", 2)
    x = [kiln.tensor(np.ones((16, 2, n, 12), np.float32)) for n in (20, 21, 22)]
    w = kiln.tensor(np.ones((2, 2, 3, 5), np.float32))
    for t in (x[0], x[1], x[0], x[2]):  # x[1] is the least recently used when x[2] comes
        kiln.nn.functional.conv2d(t, w)
        eager_kernels.wait(120)
    shapes = [key[1][0][0] for key in eager_kernels.CACHE.entries]
    assert shapes == [(16, 2, 20, 12), (16, 2, 22, 12)]


def test_a_compile_asked_for_now_that_raises_leaves_its_key_on_numpy_said_once(on, monkeypatch):
    """``ready(now=True)`` compiles in the caller: an exception there is the op's failure, said once,
    not an entry left compiling forever (every later ``now`` would wait for it)."""
    monkeypatch.setattr(eager_kernels.CACHE, "synchronous", False)
    calls = []

    def raising():
        calls.append(1)
        raise RuntimeError("LLVM said no")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert eager_kernels.ready("test op", ("test op", 1), raising, now=True) is None
        assert eager_kernels.ready("test op", ("test op", 1), raising, now=True) is None
    assert calls == [1]
    said = [str(w.message) for w in caught if issubclass(w.category, kiln.CompileWarning)]
    assert len(said) == 1 and "LLVM said no" in said[0], said


def test_off_switches_leave_every_op_on_numpy(on):
    x = kiln.tensor(np.ones((8, 2, 24, 24), np.float32))
    w = kiln.tensor(np.ones((3, 2, 5, 5), np.float32))
    kiln.backends.cpu.eager_kernels = False
    assert not eager_kernels.enabled() and not eager_kernels.ROUTES
    kiln.nn.functional.conv2d(x, w)
    p = kiln.zeros(5000, requires_grad=True)
    p.grad = kiln.ones(5000)
    kiln.optim.Adam([p], fused=True).step()
    assert not eager_kernels.CACHE.entries
    kiln.backends.cpu.eager_kernels = True
    assert kiln.backends.cpu.eager_kernels and eager_kernels.ROUTES
    kiln.nn.functional.conv2d(x, w)
    assert [key[0] for key in eager_kernels.CACHE.entries] == ["conv"]
    with pytest.raises(TypeError, match="expected True or False"):
        kiln.backends.cpu.eager_kernels = "yes"


_SECOND_PROCESS = textwrap.dedent(
    """
    import numpy as np, kiln
    from kiln.frontend import eager_kernels
    x = kiln.tensor(np.arange(8 * 2 * 24 * 24, dtype=np.float32).reshape(8, 2, 24, 24) / 1000)
    w = kiln.tensor(np.ones((3, 2, 5, 5), np.float32))
    kiln.nn.functional.conv2d(x, w)
    eager_kernels.wait(120)
    y = kiln.nn.functional.conv2d(x, w)
    print(eager_kernels.enabled(), [(k[0], e.cache) for k, e in eager_kernels.CACHE.entries.items()], float(y.sum()))
    """
)


def test_a_second_process_finds_the_compiled_kernel_in_the_disk_cache(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), KILN_EAGER_KERNELS="1", PYTHONPATH=root)

    def run(**extra) -> str:
        done = subprocess.run([sys.executable, "-c", _SECOND_PROCESS], env={**env, **extra}, capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.split("\n")[-2]

    first, second, off = run(), run(), run(KILN_EAGER_KERNELS="0")
    assert first.startswith("True [('conv', 'miss')]")
    assert second.startswith("True [('conv', 'hit')]")
    assert off.startswith("False []")
    assert first.split()[-1] == second.split()[-1] == off.split()[-1]  # the same sum, compiled or not


def _adam_pair(fused_kwargs: dict, **kwargs):
    rng = np.random.default_rng(3)
    shapes = [(300, 40), (5000,), (7, 9, 11), ()]
    values = [rng.normal(size=s).astype(np.float32) for s in shapes]
    grads = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(4)]
    loops = [kiln.tensor(v.copy(), requires_grad=True) for v in values]
    fused = [kiln.tensor(v.copy(), requires_grad=True) for v in values]
    return (loops, kiln.optim.Adam(loops, lr=0.01, **kwargs)), (fused, kiln.optim.Adam(fused, lr=0.01, **fused_kwargs,
                                                                                         **kwargs)), grads  # fmt: skip


@pytest.mark.parametrize("kwargs", [{}, {"amsgrad": True, "weight_decay": 0.1, "maximize": True},
                                    {"weight_decay": 0.05, "decoupled_weight_decay": True}])  # fmt: skip
@pytest.mark.parametrize("flag", ["fused", "foreach"])
def test_adams_fused_step_equals_its_per_parameter_loop(on, kwargs, flag):
    (loops, loop_opt), (fused, fused_opt), grads = _adam_pair({flag: True}, **kwargs)
    for step, step_grads in enumerate(grads):
        for params in (loops, fused):
            for p, g in zip(params, step_grads, strict=True):
                p.grad = kiln.tensor(g)
        versions = [p._version[0] for p in fused]
        loop_opt.step()
        fused_opt.step()
        if step == 0:  # the first step ran the loop while the program compiled
            assert eager_kernels.wait(120)
            assert _entry("adam_step").program is not None
        assert all(p._version[0] > v for p, v in zip(fused, versions, strict=True))  # written in place, as the loop
        for a, b in zip(loops, fused, strict=True):
            np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-6, atol=1e-7)
            for key, value in loop_opt.state[a].items():  # (m * b1 + g * (1 - b1) is one fma when compiled:
                # where its terms cancel, the sum's error is an ulp of the terms, about 1e-8)
                np.testing.assert_allclose(fused_opt.state[b][key].numpy(), value.numpy(), rtol=1e-6, atol=1e-7)
    assert fused_opt.state[fused[0]]["step"].item() == len(grads)


def test_adams_fused_step_matches_pytorchs(on, torch):
    rng = np.random.default_rng(4)
    values = [rng.normal(size=s).astype(np.float32) for s in [(64, 64), (4096,)]]
    ours = [kiln.tensor(v.copy(), requires_grad=True) for v in values]
    theirs = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    opt = kiln.optim.Adam(ours, lr=0.01, fused=True, weight_decay=0.01)
    reference = torch.optim.Adam(theirs, lr=0.01, fused=True, weight_decay=0.01)
    for _ in range(3):
        grads = [rng.normal(size=v.shape).astype(np.float32) for v in values]
        for a, b, g in zip(ours, theirs, grads, strict=True):
            a.grad, b.grad = kiln.tensor(g), torch.tensor(g)
        opt.step()
        reference.step()
        eager_kernels.wait(120)
    assert _entry("adam_step").program is not None
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_adams_default_step_is_the_program_and_follows_pytorch_through_changes(on, torch):
    """Adam with neither flag takes the compiled step (as PyTorch its multi-tensor one): parameters
    and state equal PyTorch's over several steps while lr, betas and weight_decay change between
    steps and one parameter has no gradient on some of them."""
    rng = np.random.default_rng(5)
    values = [rng.normal(size=s).astype(np.float32) for s in [(128, 64), (128,), (10, 128), (10,)]]
    ours = [kiln.tensor(v.copy(), requires_grad=True) for v in values]
    theirs = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    opt, reference = kiln.optim.Adam(ours, lr=1e-3), torch.optim.Adam(theirs, lr=1e-3)
    changes = [{}, {"lr": 0.02}, {"betas": (0.8, 0.99)}, {"weight_decay": 0.1}, {"lr": 0.005, "betas": (0.9, 0.9)}, {}]
    for step, change in enumerate(changes):
        for o in (opt, reference):
            o.param_groups[0].update(change)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            skip = i == 3 and step % 2 == 1
            g = rng.normal(size=a.shape).astype(np.float32)
            a.grad, b.grad = (None, None) if skip else (kiln.tensor(g), torch.tensor(g))
        opt.step()
        reference.step()
        assert eager_kernels.wait(120)  # (a step with three gradients is a program of its own)
    programs = [e.program for key, e in eager_kernels.CACHE.entries.items() if key[0] == "adam_step"]
    assert len(programs) >= 2 and all(p is not None for p in programs)  # (and one per weight_decay flag)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            np.testing.assert_allclose(opt.state[a][key].numpy(), reference.state[b][key].numpy(), rtol=1e-5,
                                       atol=1e-7)  # fmt: skip


def test_a_fused_step_under_kiln_compile_is_traced_as_the_loop(on):
    w = kiln.zeros(3000, requires_grad=True)
    opt = kiln.optim.Adam([w], lr=0.1, fused=True)

    @kiln.compile
    def step(g):
        w.grad = g
        opt.step()

    for _ in range(3):
        step(kiln.ones(3000))
    np.testing.assert_allclose(w.detach().numpy(), np.full(3000, -0.3, np.float32), rtol=1e-5)
    assert not eager_kernels.CACHE.entries  # the compiled step holds the update; no eager program


def _composite_cases(rng):
    f = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    F = kiln.nn.functional
    return {
        "softmax": (lambda x: F.softmax(x, -1), [f(16, 300)]),
        "log_softmax": (lambda x: F.log_softmax(x, 1), [f(8, 50, 12)]),
        "cross_entropy": (lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), [f(64, 100), rng.integers(0, 100, 64)]),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (64,), w, b), [f(96, 64), f(64), f(64)]),
        "batch_norm": (lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=True), [f(8, 6, 10, 10), f(6), f(6), f(6), np.ones(6, np.float32)]),
        "group_norm": (lambda x, w, b: F.group_norm(x, 3, w, b), [f(4, 6, 16, 16), f(6), f(6)]),
        "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1), [f(4, 5, 18, 18)]),
        "avg_pool2d": (lambda x: F.avg_pool2d(x, 2), [f(4, 5, 18, 18)]),
        "gelu": (lambda x: F.gelu(x, approximate="tanh"), [f(8, 16, 64)]),
        "scaled_dot_product_attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [f(2, 3, 16, 8), f(2, 3, 16, 8), f(2, 3, 16, 8)]),
        **{name: (getattr(kiln, name), [f(40, 50) * 0.9]) for name in ("atan", "asin", "acos", "sinh", "cosh", "asinh", "atanh")},
        "acosh": (kiln.acosh, [np.abs(f(40, 50)) + 1.1]),
        **{name: (getattr(kiln, name), [f(40, 50), f(40, 50)]) for name in ("atan2", "hypot", "logaddexp", "logaddexp2")},
        "cumprod": (lambda x: kiln.cumprod(x, 1), [f(30, 40) * 0.1 + 1]),
        "logcumsumexp": (lambda x: kiln.logcumsumexp(x, 0), [f(30, 40)]),
    }  # fmt: skip


@pytest.mark.parametrize("name", eager_kernels.COMPOSITES_ON)
def test_every_compiled_composite_equals_its_eager_op_forward_and_backward(on, name):
    """The compiled program of each composite op against the eager op, outputs, gradients and
    in-place updates (batch_norm's running statistics) alike, over three calls."""
    fn, arrays = _composite_cases(np.random.default_rng(5))[name]

    def run():
        tensors = [kiln.tensor(a.copy(), requires_grad=a.dtype == np.float32 and i < 3) for i, a in enumerate(arrays)]
        y = fn(*tensors)
        y.backward(kiln.tensor(np.linspace(-1, 1, y.numel(), dtype=np.float32).reshape(y.shape)))
        return [y.detach().numpy(), *(t.grad.numpy() if t.grad is not None else t.detach().numpy() for t in tensors)]

    eager_kernels.set_enabled(False)
    expected = run()
    eager_kernels.set_enabled(True)
    for call in range(3):
        got = run()
        if call == 0:
            assert eager_kernels.wait(120)
            assert _entry(name).program is not None, _entry(name).reason
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_composite_call_that_cannot_match_a_specialization_stays_eager(on):
    x = kiln.tensor(np.random.default_rng(6).normal(size=(300, 64)).astype(np.float32))
    kiln.nn.functional.softmax(x[:, ::2], -1)  # with gaps: a clone would not have its layout
    kiln.nn.functional.softmax(x[:2], -1)  # too small to gain
    assert "softmax" not in {key[0] for key in eager_kernels.CACHE.entries}  # (its exp may be compiled)
    kiln.nn.functional.softmax(x, -1)
    assert "softmax" in {key[0] for key in eager_kernels.CACHE.entries}


def test_a_composite_call_on_a_transposed_input_compiles_for_that_layout(on):
    """A dense layout other than C order (a transpose, a conv's channel-major output) is cloned in
    its own order, so the compiled program's specialization matches the calls."""
    x = kiln.tensor(np.random.default_rng(7).normal(size=(300, 64)).astype(np.float32))
    expected = np.exp(x.numpy().T) / np.exp(x.numpy().T).sum(-1, keepdims=True)
    for _ in range(3):
        found = kiln.nn.functional.softmax(x.t(), -1)
        eager_kernels.wait(120)
        np.testing.assert_allclose(found.numpy(), expected, rtol=1e-5, atol=1e-7)
    (entry,) = [e for key, e in eager_kernels.CACHE.entries.items() if key[0] == "softmax"]
    assert entry.program is not None, entry.reason
    assert len(entry.program.state.specializations) == 1  # the calls ran the background's program


def test_a_composite_whose_trace_breaks_stays_eager_and_says_why_once(on, monkeypatch):
    from kiln.frontend.eager_composites import compiled_composite

    monkeypatch.setattr(eager_kernels, "ROUTED_COMPOSITES", {"scaled_by_max"})

    @compiled_composite("scaled_by_max")
    def scaled_by_max(x):
        return x / float(x.max())  # a Python float: the trace breaks

    x = kiln.tensor(np.arange(1, 5001, dtype=np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            np.testing.assert_allclose(scaled_by_max(x).numpy(), np.arange(1, 5001) / 5000, rtol=1e-6)
            eager_kernels.wait(120)
    said = [w for w in caught if issubclass(w.category, kiln.CompileWarning)]
    assert len(said) == 1 and "scaled_by_max" in str(said[0].message) and "TraceBreakError" in str(said[0].message)


@pytest.mark.parametrize("name", ["softmax", "batch_norm"])
def test_a_compiled_composites_gradient_is_differentiable_again(on, name):
    """create_graph=True through a compiled composite (a gradient penalty): the backward runs the
    eager op's, which is differentiable again; batch_norm's running statistics move once per call."""
    fn, arrays = _composite_cases(np.random.default_rng(7))[name]

    def penalty():
        tensors = [kiln.tensor(a.copy(), requires_grad=a.dtype == np.float32 and i < 3) for i, a in enumerate(arrays)]
        y = fn(*tensors)
        (g,) = kiln.autograd.grad((y * y).sum(), tensors[0], create_graph=True)
        (g * g).sum().backward()
        return [tensors[0].grad.numpy(), *(t.detach().numpy() for t in tensors[3:])]

    eager_kernels.set_enabled(False)
    expected = penalty()
    eager_kernels.set_enabled(True)
    for call in range(2):
        got = penalty()
        if call == 0:
            assert eager_kernels.wait(120) and _entry(name).program is not None
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("numpy_faster", [True, False])
def test_a_primitive_key_keeps_the_faster_kernel_after_its_trials(on, numpy_faster):
    """The first TRIALS compiled runs of a key are timed against the numpy runs timed while it
    compiled; a key where numpy won goes back to numpy (said at debug level), else stays compiled."""
    x = np.random.default_rng(8).normal(size=(64, 256)).astype(np.float32)
    exp = eager_kernels.route(PRIMITIVES["exp"])
    np.testing.assert_allclose(exp(np, x), np.exp(x), rtol=1e-6)
    assert eager_kernels.wait(120)
    entry = _entry("exp")
    assert entry.program is not None and 0 < entry.numpy_seconds < 1  # the miss's numpy run was timed
    entry.numpy_seconds = 0.0 if numpy_faster else math.inf  # as if numpy had taken no time, or forever
    for _ in range(eager_kernels.TRIALS + 2):
        np.testing.assert_allclose(exp(np, x), np.exp(x), rtol=1e-6)
    assert entry.trials == eager_kernels.TRIALS
    assert (entry.program is None) == numpy_faster
    assert (entry.reason or "").startswith("numpy is faster") == numpy_faster and not entry.failed


@pytest.mark.parametrize("kwargs", [{"momentum": 0.0}, {"momentum": 0.9, "dampening": 0.1, "maximize": True},
                                    {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}])  # fmt: skip
def test_sgds_fused_step_equals_its_per_parameter_loop(on, kwargs):
    rng = np.random.default_rng(9)
    shapes = [(300, 40), (5000,), ()]
    values = [rng.normal(size=s).astype(np.float32) for s in shapes]
    loops = [kiln.tensor(v.copy(), requires_grad=True) for v in values]
    fused = [kiln.tensor(v.copy(), requires_grad=True) for v in values]
    loop_opt = kiln.optim.SGD(loops, lr=0.05, **kwargs)
    fused_opt = kiln.optim.SGD(fused, lr=0.05, fused=True, **kwargs)
    for _ in range(4):
        grads = [rng.normal(size=s).astype(np.float32) for s in shapes]
        for params in (loops, fused):
            for p, g in zip(params, grads, strict=True):
                p.grad = kiln.tensor(g)
        loop_opt.step()
        fused_opt.step()
        eager_kernels.wait(120)
        for a, b in zip(loops, fused, strict=True):  # within an ulp of the buffer's terms (|buf| ~ 3: 2.4e-7)
            np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-6, atol=1e-6)
            for key, value in loop_opt.state[a].items():
                np.testing.assert_allclose(fused_opt.state[b][key].numpy(), value.numpy(), rtol=1e-6, atol=1e-6)
    assert _entry("sgd_step").program is not None  # (with momentum the first step made the buffers eagerly)


def test_a_compile_that_raises_past_its_own_handling_leaves_the_worker_alive(on, monkeypatch):
    """A bug that escapes a compile function is that op's failure, said once; the worker lives on."""

    def crash(*args):
        raise AssertionError("a bug in kiln")

    monkeypatch.setattr(eager_kernels, "_compile", crash)
    x = np.random.default_rng(10).normal(size=(64, 256)).astype(np.float32)
    exp = eager_kernels.route(PRIMITIVES["exp"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            np.testing.assert_allclose(exp(np, x), np.exp(x), rtol=1e-6)
            assert eager_kernels.wait(120)
    said = [w for w in caught if issubclass(w.category, kiln.CompileWarning)]
    assert len(said) == 1 and "AssertionError: a bug in kiln" in str(said[0].message)
    monkeypatch.undo()
    eager_kernels.set_enabled(True)
    sqrt = eager_kernels.route(PRIMITIVES["sqrt"])
    sqrt(np, np.abs(x))
    assert eager_kernels.wait(120) and _entry("sqrt").program is not None  # the worker still compiles


@pytest.mark.parametrize("optimizer", ["Adam", "SGD"])
def test_optimizers_step_compiled_by_default_and_loop_when_told_not_to(on, optimizer):
    """As PyTorch takes its multi-tensor path by default where it has one: fused and foreach None
    (the default) or True run the compiled step; either False keeps the per-parameter loop."""
    cases = [({}, True), ({"foreach": True}, True), ({"fused": False, "foreach": True}, True),
             ({"foreach": False}, False), ({"fused": False}, False)]  # fmt: skip
    for kwargs, compiled in cases:
        eager_kernels.CACHE.clear()
        p = kiln.zeros(5000, requires_grad=True)
        opt = getattr(kiln.optim, optimizer)([p], lr=0.01, momentum=0.9, **kwargs) if optimizer == "SGD" else \
            kiln.optim.Adam([p], lr=0.01, **kwargs)  # fmt: skip
        for _ in range(3):  # SGD's first step with momentum is the loop's (its buffer starts as the gradient)
            p.grad = kiln.ones(5000)
            opt.step()
            eager_kernels.wait(120)
        steps = [key[0] for key in eager_kernels.CACHE.entries if key[0].endswith("_step")]
        assert bool(steps) == compiled, (kwargs, steps)
