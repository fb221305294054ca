"""``check=True`` (eager and compiled run side by side, compared) and ``KILN_JIT=0`` (plain eager)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.frontend.jit.check import CompileCheckError

from .helpers import assert_tree_close, clone_tree, compiled_calls, mean_square_step


def _mutating(x, y):
    x[:, 0] = y.sum()
    y.mul_(0.5)
    return kiln.tanh(x) @ y.reshape(4, 1), {"mean": x.mean(dim=1)}


def _rand_args():
    kiln.manual_seed(0)
    return kiln.randn(3, 4), kiln.randn(4)


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_check_passes_on_a_mutating_function(dtype):
    f = kiln.compile(_mutating, check=True)
    x, y = (a.to(dtype) for a in _rand_args())
    xe, ye = clone_tree((x, y))
    for _ in range(4):
        got, expected = f(x, y), _mutating(xe, ye)
        assert_tree_close(got, expected, rtol=1e-6, atol=1e-7)
        assert_tree_close((x, y), (xe, ye), rtol=1e-6, atol=1e-7)
    assert compiled_calls(f) == [3]


def test_check_passes_on_a_step_with_backward_and_dropout():
    kiln.manual_seed(1)
    w = kiln.randn(4, 2, requires_grad=True)

    @kiln.compile(check=True)
    def f(x):
        w.grad = None
        loss = F.dropout(x @ w, 0.5).pow(2).sum()
        loss.backward()
        return loss.detach()

    x = kiln.randn(6, 4)
    for _ in range(4):
        f(x)
    assert compiled_calls(f) == [3]  # w.grad is set before it is read: its state on entry is no guard


class Miscompiled:
    """A compiled program whose outputs ``change(i, output)`` alters: a stand-in for a code generator bug."""

    def __init__(self, program, change):
        self.program, self.change = program, change
        self.plan, self.fresh_outputs, self.kernel_calls = program.plan, program.fresh_outputs, program.kernel_calls

    def __call__(self, arrays):
        return [self.change(i, o) for i, o in enumerate(self.program(arrays))]

    run_checked_inputs = __call__


def test_check_passes_on_a_step_whose_learning_rate_changes_between_calls():
    # the optimizer's lr tensor is written before each compiled call (a prologue): check mode restored
    # the state from before it, the lr of the call before, and reported a false difference
    def make():
        kiln.manual_seed(0)
        model = kiln.nn.Linear(4, 3)
        opt = kiln.optim.AdamW(model.parameters(), lr=1e-3)
        return model, opt, mean_square_step(model, opt)

    (model, opt, step), (eager_model, eager_opt, eager_step) = make(), make()
    checked = kiln.compile(step, check=True, wait=True)
    for k in range(5):
        for o in (opt, eager_opt):
            o.param_groups[0]["lr"] = 1e-3 * (k + 1)
        x = kiln.ones(2, 4) * (k + 1)
        assert_tree_close(checked(x), eager_step(x), rtol=1e-5, atol=1e-6)
    for a, b in zip(model.parameters(), eager_model.parameters(), strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_check_detects_a_wrong_compiled_result():
    f = kiln.compile(lambda x: x * 2, check=True)
    x = kiln.ones(3)
    f(x)
    spec = f.state.specializations[0]
    spec.program = Miscompiled(spec.program, lambda i, o: o + 1)
    with pytest.raises(CompileCheckError, match="result 0"):
        f(x)


def test_check_detects_a_wrong_write_back():
    def g(x):
        x.add_(1)
        return x.sum()

    f = kiln.compile(g, check=True)
    x = kiln.zeros(3)
    f(x)
    spec = f.state.specializations[0]
    spec.program = Miscompiled(spec.program, lambda i, o: o * 3 if i == 1 else o)
    with pytest.raises(CompileCheckError, match="after the call"):
        f(x)


def test_kiln_jit_0_makes_everything_eager(monkeypatch):
    monkeypatch.setenv("KILN_JIT", "0")

    def g(x):
        x.add_(1)
        return x * float(x.sum())

    f = kiln.compile(g, fullgraph=True)  # no TraceBreakError: nothing is traced
    x, xe = kiln.ones(3), kiln.ones(3)
    for _ in range(3):
        np.testing.assert_array_equal(f(x).numpy(), g(xe).numpy())
        np.testing.assert_array_equal(x.numpy(), xe.numpy())
    assert f.state.specializations == [] and f.state.events == []


def test_kiln_jit_is_read_when_compile_is_called(monkeypatch):
    monkeypatch.setenv("KILN_JIT", "1")
    f = kiln.compile(lambda x: x + 1)
    monkeypatch.setenv("KILN_JIT", "0")
    x = kiln.ones(2)
    for _ in range(3):
        f(x)
    assert compiled_calls(f) == [2]


def test_dump_dir_writes_the_ir_before_and_after_each_pass(tmp_path):
    f = kiln.compile(lambda x: (x * 1 + 0).exp(), options=kiln.CompileOptions(dump_dir=str(tmp_path)))
    f(kiln.ones(3))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert any("traced" in name for name in files) and len(files) >= 2
    traced = next(p for p in tmp_path.iterdir() if "traced" in p.name).read_text()
    assert "exp" in traced and "graph(" in traced
