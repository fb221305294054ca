"""Parity helpers: run a kiln function and its PyTorch twin on the same data, compare values and grads."""

from __future__ import annotations

import numpy as np

import kiln
from tests.conftest import assert_close


def pair(torch, array, requires_grad: bool = False, dtype=np.float64):
    """The same values as a kiln tensor and a torch tensor (floats cast to ``dtype``)."""
    array = np.asarray(array)
    if array.dtype.kind == "f":
        array = array.astype(dtype)
    k = kiln.from_numpy(array.copy())
    t = torch.from_numpy(array.copy())
    if requires_grad:
        k.requires_grad_(True)
        t.requires_grad_(True)
    return k, t


def check_parity(torch, kfn, tfn, arrays, grad=(), *, rtol=1e-10, atol=1e-12, dtype=np.float64, seed=0):
    """Compare ``kfn(*kiln_args)`` with ``tfn(*torch_args)``; then the gradients of the inputs in ``grad``.

    ``arrays`` are numpy arrays (or None, passed through); ``grad`` lists the positions whose
    gradients are compared after backpropagating the same random upstream gradient.
    """
    ks, ts = [], []
    for i, a in enumerate(arrays):
        if a is None:
            ks.append(None)
            ts.append(None)
            continue
        k, t = pair(torch, a, i in grad, dtype)
        ks.append(k)
        ts.append(t)
    kout, tout = kfn(*ks), tfn(*ts)
    assert_close(kout, tout, rtol=rtol, atol=atol)
    if grad:
        upstream = np.random.default_rng(seed).normal(size=tuple(tout.shape)).astype(dtype)
        kout.backward(kiln.from_numpy(upstream))
        tout.backward(torch.from_numpy(upstream))
        for i in grad:
            assert ks[i].grad is not None, f"no gradient for input {i}"
            assert_close(ks[i].grad, ts[i].grad, rtol=rtol, atol=atol)
    return kout


def leaves(*arrays, dtype=np.float64):
    """kiln leaf tensors requiring grad (for gradcheck)."""
    return [kiln.from_numpy(np.asarray(a, dtype=dtype).copy()).requires_grad_() for a in arrays]


def cell_loop_calls(step, parameters, compiled: bool, calls: int = 3) -> tuple:
    """``step(xs, h)`` (a cell looped over the 4 steps of ``xs``, (4, 2, 3); ``h`` (2, 4)), compiled or
    not, called ``calls`` times on seeded leaves: (the function called, per call its result, the
    leaves' gradients and ``parameters``' values after it) -- the same seeds compiled and eager."""
    fn = kiln.compile(step) if compiled else step
    rng = np.random.default_rng(4)
    seen = []
    for _ in range(calls):
        xs = kiln.from_numpy(rng.standard_normal((4, 2, 3))).requires_grad_()
        h = kiln.from_numpy(rng.standard_normal((2, 4))).requires_grad_()
        seen.append([fn(xs, h), xs.grad, h.grad, *(p.detach().clone() for p in parameters)])
    return fn, seen
