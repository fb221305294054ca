"""Python attributes set on tensors (``p._no_weight_decay = True``), as PyTorch's tensors have them:
kept by pickling and ``copy.deepcopy``, not by ``detach()`` or views, and guarded by compiled calls
that read them (a changed ``w.scale`` between calls is a new trace, never the old value replayed)."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest

import kiln
from kiln import nn


def test_set_get_and_vars():
    t = kiln.ones(2)
    assert vars(t) == {}
    t.scale = 2.0
    t.tags = ["a"]
    assert t.scale == 2.0 and t.tags == ["a"] and vars(t) == {"scale": 2.0, "tags": ["a"]}
    assert hasattr(t, "scale") and not hasattr(kiln.ones(2), "scale")
    del t.scale
    assert not hasattr(t, "scale")
    with pytest.raises(AttributeError):
        t.missing  # noqa: B018


def test_parameter_attributes():
    w = kiln.ones(2)
    w.tag = 1
    p = nn.Parameter(w)
    assert vars(p) == {}  # the data's attributes stay its own (PyTorch's Parameter(w) too)
    p._no_weight_decay = True
    assert p._no_weight_decay is True and vars(w) == {"tag": 1}
    linear = nn.Linear(2, 2)
    linear.weight.is_embedding = True
    assert [n for n, q in linear.named_parameters() if getattr(q, "is_embedding", False)] == ["weight"]


def test_new_tensors_start_without_attributes():
    t = kiln.ones(2, 2)
    t.scale = 3.0
    for other in (t.detach(), t.view(4), t[0], t.clone(), t + 1, t.data):
        assert vars(other) == {}


def test_copies_and_pickles_keep_them():
    t = kiln.tensor([1.0, 2.0])
    t.scale, t.names = 2.0, ["x", "y"]
    deep = copy.deepcopy(t)
    assert vars(deep) == vars(t) and deep.names is not t.names  # deep: the list copied too
    assert vars(copy.copy(t)) == vars(t)
    loaded = pickle.loads(pickle.dumps(t))
    assert vars(loaded) == vars(t) and loaded.tolist() == [1.0, 2.0]
    assert vars(pickle.loads(pickle.dumps(kiln.ones(1)))) == {}


def test_parameter_pickle_keeps_deepcopy_drops():
    p = nn.Parameter(kiln.ones(2))
    p._no_weight_decay = True
    loaded = pickle.loads(pickle.dumps(p))
    assert isinstance(loaded, nn.Parameter) and vars(loaded) == {"_no_weight_decay": True}
    assert vars(copy.deepcopy(p)) == {}  # PyTorch's Parameter.__deepcopy__ drops them too


def test_save_and_load_keep_them():
    """As ``torch.save``/``torch.load`` (weights_only too): plain attributes come back; an object of the
    user's class is a pickled part, refused under weights_only=True like any other."""
    t = kiln.ones(2)
    t.scale, t.names, t.me = 2.0, ["x", (1, 2)], t
    p = nn.Parameter(kiln.zeros(3))
    p._no_weight_decay = True
    buffer = io.BytesIO()
    kiln.save({"t": t, "p": p, "tied": t, "plain": kiln.ones(1)}, buffer)
    buffer.seek(0)
    loaded = kiln.load(buffer)
    assert loaded["t"].scale == 2.0 and loaded["t"].names == ["x", (1, 2)] and loaded["t"].me is loaded["t"]
    assert loaded["tied"] is loaded["t"] and vars(loaded["plain"]) == {}
    assert isinstance(loaded["p"], nn.Parameter) and vars(loaded["p"]) == {"_no_weight_decay": True}
    t.owner = _Scaled  # a class: pickled
    buffer = io.BytesIO()
    kiln.save(t, buffer)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        kiln.load(buffer)
    buffer.seek(0)
    assert kiln.load(buffer, weights_only=False).owner is _Scaled


