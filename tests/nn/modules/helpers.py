"""Shared by the Module parity tests: the same weights in a torch and a kiln module."""

from __future__ import annotations

import kiln
import kiln.nn as nn
from tests.conftest import to_torch


def copy_from_torch(torch, tmod, kmod) -> None:
    """Check that both state dicts have the same keys, shapes and dtypes, then load torch's into kiln's."""
    tsd, ksd = tmod.state_dict(), kmod.state_dict()
    assert list(ksd) == list(tsd), "state_dict keys differ from torch's"
    for key, value in tsd.items():
        assert tuple(ksd[key].shape) == tuple(value.shape), key
        assert str(ksd[key].dtype).split(".")[-1] == str(value.dtype).split(".")[-1], key
    kmod.load_state_dict({k: kiln.from_numpy(v.detach().numpy().copy()) for k, v in tsd.items()})


def module_pair(torch, name: str, *args, **kwargs):
    """``torch.nn.<name>`` and ``kiln.nn.<name>`` built with the same arguments and holding the same weights."""
    tmod, kmod = getattr(torch.nn, name)(*args, **kwargs), getattr(nn, name)(*args, **kwargs)
    copy_from_torch(torch, tmod, kmod)
    return tmod, kmod


def leaf_pair(torch, array):
    """The same values as a kiln and a torch leaf that require grad."""
    return kiln.from_numpy(array.copy()).requires_grad_(), to_torch(torch, array).requires_grad_()
