"""Two ways the LLVM backend used to give up on a program, compiled against eager over several calls.

- Size-0 values inside a kernel (``x[2:2]``, ``narrow(..., 0)``, a size-0 argument): the index
  algebra divided by a size-0 dimension's stride when a reshape unflattened such a value, and a
  plan whose planned values were all empty left them without arena views.
- Integer ``**`` with a tensor exponent: square-and-multiply unrolled over all 64 exponent bits
  once kept LLVM's optimizer busy for minutes; the time limit below guards against that again. A
  base the same for every element (a broadcast) made the loop vectorizer's walk exponential.

Each program must run as a ``CompiledProgram`` with no kernel declined: the backend falls back to
the interpreter on a code generator error, which would hide these failures.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import kiln
from kiln.runtime.executor import CompiledProgram


def _agree(fn, make, calls: int = 4) -> CompiledProgram:
    cf = kiln.compile(fn, fullgraph=True)
    for k in range(calls):
        args = make(k)
        got, expected = cf(*args), fn(*args)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
    spec = cf.state.specializations[-1]
    assert isinstance(spec.program, CompiledProgram), "the LLVM backend failed and the interpreter ran"
    assert not spec.report.declined and spec.calls == calls - 1
    return spec.program


def _floats(*shape):
    rng = np.random.default_rng(sum(shape))
    return lambda k: [kiln.tensor(rng.standard_normal(shape).astype(np.float32))]


# ----------------------------------------------------------------------------- size 0
EMPTY = {
    "slice_rows": lambda x: x[2:2],
    "slice_columns": lambda x: x[:, 1:1],
    "narrow": lambda x: x.narrow(1, 2, 0),
}
THEN = {
    "exp": lambda y: y.exp() * 2,
    "transpose": lambda y: y.T * 2,
    "flatten": lambda y: (y * 2).reshape(-1) + 1,
    "reshape_swapped": lambda y: (y + 1).reshape(y.shape[1], y.shape[0]).exp(),
    "reshape_3d": lambda y: (y + 1).reshape(2, -1, 2) * 3,
    "sum_rows": lambda y: (y * 2).sum(0) + 1,
    "sum_columns": lambda y: (y * 2).sum(1) + 1,
    "softmax": lambda y: y.softmax(-1) + 1,
    "reshape_then_sum": lambda y: (y.exp().reshape(2, 0, 2)).sum(1) + 1 if y.numel() == 0 else y,
    "flatten_then_sum": lambda y: y.exp().reshape(0, 4).sum(0) + 1 if y.numel() == 0 else y,
}


@pytest.mark.parametrize("then", THEN.values(), ids=THEN.keys())
@pytest.mark.parametrize("empty", EMPTY.values(), ids=EMPTY.keys())
def test_size_zero_intermediates_compile(empty, then):
    _agree(lambda x: then(empty(x)), _floats(4, 3))


@pytest.mark.parametrize("shape", [(0, 3), (4, 0)])
def test_size_zero_arguments_compile(shape):
    _agree(lambda x: (x * 2).reshape(shape[1], shape[0]).exp() + x.T, _floats(*shape))


# ----------------------------------------------------------------------------- integer pow
INTS = [np.int64, np.int32, np.int16, np.int8, np.uint8]
POWERS = {
    "three_to_the_x": lambda x: 3**x,
    "x_to_the_x": lambda x: x**x,
    "mixed": lambda x: x**2 + x ** (x % 5),
}


@pytest.mark.parametrize("power", POWERS.values(), ids=POWERS.keys())
@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.__name__)
def test_integer_pow_with_a_tensor_exponent_compiles_quickly_and_wraps_as_eager(dtype, power):
    rng = np.random.default_rng(0)
    # exponents up to 69 reach 3**69 and 69**69: wrapped modulo 2**bits, as numpy does
    start = time.perf_counter()
    _agree(power, lambda k: [kiln.tensor(rng.integers(0, 70, size=257).astype(dtype))])
    assert time.perf_counter() - start < 60, "code generation for integer pow took minutes again"


def test_integer_pow_inside_a_row_reduction():
    rng = np.random.default_rng(1)
    program = _agree(lambda x: (x ** (x % 4)).sum(-1, keepdim=True) - 3 ** (x % 7),
                     lambda k: [kiln.tensor(rng.integers(-30, 30, size=(5, 37)))])  # fmt: skip
    assert [n.attrs["kind"] for n in program.graph.nodes if n.op == "kernel"] == ["reduction"]


def test_a_reduction_over_one_element_of_a_broadcast_input_compiles_and_matches_eager():
    """Rows of length one make the row loop innermost; over a broadcast input its body cannot be
    hoisted, and LLVM's loop vectorizer spent minutes there (found by the fuzzer, seed 8825)."""
    import kiln.nn.functional as F

    def f(a, b):
        s = F.log_softmax(b, -1)
        return s, a * F.log_softmax(s, 1)

    compiled = kiln.compile(f)
    rng = np.random.default_rng(0)
    for _ in range(3):
        a = kiln.tensor(rng.uniform(-2, 2, (5, 2, 3)), dtype=kiln.float32)
        b = kiln.tensor(rng.uniform(-2, 2, (1, 1)), dtype=kiln.float32).expand((2, 1))
        for got, want in zip(compiled(a, b), f(a, b), strict=True):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    assert sum(s.calls for s in compiled.state.specializations) >= 2


_BROADCAST_POW = """
import numpy as np, kiln
from kiln.runtime.executor import CompiledProgram
rng = np.random.default_rng(0)
cases = {
    "constant base": (lambda x: kiln.tensor([4]) ** x, lambda: [kiln.tensor(rng.integers(0, 70, size=9))]),
    "broadcast base": (lambda a, x: a ** x, lambda: [kiln.tensor([-3]), kiln.tensor(rng.integers(0, 70, size=9))]),
    "in-place filled base": (lambda x: kiln.zeros(1, dtype=kiln.int32).fill_(5) ** x,
                             lambda: [kiln.tensor(rng.integers(0, 40, size=9).astype(np.int32))]),
    "broadcast base and exponent": (lambda a, b, x: a ** b + x,
                                    lambda: [kiln.tensor([3]), kiln.tensor([41]), kiln.tensor(rng.integers(0, 9, size=9))]),
}
for name, (fn, make) in cases.items():
    compiled = kiln.compile(fn, fullgraph=True)
    for _ in range(3):
        args = make()
        got, expected = compiled(*args), fn(*args)
        assert got.dtype == expected.dtype and np.array_equal(got.numpy(), expected.numpy()), (name, got, expected)
    spec = compiled.state.specializations[-1]
    assert isinstance(spec.program, CompiledProgram) and not spec.report.declined, (name, spec.report.describe())
    print("ok", name, flush=True)
"""


def test_integer_pow_of_a_broadcast_base_compiles_in_seconds(tmp_path):
    """A base read from one address for every element (a constant, a broadcast, a filled tensor)
    made LLVM's loop vectorizer walk the squaring chain ``x * x`` without memoizing: 2**63 steps,
    a compile that never ended (the fuzzer hit it twice). Run in a child under a time limit, so a
    regression fails here instead of hanging the suite; numpy's wrapped powers are the reference
    (eager's kernel is ``np.power``)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path), KILN_JIT_STRICT="1")
    try:
        out = subprocess.run([sys.executable, "-c", _BROADCAST_POW], capture_output=True, text=True, env=env,
                             timeout=120)  # fmt: skip
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"integer pow of a broadcast base still compiles for minutes; done: {error.stdout!r}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("ok ") == 4
