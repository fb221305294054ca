"""Cases of the CUDA code generator run under Numba's CUDA simulator, in a process of their own.

``python -m tests.codegen.cuda.sim_cases`` sets ``NUMBA_ENABLE_CUDASIM=1`` before numba is
imported (the simulator is chosen when ``numba.cuda`` is first imported, for the whole process,
so the rest of the suite never sees it), runs every case and prints one JSON line per case:
``{"case": name, "error": null | traceback}``. Each case compiles with
``CompileOptions(backend="cuda")`` and compares the results of several calls with eager (and the
LLVM backend), asserting that the CUDA kernels were launched. Inputs are tiny: the simulator runs
about 9K elements per second.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
os.environ["KILN_JIT_STRICT"] = "1"  # a generator bug fails the case instead of falling back

import numpy as np  # noqa: E402

import kiln  # noqa: E402
from kiln import nn  # noqa: E402
from kiln.runtime import cuda_executor  # noqa: E402

CUDA = kiln.CompileOptions(backend="cuda")
LLVM = kiln.CompileOptions(backend="llvm")
LAUNCHES: list = []
_launch = cuda_executor.CudaProgram.launch


def _counting(self, configured, arrays):
    LAUNCHES.append(configured)
    return _launch(self, configured, arrays)


cuda_executor.CudaProgram.launch = _counting  # type: ignore[method-assign]
rng = np.random.default_rng(0)


def _close(a, e, rtol=1e-5, atol=1e-6):
    a = a.detach().numpy() if isinstance(a, kiln.Tensor) else np.asarray(a)
    e = e.detach().numpy() if isinstance(e, kiln.Tensor) else np.asarray(e)
    assert a.dtype == e.dtype, (a.dtype, e.dtype)
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)


def _agree(fn, make, calls=3, rtol=1e-5, atol=1e-6):
    """``fn`` compiled for CUDA and for LLVM against eager over ``calls`` calls of fresh inputs."""
    cuda, llvm = kiln.compile(fn, options=CUDA), kiln.compile(fn, options=LLVM)
    before = len(LAUNCHES)
    for _ in range(calls):
        args = make()
        expected = fn(*args)
        for compiled in (cuda, llvm):
            got = compiled(*args)
            for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple)
                            else (expected,), strict=True):  # fmt: skip
                _close(g, e, rtol, atol)
    assert len(LAUNCHES) > before or not any(a.numel() for a in args), "no CUDA kernel was launched"


def _t(*shape, dtype=np.float32):
    return kiln.tensor(rng.standard_normal(shape).astype(dtype))


def case_elementwise_broadcast_and_math():
    def f(x, y):
        z = (x * 2.5 + y).tanh() - y.sin() * x.exp()
        return z, kiln.where(x > y, x.log1p().abs(), (-x).sigmoid()), x.erf()

    _agree(f, lambda: (_t(4, 30), _t(30)), rtol=2e-5, atol=1e-6)


def case_elementwise_edge_values_float64():
    values = np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 1e-310, 700.0, -745.0], np.float64)

    def f(x):
        return x.exp(), x.log(), x.sqrt(), x.floor(), x.round(), x.maximum(x * 0.5)

    _agree(f, lambda: (kiln.tensor(values),), rtol=1e-14, atol=0)


def case_integer_semantics():
    def f(a, b):
        return a // b, a % b, (a * 3) ** 2, a.float() / 3, (a < b) & (a != 0)

    def make():
        a = rng.integers(-50, 50, 40).astype(np.int32)
        b = rng.integers(1, 9, 40).astype(np.int32) * rng.choice([-1, 1], 40).astype(np.int32)
        return kiln.tensor(a), kiln.tensor(b)

    _agree(f, make, atol=0, rtol=1e-6)


def case_non_contiguous_and_views():
    def f(x, y):
        return x.t() * 2 + y[:, ::2].exp(), x.reshape(6, 4).permute(1, 0).sum(-1)

    _agree(f, lambda: (_t(4, 6), _t(6, 8)))


def case_every_elementwise_primitive():
    """The registry walked: each elementwise primitive's samples, compiled alone, against eager."""
    from kiln.frontend.dispatch import apply
    from kiln.ir.primitives import ELEMENTWISE, PRIMITIVES

    checked = []
    for prim in sorted(PRIMITIVES.values(), key=lambda p: p.name):
        if prim.kind not in ELEMENTWISE or prim.scalar is None:
            continue
        for sample in prim.samples(np.random.default_rng(0))[:2]:
            args = [kiln.from_numpy(np.asarray(a)) for a in sample.args]
            compiled = kiln.compile(lambda *a, prim=prim, attrs=sample.attrs: apply(prim, *a, **attrs), options=CUDA)
            before = len(LAUNCHES)
            for _ in range(2):
                got, expected = compiled(*args), apply(prim, *args, **sample.attrs)
                _close(got, expected, rtol=1e-6, atol=1e-7)
            if len(LAUNCHES) > before:  # a sample the passes fold away (a cast to its own dtype) launches none
                checked.append(prim.name)
    assert len(set(checked)) >= 30, f"only {sorted(set(checked))} ran as CUDA kernels"


