"""A module's state dict hooks, extra state and path accessors against torch's (``module_state.py``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln


def _net(lib):
    nn = lib.nn

    class Counter(nn.Module):  # extra state: a Python counter beside the tensors
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.count = 0

        def get_extra_state(self):
            return {"count": self.count}

        def set_extra_state(self, state):
            self.count = state["count"]

    return nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2), Counter())


def test_extra_state_is_saved_and_loaded_under_torchs_key(torch):
    for lib in (kiln, torch):
        net = _net(lib)
        net[2].count = 7
        sd = net.state_dict()
        assert list(sd) == [
            "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked",
            "2._extra_state", "2.lin.weight", "2.lin.bias",
        ]  # fmt: skip
        other = _net(lib)
        other.load_state_dict(sd)
        assert other[2].count == 7
        del sd["2._extra_state"]
        with pytest.raises(RuntimeError, match=re.escape('Missing key(s) in state_dict: "2._extra_state"')):
            other.load_state_dict(sd)
        sd["0._extra_state"] = 1  # a module without extra state
        keys = other.load_state_dict(sd, strict=False)
        assert keys.missing_keys == ["2._extra_state"] and keys.unexpected_keys == ["0._extra_state"]


def _hooked(lib):
    calls = []
    net = _net(lib)
    net.register_state_dict_pre_hook(lambda m, prefix, keep_vars: calls.append(("pre", prefix, keep_vars)))
    net[1].register_state_dict_pre_hook(lambda m, prefix, keep_vars: calls.append(("bn pre", prefix)))

    def post(module, sd, prefix, local_metadata):
        calls.append(("post", prefix, sorted(local_metadata)))
        sd[prefix + "note"] = 1.0

    net[1].register_state_dict_post_hook(post)
    sd = net.state_dict(keep_vars=True)
    calls.append(("keys", list(sd)))
    net[1].register_state_dict_post_hook(lambda m, sd, prefix, meta: sd)
    with pytest.raises(RuntimeError, match="state_dict post-hook must return None"):
        net.state_dict()
    return calls


def test_state_dict_hooks_run_as_torchs(torch):
    assert _hooked(kiln) == _hooked(torch)


def _load_with_hooks(lib):
    src, dst = _net(lib), _net(lib)
    sd = dict(src.state_dict())
    sd["0.w_old"] = sd.pop("0.weight")  # an old checkpoint's name

    def rename(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        if prefix + "w_old" in state_dict:
            state_dict[prefix + "weight"] = state_dict.pop(prefix + "w_old")

    dst[0].register_load_state_dict_pre_hook(rename)
    seen = []

    def forgive(module, keys):  # the running statistics may be missing
        seen.append((list(keys.missing_keys), list(keys.unexpected_keys)))
        keys.missing_keys[:] = [k for k in keys.missing_keys if "running" not in k]

    dst.register_load_state_dict_post_hook(forgive)
    del sd["1.running_mean"]
    result = dst.load_state_dict(sd)
    dst.register_load_state_dict_post_hook(lambda m, keys: keys)
    with pytest.raises(AssertionError, match="not expected to return new values"):
        dst.load_state_dict(sd)
    weight = dst[0].weight.detach().numpy()
    return seen, tuple(result), np.allclose(weight, src[0].weight.detach().numpy())


def test_load_state_dict_hooks_rename_and_forgive_as_torchs(torch):
    mine, theirs = _load_with_hooks(kiln), _load_with_hooks(torch)
    assert mine == theirs
    assert mine[2] and mine[1] == ([], [])


def test_missing_and_unexpected_keys_come_in_torchs_order(torch):
    results = []
    for lib in (kiln, torch):
        net = _net(lib)
        sd = dict(net.state_dict())
        for key in ("0.bias", "2.lin.weight"):
            del sd[key]
        sd.update({"2.lin.extra": 1, "9.weight": 2, "0.extra": 3, "x": 4})
        with pytest.raises(RuntimeError) as error:
            net.load_state_dict(sd)
        results.append(str(error.value).split("\n\t")[1:])
    assert results[0] == results[1]


def test_get_parameter_get_buffer_and_set_submodule_as_torchs(torch):
    for lib in (kiln, torch):
        net = _net(lib)
        assert tuple(net.get_parameter("2.lin.weight").shape) == (2, 2)
        assert tuple(net.get_buffer("1.running_var").shape) == (2,)
        with pytest.raises(AttributeError, match="`running_var` is not an nn.Parameter"):
            net.get_parameter("1.running_var")
        with pytest.raises(AttributeError, match="`weight` is not a buffer"):
            net.get_buffer("1.weight")
        with pytest.raises(AttributeError, match="Linear has no attribute `nope`"):
            net.get_parameter("0.nope")
        net.set_submodule("2.lin", lib.nn.Identity())
        assert type(net[2].lin).__name__ == "Identity"
        with pytest.raises(AttributeError, match="Counter has no attribute `other`"):
            net.set_submodule("2.other", lib.nn.Identity(), strict=True)
        with pytest.raises(ValueError, match="Cannot set the submodule without a target name"):
            net.set_submodule("", lib.nn.Identity())
        assert net.type(lib.float64)[0].weight.dtype == lib.float64


def test_a_compiled_modules_state_dict_holds_its_extra_state():
    net = _net(kiln)[2]  # the Counter: extra state of its own
    net.count = 5
    compiled = kiln.compile(net)
    assert compiled.state_dict()["_extra_state"] == {"count": 5}
    twin = kiln.compile(_net(kiln)[2])
    twin.load_state_dict(compiled.state_dict())
    assert twin._orig_mod.count == 5
