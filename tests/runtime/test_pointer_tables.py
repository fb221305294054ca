"""A kernel keeps the pointers of the program's inputs in its table between calls and refills
them only for the inputs that are other arrays than at the last call (``KernelCall.stable``, one
check of the inputs a call: ``PointerTables.see``): every way the arrays behind its inputs can
change must reach the kernel. Each case compares with eager over several calls: float32 sums of ten terms
(compiled in another order), rtol 1e-4 / atol 1e-5."""

from __future__ import annotations

import gc

import numpy as np

import kiln

from ..conftest import assert_close

N = 10  # inputs of each function
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _sum(*xs):
    out = xs[0] * 1.0
    for i, x in enumerate(xs[1:]):
        out = out + x * float(i + 2)
    return out


def _arrays(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(64, dtype=np.float32) for _ in range(N)]


def _kernel_tables(f) -> list:
    spec = f.state.specializations[-1]
    calls = spec.program.kernel_calls
    assert any(len(k.stable) >= N for k in calls), "no kernel keeps its table: the test tests nothing"
    return calls


def test_new_argument_arrays_each_call():
    f = kiln.compile(_sum)
    for seed in range(5):
        xs = [kiln.from_numpy(a) for a in _arrays(seed)]
        assert_close(f(*xs), _sum(*xs), **TOL)
    _kernel_tables(f)


