"""Shared helpers of the kiln.compile tests: clones of nested inputs, tree comparison, compiled-call counts.

Every test compares a compiled function with the *eager* run of the same function on clones of
the same inputs and state. The first call of a specialization is the traced eager run, so tests
call at least three times and check that the compiled program really ran (``calls`` grows).
"""

from __future__ import annotations

import numpy as np

import kiln


def clone_tree(obj):
    """A deep copy of a nested tuple/list/dict of tensors and plain values (tensors cloned, leaves kept)."""
    if isinstance(obj, kiln.Tensor):
        c = obj.detach().clone()
        if obj.requires_grad:
            c.requires_grad_(True)
        return c
    if isinstance(obj, tuple):
        return tuple(clone_tree(x) for x in obj)
    if isinstance(obj, list):
        return [clone_tree(x) for x in obj]
    if isinstance(obj, dict):
        return {k: clone_tree(v) for k, v in obj.items()}
    return obj


def array(t) -> np.ndarray:
    return t.detach().numpy()


def assert_tree_close(actual, expected, *, rtol: float, atol: float, path: str = "result") -> None:
    """Same structure, same plain values, tensors with the same shape and dtype and close values."""
    if isinstance(expected, kiln.Tensor):
        assert isinstance(actual, kiln.Tensor), f"{path}: expected a tensor, got {type(actual).__name__}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert tuple(actual.shape) == tuple(expected.shape), f"{path}: shape {actual.shape} != {expected.shape}"
        np.testing.assert_allclose(array(actual), array(expected), rtol=rtol, atol=atol, err_msg=path)
    elif isinstance(expected, tuple | list):
        assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_tree_close(a, e, rtol=rtol, atol=atol, path=f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and list(actual) == list(expected), f"{path}: keys differ"
        for k in expected:
            assert_tree_close(actual[k], expected[k], rtol=rtol, atol=atol, path=f"{path}[{k!r}]")
    else:
        assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != {expected!r}"


def compiled_calls(compiled) -> list[int]:
    """``calls`` of every specialization (how often each compiled program ran)."""
    return [s.calls for s in state_of(compiled).specializations]


def state_of(compiled):
    """The CompileState of a compiled function or compiled module."""
    inner = compiled.__dict__.get("_compiled", compiled)
    return inner.state


def events(compiled, kind: str | None = None) -> list:
    return [e for e in state_of(compiled).events if kind is None or e.kind == kind]


def check_against_eager(fn, make_args, *, calls: int = 3, rtol: float = 1e-6, atol: float = 1e-7, **compile_kw):
    """Compile ``fn``; call it ``calls`` times on fresh args from ``make_args()`` and compare each
    result, and the (possibly mutated) arguments, with ``fn`` run eagerly on clones.
    Returns the compiled function."""
    compiled = kiln.compile(fn, **compile_kw)
    for _ in range(calls):
        args = make_args()
        eager_args = clone_tree(args)
        expected = fn(*eager_args)
        got = compiled(*args)
        assert_tree_close(got, expected, rtol=rtol, atol=atol)
        assert_tree_close(args, eager_args, rtol=rtol, atol=atol, path="arguments after the call")
    return compiled


def mean_square_step(model, opt):
    """A training step of ``model`` by ``opt`` on the mean square of its output (the loss, detached)."""

    def step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    return step
