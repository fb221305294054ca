"""Two checked ops on one tensor (a loss's target check and a gather's or scatter_add's index
check): every compiled call raises what eager raises, the first failing check's error type and
message, never numpy's ``IndexError`` from a gather that ran before its check (kiln issue 35:
horizontal fusion moved the kernel of a check's condition after the gather it guards)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F

from .helpers import assert_tree_close, clone_tree

BACKENDS = ["llvm", "interpreter"]


def _x(seed=0):
    return kiln.tensor(np.random.default_rng(seed).standard_normal((4, 5)).astype(np.float32))


def _ints(values):
    return kiln.tensor(np.array(values, dtype=np.int64))


def _gather_then_loss(x, t, i):
    g = x.gather(1, i)
    return F.cross_entropy(x, t) + g.sum()


def _loss_then_gather(x, t, i):
    loss = F.cross_entropy(x, t)
    return loss + x.gather(1, i).sum()


def _loss_then_scatter_add(x, t, i):
    loss = F.cross_entropy(x, t)
    return loss + x.scatter_add(1, i, x[:, :1]).sum()


def _gather_by_target(x, t, i):
    g = x.gather(1, t[:, None])
    return F.cross_entropy(x * 2, t) + g.sum() + i.sum()


GOOD_T, GOOD_I = _ints([0, 1, 2, 4]), _ints([[0], [4], [1], [3]])
BAD_T, BAD_I = _ints([0, 1, 5, 4]), _ints([[0], [7], [1], [3]])
# each program's argument sets: good, a bad target, a bad index, both bad
PLANS = [(GOOD_T, GOOD_I), (BAD_T, GOOD_I), (GOOD_T, BAD_I), (GOOD_T, GOOD_I), (BAD_T, BAD_I), (GOOD_T, GOOD_I)]


def _outcome(fn, args):
    try:
        return fn(*args), None
    except (IndexError, RuntimeError) as error:
        return None, error


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_gather_then_loss, _loss_then_gather, _loss_then_scatter_add, _gather_by_target])
def test_compiled_calls_raise_the_first_failing_check_as_eager_does(fn, backend):
    compiled = kiln.compile(fn, options=kiln.CompileOptions(backend=backend, verify=True))
    failures = good = 0
    for k, (t, i) in enumerate(PLANS):
        args = (_x(k), t, i)
        expected, eager_error = _outcome(fn, clone_tree(args))
        if eager_error is None:
            good += 1
            assert_tree_close(compiled(*clone_tree(args)), expected, rtol=1e-5, atol=1e-5)
            continue
        failures += 1
        assert "out of bounds" in str(eager_error) and "axis" not in str(eager_error), eager_error  # kiln's message
        with pytest.raises(type(eager_error)) as info:
            compiled(*clone_tree(args))
        assert str(info.value).startswith(str(eager_error)), f"{info.value!s} is not eager's {eager_error!s}"
    assert failures >= 2
    assert len(compiled.state.specializations) == 1
    assert compiled.state.specializations[0].calls == good - 1, "the compiled program ran every later good call"
    assert not [e for e in compiled.state.events if e.kind == "break"]


def _mask_then_gather(x, i):
    ok = kiln.logical_and(i >= 0, i < 5)  # CSE makes it the gather check's own condition
    g = x.gather(1, i)
    return kiln.where(ok, g * 2, 0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_condition_the_program_also_reads_still_checks_first(backend):
    """The program reads the check's own condition after the gather (CSE makes the mask and the
    condition one value): where a fusion would put both in one kernel, fusion runs again with the
    condition left out of kernels (tests/passes/test_fusion_checks.py shows that step on the IR)."""
    compiled = kiln.compile(_mask_then_gather, options=kiln.CompileOptions(backend=backend, verify=True))
    good, bad = _ints([[0], [4], [1], [2]]), _ints([[0], [7], [1], [2]])
    for k, i in enumerate([good, good, bad, good, bad]):
        x = _x(k)
        expected, eager_error = _outcome(_mask_then_gather, (x, i))
        if eager_error is None:
            np.testing.assert_array_equal(compiled(x, i).numpy(), expected.numpy())
            continue
        with pytest.raises(RuntimeError) as info:
            compiled(x, i)
        assert str(info.value).startswith(str(eager_error)), info.value
    assert compiled.state.specializations[0].calls == 2
