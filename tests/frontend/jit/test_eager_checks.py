"""``watched_versions``: which tensors' version counters eager autograd's backward checks
(``kiln/frontend/jit/eager_checks.py``), the rule the compiled backward's checks follow."""

from __future__ import annotations

import pathlib
import re

import pytest

import kiln
from kiln.frontend.autograd.checked import check_saved
from kiln.frontend.jit.eager_checks import watched_versions


def _checked(tensors: list, backward) -> list[bool]:
    """Per tensor of ``tensors``: whether ``backward()`` checked its version."""
    with watched_versions(tensors) as checked:
        backward()
    return [id(t._version) in checked for t in tensors]


def test_a_product_checks_what_the_gradient_reads():
    x, w = kiln.ones(3), kiln.ones(3, requires_grad=True)
    y = (x * w).sum()
    assert _checked([x, w], y.backward) == [True, False]  # w's gradient reads x; x needs none


def test_a_view_is_checked_through_its_base_counter():
    x, w = kiln.ones(4), kiln.ones(3, requires_grad=True)
    y = (x[1:] * w).sum()
    assert _checked([x], y.backward) == [True]


def test_a_copy_is_not_the_tensor_it_copies():
    x, w = kiln.ones(3), kiln.ones(3, requires_grad=True)
    y = (x.clone() * w).sum()
    assert _checked([x], y.backward) == [False]


def test_a_check_of_a_tensor_read_only_through_a_copy_counts():
    # a convolution's node: it checks its input though its gradient reads the padded copy
    x, w = kiln.ones(3), kiln.ones(3, requires_grad=True)
    y = check_saved(x.clone() * w, (x,), "ExampleBackward").sum()
    assert _checked([x], y.backward) == [True]


def test_a_saved_result_is_checked():
    w = kiln.ones(3, requires_grad=True)
    z = w.exp()
    assert _checked([z], z.sum().backward) == [True]


def test_the_counters_hold_plain_ints_again_afterwards_even_after_an_error():
    x, w = kiln.ones(3), kiln.ones(3, requires_grad=True)
    y = (x * w).sum()
    x.add_(1)  # the backward raises: x changed after it was saved
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _checked([x], y.backward)
    assert type(x._version[0]) is int and x._version[0] == 1


def test_equality_is_no_check():
    x = kiln.ones(3)
    with watched_versions([x]) as checked:
        assert x._version[0] == 0 and 0 == x._version[0]  # how the tracer binds values
    assert not checked


def test_a_watched_value_kept_after_the_block_records_nothing():
    x = kiln.ones(3)
    with watched_versions([x]) as checked:
        kept = x._version[0]  # (the tracer keeps versions in its bindings)
    assert kept != 1 and not checked


def test_every_comparison_of_a_version_by_not_equal_in_kiln_is_a_check_that_raises():
    """The watcher counts each ``!=`` on a watched version as a check (``eager_checks``'s rule), so
    kiln compares versions by ``!=`` only where it raises when they differ; anything else (a
    binding, a view's history) compares by ``==``. A ``!=`` added elsewhere fails here."""
    root = pathlib.Path(kiln.__file__).parent
    version = r"(_version\[0\]|\bcounter\[0\])"  # a tensor's version (``counter``: its ``_version``)
    compares = re.compile(rf"{version}\s*!=|!=\s*[\w.]*{version}")
    others = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            code = line.split("#")[0]
            if compares.search(code) and not any("raise" in after for after in lines[n + 1 : n + 3]):
                others.append(f"{path.relative_to(root)}:{n + 1}: {line.strip()}")
    assert others == []