def case_strided_inputs_and_empty_shapes():
    def f(x, y):
        return x * 2 + y, (x - y).exp().sum(-1)

    # a transposed and a sliced argument: the kernels read them through their own strides
    _agree(f, lambda: (_t(6, 5).t(), _t(5, 12)[:, ::2]))
    _agree(f, lambda: (_t(0, 4), _t(0, 4)))  # no element: nothing is launched, nothing breaks
    _agree(lambda x: (x.sum(-1), x.amax(0) if x.shape[0] else x.sum(0)), lambda: (_t(3, 0),))


def case_reductions():
    def f(x):
        return x.sum(-1), x.amax(-1), x.mean(-1, keepdim=True), x.sum(), (x * x).sum(-1).sqrt()

    _agree(f, lambda: (_t(2, 70),), rtol=1e-5, atol=1e-5)


def case_softmax_and_layernorm():
    def f(x, w, b):
        n = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        return x.softmax(-1), n * w + b, x.log_softmax(-1)

    _agree(f, lambda: (_t(2, 75), _t(75), _t(75)), rtol=1e-5, atol=1e-5)


def case_horizontal_adam():
    shapes = [(5, 3), (7,), (2, 2, 2)]
    params = [nn.Parameter(_t(*s)) for s in shapes]
    twins = [nn.Parameter(kiln.tensor(p.detach().numpy().copy())) for p in params]
    opt, twin_opt = kiln.optim.Adam(params, lr=0.01), kiln.optim.Adam(twins, lr=0.01)
    step = kiln.compile(opt.step, options=CUDA)
    before = len(LAUNCHES)
    for p, q in zip(params, twins, strict=True):  # .grad is captured by identity: written in place below
        p.grad, q.grad = kiln.zeros_like(p), kiln.zeros_like(q)
    for _ in range(4):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        with kiln.no_grad():
            for p, q, g in zip(params, twins, grads, strict=True):
                p.grad.copy_(kiln.tensor(g))
                q.grad.copy_(kiln.tensor(g))
        step()
        twin_opt.step()
        for p, q in zip(params, twins, strict=True):
            _close(p, q, rtol=1e-5, atol=1e-6)
    assert len(LAUNCHES) > before, "no CUDA kernel was launched"


def case_training_step():
    kiln.manual_seed(0)
    models = []
    for _ in range(2):
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
        models.append((model, kiln.optim.Adam(model.parameters(), lr=0.01)))

    def make_step(model, opt):
        def step(x, y):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return step

    compiled = kiln.compile(make_step(*models[0]), options=CUDA)
    eager = make_step(*models[1])
    before = len(LAUNCHES)
    for _ in range(4):
        x, y = _t(4, 6), kiln.tensor(rng.integers(0, 3, 4))
        _close(compiled(x, y), eager(x, y), rtol=1e-4, atol=1e-5)
    for p, q in zip(models[0][0].parameters(), models[1][0].parameters(), strict=True):
        _close(p, q, rtol=1e-4, atol=1e-5)
    assert len(LAUNCHES) > before, "no CUDA kernel was launched"


def case_lstm_step_runs_the_scan_as_an_extern():
    """nn.LSTM's rnn_scan and rnn_scan_backward: extern nodes whose eager kernels run on the device's
    arrays, between CUDA kernels (the gradient's padding, the optimizer)."""
    models = []
    for _ in range(2):
        kiln.manual_seed(0)
        model = nn.LSTM(2, 3, bidirectional=True)
        models.append((model, kiln.optim.SGD(model.parameters(), lr=0.1)))

    def make_step(model, opt):
        def step(x):
            opt.zero_grad()
            out, (h, c) = model(x)
            loss = (out * out).sum() + (h * c).sum()
            loss.backward()
            opt.step()
            return loss

        return step

    compiled = kiln.compile(make_step(*models[0]), options=CUDA, wait=True)
    eager = make_step(*models[1])
    before = len(LAUNCHES)
    for _ in range(3):
        x = _t(3, 2, 2)
        _close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
    for p, q in zip(models[0][0].parameters(), models[1][0].parameters(), strict=True):
        _close(p, q, rtol=1e-4, atol=1e-5)
    assert len(LAUNCHES) > before, "no CUDA kernel was launched"