def test_torch_checkpoints_bring_them(torch):
    """torch.save writes a tagged tensor with ``_rebuild_from_type_v2`` and a tagged Parameter with its state:
    kiln.load (weights_only too) gives the attributes back, as torch.load does."""
    w = torch.ones(2)
    w.scale, w.names = 2.0, ["x"]
    p = torch.nn.Parameter(torch.zeros(3))
    p._no_weight_decay = True
    buffer = io.BytesIO()
    torch.save({"w": w, "p": p, "plain": torch.ones(1)}, buffer)
    for weights_only in (True, False):
        buffer.seek(0)
        loaded = kiln.load(buffer, weights_only=weights_only)
        assert vars(loaded["w"]) == {"scale": 2.0, "names": ["x"]} and loaded["w"].tolist() == [1.0, 1.0]
        assert isinstance(loaded["p"], nn.Parameter) and vars(loaded["p"]) == {"_no_weight_decay": True}
        assert vars(loaded["plain"]) == {}
    buffer.seek(0)
    assert kiln.serialization.get_unsafe_globals_in_checkpoint(buffer) == []


def test_matches_torch(torch):
    def run(lib):
        t = lib.ones(2)
        t.scale = 2.0
        p = lib.nn.Parameter(lib.ones(2))
        p.flag = True
        return [
            vars(copy.deepcopy(t)), vars(copy.copy(t)), vars(pickle.loads(pickle.dumps(t))), vars(t.detach()),
            vars(t.view(2)), vars(p), vars(copy.deepcopy(p)), vars(pickle.loads(pickle.dumps(p))),
            vars(lib.nn.Parameter(t)), vars(_saved_and_loaded(lib, {"t": t})["t"]),
        ]  # fmt: skip

    assert run(kiln) == run(torch)


def _saved_and_loaded(lib, obj):
    buffer = io.BytesIO()
    lib.save(obj, buffer)
    buffer.seek(0)
    return lib.load(buffer)


# ----------------------------------------------------------------------------- compiled calls
W = kiln.ones(3)  # (its ``scale`` is set by the test: on main, setting it raises)


def _scaled_by_global(x):
    return x * W.scale


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(kiln.ones(3))
        self.p.scale = 1.0

    def forward(self, x):
        return x * self.p.scale + self.p


def _scaled_by_argument(x, t):
    return x * t.scale


def test_compiled_calls_follow_a_changed_attribute():
    """On main the attributes cannot even be set (``AttributeError``); with them, a compiled call that
    read ``w.scale`` must give eager's value after the caller changes it (a new trace)."""
    x = kiln.tensor([1.0, 2.0, 3.0])
    module = _Scaled()
    t = kiln.ones(3)
    t.scale = W.scale = 1.0
    compiled = [kiln.compile(_scaled_by_global), kiln.compile(module), kiln.compile(_scaled_by_argument)]
    for i in range(4):
        scale = [0.5, 2.0, 2.0, -3.0][i]
        W.scale = module.p.scale = t.scale = scale
        eager = [_scaled_by_global(x), module(x), _scaled_by_argument(x, t)]
        results = [compiled[0](x), compiled[1](x), compiled[2](x, t)]
        for got, want in zip(results, eager, strict=True):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-6, atol=1e-7)
    assert "made because W.scale changed: 0.5 -> 2.0" in str(kiln.explain(compiled[0]))  # the reason names it


class _Buffered(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", kiln.ones(3))
        self.b.scale = 1.0

    def forward(self, x):
        return x * self.b.scale


def test_compiled_calls_follow_a_buffers_attribute():
    module = _Buffered()
    compiled, x = kiln.compile(module), kiln.tensor([1.0, 2.0, 3.0])
    for scale in (1.0, 2.0, 2.0, 3.0):
        module.b.scale = scale
        np.testing.assert_allclose(compiled(x).numpy(), module(x).numpy(), rtol=1e-6, atol=1e-7)


COUNTED = kiln.ones(3)


def _counts_calls(x):
    COUNTED.calls = getattr(COUNTED, "calls", 0) + 1  # a new attribute, set by the call itself
    return x * COUNTED.calls


def test_an_attribute_stored_by_the_call_is_not_replayed():
    """A store into a captured tensor's attributes is Python state the call changes: the call runs
    eagerly (said with a CompileWarning), never a program that replays the first call's value."""
    compiled, x = kiln.compile(_counts_calls), kiln.ones(2)
    with pytest.warns(kiln.CompileWarning, match="COUNTED.calls"):
        for i in range(1, 5):
            assert compiled(x).tolist() == [float(i)] * 2 and COUNTED.calls == i
