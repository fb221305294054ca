"""Fixtures of the frontend tests."""

from __future__ import annotations

import pytest

from kiln.frontend import eager_composites, eager_kernels


@pytest.fixture
def on(monkeypatch):
    """Eager kernels on (the suite runs with them off), compiling in the background, with an empty
    cache, small batch_norm calls compiled too (these tests' sizes); off again afterwards."""
    monkeypatch.setattr(eager_kernels.CACHE, "synchronous", False)
    monkeypatch.setitem(eager_composites.EAGER_BELOW, "batch_norm", eager_composites.MIN_BYTES)
    eager_kernels.CACHE.clear()
    eager_kernels.set_enabled(True)
    yield eager_kernels
    eager_kernels.set_enabled(False)
    eager_kernels.CACHE.clear()
