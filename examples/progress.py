"""The examples' progress bars: ``tqdm``'s where it is installed (``pip install -e ".[examples]"`` brings it)
and stderr is a terminal; the iterable itself otherwise, so printed results stay the same either way."""

from __future__ import annotations

import sys
from collections.abc import Iterable


def progress(iterable: Iterable, **options) -> Iterable:
    """``iterable`` with a progress bar on stderr (``options`` go to ``tqdm``: ``desc``, ``total``...)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, disable=not sys.stderr.isatty(), leave=False, **options)
