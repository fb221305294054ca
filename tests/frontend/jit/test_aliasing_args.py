"""Arguments that share memory, compiled against eager over several calls: the values, the
arguments changed in place, and which calls ran compiled (kiln issue 35's aliasing cases).

A write into one argument must reach every argument that views the same memory, whether the
two are related by ``_base`` through a common tensor that is not an argument (``a =
base.detach()`` and ``b = a.t()``: both are views of ``base``), or not related by kiln at all
(two tensors made by ``from_numpy`` over one array). Such a call runs eagerly with the reason
said; arguments that share nothing still run compiled."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

from .helpers import compiled_calls


def _neg_slice_return_none(a, b):
    a[0:] = -a[0:]


def _neg_slice_return_b(a, b):
    a[0:] = -a[0:]
    return b * 2


def _neg_slice_read_b_first(a, b):
    c = b + 1
    a[0:] = -a[0:]
    return c


def _neg_slice_return_a(a, b):
    a[0:] = -a[0:]
    return a


def _scale_both(a, b):
    a.mul_(2)
    b.add_(1)
    return a + 0


BODIES = [_neg_slice_return_none, _neg_slice_return_b, _neg_slice_read_b_first, _neg_slice_return_a, _scale_both]


def _detached_and_its_transpose():
    base = kiln.tensor(np.arange(9.0, dtype=np.float32).reshape(3, 3) - 4)
    a = base.detach()
    return a, a.t()


def _detached_twice():
    base = kiln.tensor(np.arange(9.0, dtype=np.float32).reshape(3, 3) - 4)
    return base.detach(), base.detach().t()


def _from_one_numpy_array():
    array = np.arange(9.0, dtype=np.float32).reshape(3, 3) - 4
    return kiln.from_numpy(array), kiln.from_numpy(array.T)


MAKERS = [_detached_and_its_transpose, _detached_twice, _from_one_numpy_array]


def _values(out):
    return None if out is None else out.detach().numpy().copy()


@pytest.mark.parametrize("make", MAKERS)
@pytest.mark.parametrize("fn", BODIES)
def test_a_write_into_an_argument_reaches_the_arguments_that_view_it(fn, make):
    compiled = kiln.compile(fn)
    a, b = make()  # the compiled side's arguments, kept across calls as a training loop keeps them
    ea, eb = make()
    for call in range(4):
        out, expected = compiled(a, b), fn(ea, eb)
        np.testing.assert_array_equal(_values(out), _values(expected), err_msg=f"result of call {call}")
        np.testing.assert_array_equal(a.numpy(), ea.numpy(), err_msg=f"argument a after call {call}")
        np.testing.assert_array_equal(b.numpy(), eb.numpy(), err_msg=f"argument b after call {call}")
        if out is not None and fn is _neg_slice_return_a:
            assert out is a
    breaks = [e.detail for e in compiled.state.events if e.kind == "break"]
    assert breaks and all("shares memory with another input" in b for b in breaks), breaks


@pytest.mark.parametrize("fn", BODIES)
def test_arguments_that_share_nothing_still_run_compiled(fn):
    compiled = kiln.compile(fn)
    for _ in range(3):
        a, b = kiln.randn(3, 3), kiln.randn(3, 3)
        ea, eb = a.clone(), b.clone()
        out, expected = compiled(a, b), fn(ea, eb)
        np.testing.assert_array_equal(_values(out), _values(expected))
        np.testing.assert_array_equal(a.numpy(), ea.numpy())
    assert compiled_calls(compiled) == [2]


@pytest.mark.parametrize("fn", BODIES)
def test_a_specialization_for_separate_arguments_is_not_used_for_shared_ones(fn):
    """The guard key sees memory shared through numpy (no kiln view relation) too."""
    compiled = kiln.compile(fn)
    for _ in range(2):
        compiled(kiln.randn(3, 3), kiln.randn(3, 3))
    a, b = _from_one_numpy_array()
    ea, eb = _from_one_numpy_array()
    for call in range(3):
        out, expected = compiled(a, b), fn(ea, eb)
        np.testing.assert_array_equal(_values(out), _values(expected), err_msg=f"result of call {call}")
        np.testing.assert_array_equal(a.numpy(), ea.numpy(), err_msg=f"argument a after call {call}")


# ----------------------------------------------------------------------------- expanded arguments
def _copy_transpose_onto_itself(a):
    a.t().copy_(a.t())
    return a.sum()


def _add_to_a_column(a):
    a[:, 0].add_(1)
    return a * 2


def _fill(a):
    a.fill_(3)
    return a + 1


def _add_everywhere(a):
    a.add_(1)
    return a


def _column_of_a_born_expansion(x):
    y = x.expand(3, 3)
    y[:, 0] = 7
    return y + x


EXPANDED = [_copy_transpose_onto_itself, _add_to_a_column, _fill, _add_everywhere, _column_of_a_born_expansion]


def _outcome(fn, arg):
    try:
        out = fn(arg)
        return "ok", out.numpy().tolist()
    except RuntimeError as error:
        return "RuntimeError", str(error).split("\n")[0]


@pytest.mark.parametrize("fn", EXPANDED)
def test_expanded_arguments_as_eager(fn):
    """``a.t().copy_(a.t())`` on an expanded argument raised numpy's read-only ValueError on every
    compiled call; writes into an expanded tensor run eagerly (a scatter into one position would
    miss the others sharing its memory); writes that eager refuses raise eager's error."""
    compiled = kiln.compile(fn)
    base, ebase = kiln.arange(3.0).reshape(3, 1), kiln.arange(3.0).reshape(3, 1)
    expand = fn is not _column_of_a_born_expansion
    arg, earg = (base.expand(3, 3), ebase.expand(3, 3)) if expand else (base, ebase)
    for call in range(4):
        assert _outcome(compiled, arg) == _outcome(fn, earg), f"call {call}"
        np.testing.assert_array_equal(base.numpy(), ebase.numpy(), err_msg=f"memory after call {call}")
    if fn is _copy_transpose_onto_itself:
        assert compiled_calls(compiled) == [3]


def test_an_argument_sharing_numpy_memory_with_a_captured_tensor_is_not_run_compiled():
    """The specialization's guard on captured tensors sees memory shared through numpy too: a
    program traced for separate memory would read the captured tensor before the write."""
    array, earray = np.arange(6.0, dtype=np.float32).reshape(2, 3), np.arange(6.0, dtype=np.float32).reshape(2, 3)
    w, ew = kiln.from_numpy(array), kiln.from_numpy(earray)

    def f(x):
        x.mul_(2)
        return x + w

    def g(x):
        x.mul_(2)
        return x + ew

    compiled = kiln.compile(f)
    for _ in range(2):
        np.testing.assert_array_equal(compiled(kiln.ones(2, 3)).numpy(), g(kiln.ones(2, 3)).numpy())
    for call in range(3):
        out, expected = compiled(kiln.from_numpy(array)), g(kiln.from_numpy(earray))
        np.testing.assert_array_equal(out.numpy(), expected.numpy(), err_msg=f"result of call {call}")
        np.testing.assert_array_equal(array, earray, err_msg=f"memory after call {call}")
    assert any("shares memory with captured tensor" in e.detail for e in compiled.state.events)
