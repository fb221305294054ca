"""``kiln.utils.data``: ``torch.utils.data``'s path to ``kiln.data``.

Every name of ``kiln.data`` is here (read through, so names added to ``kiln.data`` later appear too),
and ``kiln.utils.data.dataloader`` / ``.dataset`` / ``.sampler`` are ``kiln.data``'s own submodules,
so classes are the same objects whichever path imported them.

>>> import kiln.data
>>> from kiln.utils.data import DataLoader
>>> DataLoader is kiln.data.DataLoader
True
"""

import importlib
import sys

import kiln.data as _data

for _name in ("dataloader", "dataset", "sampler", "collate"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"kiln.data.{_name}")
    globals()[_name] = sys.modules[f"{__name__}.{_name}"]

from kiln.data import *  # noqa: E402, F403

__all__ = list(_data.__all__)


def __getattr__(name: str):
    try:
        return getattr(_data, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(_data)))
