"""Checks on values are part of the compiled program: every compiled call raises what eager raises.

For each op whose eager path validates values (index ranges, class targets, one_hot's classes,
binary_cross_entropy's range, integer division by zero), on both backends: good calls give
eager's values, a bad call after good ones raises eager's exception type with eager's message
plus the node, the op and the user's line (this file), later good calls still work, and the
compiled program really ran (no retrace, no eager fallback). Where PyTorch raises too, it raises
the same type.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.optim as optim

from .helpers import assert_tree_close, clone_tree, compiled_calls

BACKENDS = ["llvm", "interpreter"]
HERE = os.path.basename(__file__)


def _floats(*shape, seed=0):
    return kiln.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _ints(values):
    return kiln.tensor(np.array(values, dtype=np.int64))


# name: (fn, good argument sets (one per call), bad argument sets, eager's type, torch's fn or None)
def _cross_entropy(x, t):
    return F.cross_entropy(x, t)


def _cross_entropy_ignore(x, t):
    return F.cross_entropy(x, t, ignore_index=-100, reduction="sum")


def _nll_loss(x, t):
    return F.nll_loss(x, t)


def _embedding(i, w):
    return F.embedding(i, w)


def _index_select(x, i):
    return x.index_select(0, i)


def _gather(x, i):
    return x.gather(1, i)


def _scatter_add(x, i, s):
    return x.scatter_add(0, i, s)


def _scatter_value(x, i):
    return x.scatter(1, i, 2.0)


def _index_add(x, i, s):
    return x.index_add(0, i, s)


def _one_hot_nn(t):
    return F.one_hot(t, 5)


def _one_hot_ops(t):
    return kiln.frontend.ops.one_hot(t, 5)


def _take(x, i):
    return kiln.take(x, i)


def _advanced_index(x, i):
    return x[i] * 2


def _advanced_index_2d(x, i, j):
    return x[i, j]


def _setitem(x, i):
    y = x.clone()
    y[i] = 5.0
    return y


def _index_put(x, i, v):
    return x.index_put((i,), v, accumulate=True)


def _floor_divide(a, b):
    return a // b + 1


def _remainder(a, b):
    return a % b


def _div_trunc(a, b):
    return kiln.div(a, b, rounding_mode="trunc")


def _integer_pow(a, b):
    return a**b


def _binary_cross_entropy(p, t):
    return F.binary_cross_entropy(p, t)


X = _floats(4, 10)
W = _floats(6, 3)
T = _floats(4, 10).sigmoid()
CASES = {
    "cross_entropy": (_cross_entropy, [(X, _ints([1, 2, 3, 9])), (X * 2, _ints([0, 0, 5, 4]))],
                      [(X, _ints([1, -1, 3, 4])), (X, _ints([1, 2, 10, 4]))], IndexError, "cross_entropy"),
    "cross_entropy_ignore": (_cross_entropy_ignore, [(X, _ints([1, -100, 3, 9]))], [(X, _ints([-100, -2, 3, 4]))],
                             IndexError, "cross_entropy"),
    "nll_loss": (_nll_loss, [(X, _ints([1, 2, 3, 9]))], [(X, _ints([1, 2, 3, 12]))], IndexError, "nll_loss"),
    "embedding": (_embedding, [(_ints([[0, 5], [2, 2]]), W)], [(_ints([[0, -1], [2, 2]]), W), (_ints([[0, 6], [2, 2]]), W)],
                  IndexError, "embedding"),
    "index_select": (_index_select, [(X, _ints([0, 3, 3]))], [(X, _ints([0, -1, 3])), (X, _ints([4, 0, 0]))],
                     IndexError, "index_select"),
    "gather": (_gather, [(X, _ints([[0], [9], [3], [3]]))], [(X, _ints([[0], [-1], [3], [3]]))], RuntimeError,
               "gather"),
    "scatter_add": (_scatter_add, [(X, _ints([[0, 3], [1, 1]]), _floats(2, 2))],
                    [(X, _ints([[0, -1], [1, 1]]), _floats(2, 2)), (X, _ints([[0, 3], [4, 1]]), _floats(2, 2))],
                    RuntimeError, "scatter_add"),
    "scatter_value": (_scatter_value, [(X, _ints([[0], [9], [3], [3]]))], [(X, _ints([[0], [10], [3], [3]]))],
                      RuntimeError, None),
    "index_add": (_index_add, [(X, _ints([3, 0]), _floats(2, 10))], [(X, _ints([3, -1]), _floats(2, 10))],
                  RuntimeError, "index_add"),
    "one_hot_nn": (_one_hot_nn, [(_ints([0, 4, 2]),)], [(_ints([0, -1, 2]),), (_ints([0, 5, 2]),)], RuntimeError,
                   "one_hot"),
    "one_hot_ops": (_one_hot_ops, [(_ints([0, 4, 2]),)], [(_ints([0, -1, 2]),), (_ints([0, 5, 2]),)], RuntimeError,
                    None),
    "take": (_take, [(X, _ints([0, 39, -40]))], [(X, _ints([0, 40, 1])), (X, _ints([-41, 0, 1]))], IndexError,
             "take"),
    "advanced_index": (_advanced_index, [(X, _ints([0, -1, 3]))], [(X, _ints([0, 4, 3])), (X, _ints([0, -5, 3]))],
                       IndexError, "getitem"),
    "advanced_index_2d": (_advanced_index_2d, [(X, _ints([0, 3]), _ints([9, -10]))],
                          [(X, _ints([0, 3]), _ints([9, 10]))], IndexError, "getitem2"),
    "setitem": (_setitem, [(X, _ints([0, 3]))], [(X, _ints([0, 4]))], IndexError, "setitem"),
    "index_put": (_index_put, [(X, _ints([0, 3, 0]), _floats(10))], [(X, _ints([0, 4, 0]), _floats(10))],
                  IndexError, "index_put"),
    "floor_divide": (_floor_divide, [(_ints([7, -7, 3]), _ints([2, 2, -1]))], [(_ints([7, -7, 3]), _ints([2, 0, 1]))],
                     ZeroDivisionError, None),
    "remainder": (_remainder, [(_ints([7, -7, 3]), _ints([2, 2, -1]))], [(_ints([7, -7, 3]), _ints([0, 2, 1]))],
                  ZeroDivisionError, None),
    "div_trunc": (_div_trunc, [(_ints([7, -7, 3]), _ints([2, 2, -1]))], [(_ints([7, -7, 3]), _ints([2, 2, 0]))],
                  ZeroDivisionError, None),
    # numpy's error, which eager kiln raises; PyTorch gives 0 for tensor exponents (and raises for a number)
    "integer_pow": (_integer_pow, [(_ints([7, -7, 3]), _ints([2, 0, 1]))], [(_ints([7, -7, 3]), _ints([2, -1, 1]))],
                    ValueError, None),
    "binary_cross_entropy": (_binary_cross_entropy, [(T, (T > 0.5).float())], [(T * 2, (T > 0.5).float())],
                             RuntimeError, "binary_cross_entropy"),
}  # fmt: skip


def _raised(fn, args):
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001 - the test compares whatever eager raises
        return error
    raise AssertionError(f"{fn.__name__} did not raise eagerly on {args}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_calls_raise_what_eager_raises(name, backend):
    fn, good, bad, error_type, _ = CASES[name]
    compiled = kiln.compile(fn, options=kiln.CompileOptions(backend=backend, verify=True))
    plan = [good[0], bad[0], good[-1], *bad[1:], good[0], bad[0]]  # the 2nd call (the first compiled one) is bad
    for args in plan:
        eager_args, compiled_args = clone_tree(args), clone_tree(args)
        if any(args is b for b in bad):
            expected = _raised(fn, eager_args)
            assert type(expected) is error_type, f"eager raised {type(expected).__name__}: {expected}"
            with pytest.raises(error_type) as info:
                compiled(*compiled_args)
            message = str(info.value)
            assert message.startswith(str(expected)), f"{message!r} does not start with eager's {str(expected)!r}"
            assert f"{HERE}:" in message and "while running node" in message, message  # the user's line
        else:
            assert_tree_close(compiled(*compiled_args), fn(*eager_args), rtol=1e-6, atol=1e-6)
        assert_tree_close(compiled_args, eager_args, rtol=0, atol=0, path="arguments")
    assert len(compiled.state.specializations) == 1 and not [e for e in compiled.state.events if e.kind == "break"]
    good_calls = sum(not any(args is b for b in bad) for args in plan)
    assert compiled_calls(compiled) == [good_calls - 1]  # every good call after the traced one ran the program


def _torch_args(torch, args):
    return [torch.from_numpy(np.array(a.numpy())) if isinstance(a, kiln.Tensor) else a for a in args]


TORCH = {
    "cross_entropy": lambda torch, x, t: torch.nn.functional.cross_entropy(x, t),
    "nll_loss": lambda torch, x, t: torch.nn.functional.nll_loss(x, t),
    "embedding": lambda torch, i, w: torch.nn.functional.embedding(i, w),
    "index_select": lambda torch, x, i: x.index_select(0, i),  # along dim 1 PyTorch raises RuntimeError
    "gather": lambda torch, x, i: x.gather(1, i),
    "scatter_add": lambda torch, x, i, s: x.scatter_add(0, i, s),
    "index_add": lambda torch, x, i, s: x.index_add(0, i, s),
    "one_hot": lambda torch, t: torch.nn.functional.one_hot(t, 5),
    "take": lambda torch, x, i: torch.take(x, i),
    "getitem": lambda torch, x, i: x[i],
    "getitem2": lambda torch, x, i, j: x[i, j],
    "setitem": lambda torch, x, i: x.clone().__setitem__(i, 5.0),
    "index_put": lambda torch, x, i, v: x.index_put((i,), v, accumulate=True),
    "binary_cross_entropy": lambda torch, p, t: torch.nn.functional.binary_cross_entropy(p, t),
}


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[4] is not None])
def test_pytorch_raises_the_same_type(name, torch):
    fn, good, bad, error_type, key = CASES[name]
    reference = TORCH[key]
    reference(torch, *_torch_args(torch, good[0]))  # the good arguments are good for PyTorch too
    for args in bad:
        with pytest.raises(error_type):
            reference(torch, *_torch_args(torch, args))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_check_whose_result_is_unused_still_raises(backend):
    def f(x, i):
        x.index_select(0, i)  # result dropped: eager raises all the same
        return x * 2

    compiled = kiln.compile(f, options=kiln.CompileOptions(backend=backend))
    for _ in range(2):
        assert_tree_close(compiled(X, _ints([1])), X * 2, rtol=0, atol=0)
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
        compiled(X, _ints([4]))
    assert compiled.graph.op_counts().get("check") == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_call_leaves_arguments_and_captured_state_as_they_were(backend):
    counts = kiln.zeros(10)
    history = kiln.zeros(3)

    def f(x, i):
        history.add_(1.0)  # a captured tensor updated before the check: not applied when the call raises
        x.scatter_add_(0, i, kiln.ones(3))
        return x.sum()

    compiled = kiln.compile(f, options=kiln.CompileOptions(backend=backend))
    for _ in range(3):
        compiled(counts, _ints([0, 9, 9]))
    assert counts.tolist() == [3.0] + [0.0] * 8 + [6.0] and history.tolist() == [3.0] * 3
    with pytest.raises(RuntimeError, match="index -1 is out of bounds"):
        compiled(counts, _ints([0, -1, 9]))  # without the check, index -1 writes into slot 9
    assert counts.tolist() == [3.0] + [0.0] * 8 + [6.0], "the failed call changed its argument"
    assert history.tolist() == [3.0] * 3, "the failed call applied a write-back"
    compiled(counts, _ints([1, 1, 1]))
    assert counts[1].item() == 3.0 and history.tolist() == [4.0] * 3


def _training(seed=0):
    kiln.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(20, 8), nn.Flatten(), nn.Linear(16, 5))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(tokens, target):
        opt.zero_grad()
        loss = F.cross_entropy(model(tokens), target)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_step_raises_on_a_bad_target_and_keeps_its_parameters(backend):
    model, step = _training()
    eager_model, eager_step = _training()
    compiled = kiln.compile(step, options=kiln.CompileOptions(backend=backend))
    rng = np.random.default_rng(1)
    for call in range(6):
        tokens = _ints(rng.integers(0, 20, (4, 2)))
        target = _ints(rng.integers(0, 5, 4))
        if call == 4:
            target = _ints([0, 1, 5, 2])
            with pytest.raises(IndexError, match=r"Target 5 is out of bounds") as eager_info:
                eager_step(tokens, target)
            with pytest.raises(IndexError, match=rf"(?s)Target 5 is out of bounds.*{HERE}:") as info:
                compiled(tokens, target)
            assert str(info.value).startswith(str(eager_info.value))
        else:
            assert_tree_close(compiled(tokens, target), eager_step(tokens, target), rtol=1e-5, atol=1e-6)
        for p, e in zip(model.parameters(), eager_model.parameters(), strict=True):
            np.testing.assert_allclose(p.detach().numpy(), e.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert compiled_calls(compiled)[-1] >= 3
    if backend == "llvm":  # the checks come before the updates: parameters are still updated in place
        program = compiled.state.specializations[-1].program
        assert program.written_in_place()


def test_clip_grad_norm_error_if_nonfinite_is_a_check_not_a_trace_break():
    w = nn.Parameter(kiln.ones(3))

    def f(x):
        w.grad = x.clone()
        return nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)

    compiled = kiln.compile(f, fullgraph=True)
    for _ in range(3):
        assert_tree_close(compiled(kiln.tensor([3.0, 4.0, 0.0])), kiln.tensor(5.0), rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="non-finite"):
        compiled(kiln.tensor([np.inf, 0.0, 0.0]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_extern_that_raises_names_the_node_the_op_and_the_line(backend):
    def f(x, i):
        return kiln.take_flat(x, i) + 1  # no bounds check of its own: numpy's kernel raises

    compiled = kiln.compile(f, options=kiln.CompileOptions(backend=backend))
    for _ in range(3):
        compiled(X, _ints([0, 39]))
    eager = _raised(f, (X, _ints([0, 40])))
    with pytest.raises(type(eager)) as info:
        compiled(X, _ints([0, 40]))
    message = str(info.value)
    assert "= take(" in message and f"{HERE}:" in message and "in f" in message, message
    assert compiled_calls(compiled) == [2]  # the program raised: no retrace, no eager run
    assert isinstance(info.value.__cause__, IndexError)


def test_check_values_says_what_it_expected():
    with pytest.raises(TypeError, match="expected a bool tensor of conditions, got kiln.int64"):
        kiln.jit.check_values(_ints([1, 0]), IndexError, "m")
    with pytest.raises(ValueError, match=r"the conditions' shape \[1\]"):
        kiln.jit.check_values(kiln.tensor([True]), IndexError, "m", shown=_ints([1, 2]))
    with pytest.raises(
        ValueError, match="error must be one of IndexError, ValueError, RuntimeError, ZeroDivisionError"
    ):
        kiln.jit.check_values(kiln.tensor([True]), KeyError, "m")
    kiln.jit.check_values(kiln.tensor([True, True]), IndexError, "never")  # holds: nothing happens


def test_an_exported_program_keeps_its_checks_through_a_file(tmp_path):
    embedding = nn.Embedding(6, 3)
    program = kiln.export(embedding, _ints([0, 5]))
    program.save(tmp_path / "embedding.kiln")
    loaded = kiln.jit.load_exported(tmp_path / "embedding.kiln")
    with kiln.no_grad():
        assert_tree_close(loaded(_ints([2, 1])), embedding(_ints([2, 1])), rtol=0, atol=0)
    with pytest.raises(IndexError, match=rf"(?s)index out of range in self \(got 6;.*{HERE}:"):
        loaded(_ints([2, 6]))
