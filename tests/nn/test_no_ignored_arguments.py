"""No public function of ``kiln.nn.functional`` accepts an argument and ignores it (issue 38: every loss
took ``size_average=`` and ``reduce=`` and returned the mean whatever they said).

For each sample call of the functional ops (the hand-made calls of tests/test_view_semantics.py and
the losses' inputs of tests/nn/test_loss_legacy_reduction.py), every keyword the call leaves at its
default is given another value in turn -- a bool flipped, a number moved, a string from PyTorch's
choices -- and kiln's result is compared with PyTorch's under the same value. Values PyTorch
rejects are skipped; a value kiln rejects with an error is not ignored (and is counted: the test
fails if that covers more than a few). Random ops are compared only where PyTorch's result does not
change with its seed.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from tests.nn.test_loss_legacy_reduction import INPUTS
from tests.test_view_semantics import FUNCTIONAL

# Other values for string keywords, as PyTorch spells them.
CHOICES = {
    "reduction": ["sum", "none"],
    "approximate": ["tanh"],
    "mode": ["bilinear", "bicubic", "nearest-exact", "area", "linear", "reflect", "replicate", "circular"],
    "padding_mode": ["reflection", "border"],
}
# Values for keywords whose default is None, where no other value can be guessed from the default.
OF_NONE = {"size_average": [False], "reduce": [False]}
SKIPPED = {"inplace", "out", "dtype", "_stacklevel", "generator"}  # not values of the computation


def _alternatives(name: str, default) -> list:
    if name in SKIPPED:
        return []
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int):
        return [default + 1, default - 1] if default else [1, -1]
    if isinstance(default, float):
        return [default * 0.5 + 0.3]
    if isinstance(default, str):
        return [c for c in CHOICES.get(name, []) if c != default]
    return OF_NONE.get(name, []) if default is None else []


def _array(out):
    if isinstance(out, tuple | list):
        return [_array(o) for o in out]
    if hasattr(out, "detach"):
        return np.asarray(out.detach().cpu().numpy(), dtype=np.float64)
    return np.asarray(out, dtype=np.float64)


def _same(a, b) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)


def _cases():
    for name, samples in FUNCTIONAL.items():
        for make, kwargs in samples:
            yield name, make, kwargs
    for name, inputs in INPUTS.items():
        arrays = inputs()  # once: both libraries get the same numbers
        yield name, (lambda L, arrays=arrays: tuple(L.tensor(a) for a in arrays)), {}


CASES = list(_cases())


def _calls(case, torch):
    """(keyword, value, kiln's call, torch's call) for each keyword left at its default."""
    name, make, kwargs = case
    fn, tfn = getattr(F, name), getattr(torch.nn.functional, name)
    np.random.seed(0)
    kiln_args = make(kiln)
    np.random.seed(0)
    params = inspect.signature(fn).parameters
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = {p.name for p in positional[: len(kiln_args)]} | set(kwargs)
    for p in params.values():
        if p.name in given or p.default is inspect.Parameter.empty:
            continue
        for value in _alternatives(p.name, p.default):
            yield (
                p.name,
                value,
                (lambda v=value, n=p.name: fn(*make(kiln), **{**kwargs, n: v})),
                (lambda v=value, n=p.name: tfn(*make(torch), **{**kwargs, n: v})),
            )


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_keyword_changes_the_result_as_pytorchs_does(case, torch):
    rejected, compared = [], 0
    for keyword, value, ours, theirs in _calls(case, torch):
        try:
            torch.manual_seed(0)
            expected = _array(theirs())
            torch.manual_seed(1)
            if not _same(expected, _array(theirs())):
                continue  # random: PyTorch's values change with its seed
        except Exception:  # noqa: BLE001 - PyTorch rejects the value: nothing to compare
            continue
        try:
            got = _array(ours())
        except (NotImplementedError, TypeError, ValueError, RuntimeError, IndexError) as error:
            rejected.append(f"{keyword}={value!r}: {type(error).__name__}: {error}")
            continue
        compared += 1
        assert _same(got, expected), f"{case[0]}({keyword}={value!r}) differs from PyTorch's: ignored or wrong"
    assert len(rejected) <= 2, f"{case[0]} rejects values PyTorch takes: {rejected}"
