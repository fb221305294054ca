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


@pytest.fixture
def raises_as_torch(torch):
    """``check(cases)``: each case (a function of the library, ``torch`` or ``kiln``) raises in both, the
    same type of error (IndexError or RuntimeError), warnings silenced."""
    import warnings  # noqa: PLC0415

    import kiln  # noqa: PLC0415

    def check(cases) -> None:
        for case in cases:
            outcomes = []
            for lib in (torch, kiln):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        case(lib)
                        outcomes.append("no error")
                    except (IndexError, RuntimeError) as error:
                        outcomes.append(type(error).__name__)
            assert outcomes[0] == outcomes[1] != "no error", outcomes

    return check