def case_dropout_at_dynamic_sizes_draws_the_eager_bits():
    """A draw over a dynamic batch (issue 33): random_bits and the generator's advance run as externs
    on the device's arrays at each call's sizes; the bits and the generator's state are eager's."""

    def f(x):
        return nn.functional.dropout(x * 2.0, 0.5, training=True) + 1.0, kiln.rand(x.shape[0], 3)

    compiled = kiln.compile(f, options=CUDA)
    before = len(LAUNCHES)
    for k, n in enumerate((8, 8, 5, 11, 3)):
        x = _t(n, 3)
        kiln.manual_seed(k)
        expected, state = f(x), kiln.get_rng_state().numpy().copy()
        kiln.manual_seed(k)
        got = compiled(x)
        for g, e in zip(got, expected, strict=True):
            _close(g, e, rtol=0, atol=0)
        np.testing.assert_array_equal(kiln.get_rng_state().numpy(), state)
    assert len(compiled.state.specializations) == 2, compiled.state.events
    assert compiled.state.specializations[-1].dynamic == [(0, 0)], compiled.state.events
    assert len(LAUNCHES) > before, "no CUDA kernel was launched"


def case_disk_cache_round_trip():
    from kiln.codegen.backend import Lowered, LoweringReport, backend_named
    from kiln.ir import dtypes as dt
    from kiln.ir.graph import GraphBuilder
    from kiln.ir.interpreter import interpret
    from kiln.ir.types import TensorType

    b = GraphBuilder()
    x = b.input(TensorType((3, 40), dt.float32))
    body_out = b.node("exp", [b.node("neg", [x])])
    body = b.build([body_out])
    from kiln.ir.graph import Node

    node = Node("kernel", tuple(body.inputs), {"name": "k0", "kind": "elementwise", "bodies": (body,)},
                tuple(body.outputs))  # fmt: skip
    backend = backend_named("cuda")
    graph = _kernel_graph(node)
    layouts = {v: tuple(s * v.type.dtype.itemsize for s in (40, 1)) for v in graph.values()}
    lowered = Lowered(graph, layouts)
    code = backend.generate(lowered, LoweringReport())
    again = backend.decode(backend.encode(code), graph)
    assert again.source == code.source and again.kernels == code.kernels
    a = rng.standard_normal((3, 40)).astype(np.float32)
    (got,) = backend.load(lowered, again)([a])
    np.testing.assert_allclose(got, interpret(body, [a])[0], rtol=1e-6)


def case_a_kernel_kind_registered_by_a_test():
    """The test-only ``scaled`` kind (tests/ir/test_kernel_kinds.py) with a CUDA generator registered
    from the test: compiled, launched, and equal to the interpreter over several calls."""
    from kiln.codegen.backend import Lowered, LoweringReport, backend_named
    from kiln.ir.interpreter import interpret
    from tests.ir.test_kernel_kinds import _calls, _graph, registered

    node = _graph().nodes[0]  # the scaled kernel alone
    graph = _kernel_graph(node)
    layouts = {v: tuple(s * v.type.dtype.itemsize for s in (7, 1)) for v in graph.values()}
    with registered(cuda=True):
        report = LoweringReport()
        backend = backend_named("cuda")
        program = backend.load(Lowered(graph, layouts), backend.generate(Lowered(graph, layouts), report))
        assert report.declined == [] and report.kernels == 1, report.describe()
        before = len(LAUNCHES)
        for a, b in _calls():
            (got,) = program([a, b])
            np.testing.assert_allclose(got, interpret(graph, [a, b])[0], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(got, (a + b) * a, rtol=1e-6, atol=1e-6)
        assert len(LAUNCHES) == before + 3, "the scaled kernel was not launched on each call"


def _kernel_graph(node):
    from kiln.ir.graph import Graph

    return Graph(tuple(node.inputs), (node,), tuple(node.outputs))


CASES = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


def main(names: list[str]) -> None:
    for name in names or list(CASES):
        try:
            CASES[name]()
            error = None
        except Exception:  # noqa: BLE001 - reported to the test that asked
            error = traceback.format_exc()
        print(json.dumps({"case": name, "error": error}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