def test_same_arrays_then_one_replaced():
    arrays = _arrays(0)
    xs = [kiln.from_numpy(a) for a in arrays]
    f = kiln.compile(_sum)
    for _ in range(3):
        assert_close(f(*xs), _sum(*xs), **TOL)
    _kernel_tables(f)
    for i in (0, N // 2, N - 1):  # one argument at a time is a new tensor
        xs[i] = kiln.from_numpy(np.full(64, float(i), np.float32))
        assert_close(f(*xs), _sum(*xs), **TOL)
        assert_close(f(*xs), _sum(*xs), **TOL)


def test_freed_array_and_new_one_in_its_place():
    # The old array dies and a new one may reuse its address and object id: the table must not
    # keep a pointer it read from the dead array.
    f = kiln.compile(_sum)
    xs = [kiln.from_numpy(a) for a in _arrays(1)]
    for _ in range(3):
        f(*xs)
    tables = f.state.specializations[-1].program._frame().tables
    assert tables._ids is not None, "the inputs are not remembered: the test tests nothing"
    for k in range(6):
        xs[0] = None
        gc.collect()
        assert tables._ids is None  # forgotten when the array died, before its id is reused
        xs[0] = kiln.from_numpy(np.full(64, float(k), np.float32))
        assert_close(f(*xs), _sum(*xs), **TOL)
        assert tables._ids is not None


def test_captured_tensor_data_replaced():
    # ``t.data = ...`` gives a captured tensor a new array of the same shape (no retrace).
    ws = [kiln.from_numpy(a) for a in _arrays(2)]

    def g(x):
        return _sum(x, *ws[1:])

    f = kiln.compile(g)
    x = kiln.from_numpy(_arrays(3)[0])
    for step in range(4):
        assert_close(f(x), g(x), **TOL)
        ws[step + 1].data = kiln.from_numpy(np.full(64, float(step), np.float32))
    assert len(f.state.specializations) == 1
    _kernel_tables(f)


def test_in_place_updates_over_many_parameters():
    # An optimizer step: the same arrays every call, written in place by the kernels.
    params = [kiln.from_numpy(a).requires_grad_() for a in _arrays(4)]
    eager = [kiln.from_numpy(a.copy()).requires_grad_() for a in _arrays(4)]
    for p, q, g in zip(params, eager, _arrays(5), strict=True):
        p.grad, q.grad = kiln.from_numpy(g), kiln.from_numpy(g.copy())
    opt, ref = kiln.optim.Adam(params, lr=1e-2), kiln.optim.Adam(eager, lr=1e-2)
    step = kiln.compile(lambda: opt.step())
    for _ in range(5):
        step()
        ref.step()
        for p, q in zip(params, eager, strict=True):
            assert_close(p, q, **TOL)
    _kernel_tables(step)


def test_argument_written_without_being_read():
    # ``a.copy_(...)``: the kernel writes into ``a``'s memory without reading it (the output has
    # the input's slot, which nothing clears); new and same arrays in turn.
    def g(a, *xs):
        a.copy_(_sum(*xs))
        return a * 2.0

    f = kiln.compile(g)
    xs = [kiln.from_numpy(x) for x in _arrays(6)]
    a, b = kiln.zeros(64), kiln.zeros(64)
    for target in (a, a, b, a, b, b):
        expected = g(kiln.zeros(64), *xs)
        assert_close(f(target, *xs), expected, **TOL)
        assert_close(target, expected / 2.0, **TOL)
    assert len(f.state.specializations) == 1
    _kernel_tables(f)


def test_only_the_changed_inputs_are_refilled():
    # A training step's batch is new each call, its parameters are not: the call refills the
    # pointers of the changed inputs; those of the others are the same arrays' (checked by value:
    # a table pointing at a dead batch, or at the wrong input, gives another sum).
    arrays = _arrays(7)
    xs = [kiln.from_numpy(a) for a in arrays]
    f = kiln.compile(_sum)
    f(*xs)
    calls = _kernel_tables(f)
    for step in range(6):
        for i in (step % N, (3 * step + 1) % N):
            xs[i] = kiln.from_numpy(np.full(64, float(step - i), np.float32))
        assert_close(f(*xs), _sum(*xs), **TOL)
    program = f.state.specializations[-1].program
    tables = program._frame().tables
    for call in calls:  # every input's pointer is the array of the last call's
        for position, slot in call.stable:
            index = program._input_index[slot]
            assert tables[call.table].pointers[position] == xs[index].numpy().ctypes.data


def test_input_copied_into_the_kernels_layout_then_not():
    # An input in another layout than traced is copied into it by the program's check (``run``); the
    # kernels' tables must point at the copy, a new array each call, and at the traced-layout array
    # again when it comes back. (``run_checked_inputs`` takes inputs in their traced layout: the
    # kernels no longer check the C order of the program's inputs themselves.)
    def g(x):
        return x * 2.0 + 1.0

    f = kiln.compile(g)
    x = kiln.from_numpy(np.arange(24, dtype=np.float32).reshape(4, 6))
    f(x)
    program = f.state.specializations[-1].program
    assert any(call.stable for call in program.kernel_calls), "no kernel reads the input: the test tests nothing"
    contiguous = np.arange(24, dtype=np.float32).reshape(4, 6)
    transposed = (np.arange(24, dtype=np.float32).reshape(6, 4) * -1.0).T  # [4, 6], strides (4, 16)
    assert not transposed.flags.c_contiguous
    for array in (contiguous, transposed, transposed, contiguous, transposed):
        (out,) = program.run([array])
        np.testing.assert_allclose(out, array * 2.0 + 1.0, **TOL)


def test_compiled_calls_alternating_layouts_of_one_shape():
    # The call's key holds its arguments' strides: a transposed argument of the traced shape is
    # another specialization, whose kernels were compiled for it; alternating calls stay right.
    def g(x, y):
        return (x * 2.0 + y).sum(dim=1)

    f = kiln.compile(g)
    base = np.arange(24, dtype=np.float32)
    y = kiln.from_numpy(np.linspace(0, 1, 24, dtype=np.float32).reshape(4, 6))
    c_order = kiln.from_numpy(base.reshape(4, 6).copy())
    transposed = kiln.from_numpy((base.reshape(6, 4) * -1.0).T)
    for x in (c_order, transposed, transposed, c_order, transposed, c_order):
        assert_close(f(x, y), g(x, y), **TOL)
    assert len(f.state.specializations) == 2
