"""Which results are views: an op returns memory shared with an input exactly where PyTorch does.

A result that views its input where PyTorch returns new memory changes when the input is later
changed in place (kiln issue 35: ``F.max_pool2d(x, 1)`` returned a view of ``x``). Compared with
PyTorch, by whether each tensor result shares memory with a tensor argument:

- every primitive of the registry, on its sample arguments, through eager dispatch, against its
  ``reference`` (the PyTorch call it stands for): no view where PyTorch has new memory (a
  reference may itself be a view where the primitive's kernel copies, e.g. ``x.to(x.dtype)``);
- the public functional ops of ``kiln.nn.functional`` that take PyTorch's arguments (pooling,
  activations, normalization, dropout in eval, resizing and padding), on small hand-made inputs
  chosen to hit the shortcuts (a kernel of 1, an output size equal to the input's, nothing to pad):
  the same sharing as PyTorch's, both ways.

Plus, without PyTorch, what the sharing means: after ``x.add_(1)``, a pooled result of kernel 1
still holds the old values (hand-computed).
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.frontend.dispatch import apply
from kiln.ir.primitives import PRIMITIVES


def _tensors(out) -> list:
    if isinstance(out, tuple | list):
        return [t for item in out for t in _tensors(item)]
    return [out] if hasattr(out, "shape") and hasattr(out, "dtype") else []


def _kiln_shares(out, args) -> list[bool]:
    inputs = [a._data for a in _tensors(list(args)) if a.numel()]
    return [any(np.shares_memory(o._data, a) for a in inputs) for o in _tensors(out) if o.numel()]


def _torch_shares(out, args) -> list[bool]:
    pointers = {a.untyped_storage().data_ptr() for a in _tensors(list(args)) if a.numel()}
    return [o.untyped_storage().data_ptr() in pointers for o in _tensors(out) if o.numel()]


# ----------------------------------------------------------------------------- the registry
PRIMS = sorted((p for p in PRIMITIVES.values() if p.reference is not None), key=lambda p: p.name)


@pytest.mark.parametrize("prim", PRIMS, ids=lambda p: p.name)
def test_primitives_share_memory_where_pytorch_does(prim, torch):
    for k, sample in enumerate(prim.samples(np.random.default_rng(0))):
        arrays = [np.asarray(a) for a in sample.args]
        args = [kiln.from_numpy(a.astype(np.float32) if a.dtype.kind == "f" else a) for a in arrays]
        out = apply(prim, *args, **sample.attrs)
        targs = [torch.from_numpy(np.array(a._data)) for a in args]
        expected = prim.reference(torch, *targs, **sample.attrs)
        got, want = _kiln_shares(out, args), _torch_shares(expected, targs)
        # The reference may be a view where kiln's kernel copies (``x.to(x.dtype)`` is ``x``): only
        # a view where PyTorch has new memory is wrong.
        views = [g and not w for g, w in zip(got, want, strict=True)]
        assert not any(views), f"{prim.name} sample {k} {sample.attrs}: kiln shares {got}, PyTorch {want}"


# ----------------------------------------------------------------------------- kiln.nn.functional
def _x(lib, *shape, seed=0):
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return lib.tensor(data)


def _index(lib, values):
    return lib.tensor(np.array(values, dtype=np.int64))


# name -> [(args(lib), kwargs)]: one function of kiln.nn.functional and of torch.nn.functional
FUNCTIONAL = {
    "max_pool1d": [(lambda L: (_x(L, 1, 2, 5), 1), {}), (lambda L: (_x(L, 2, 5), 1), {}),
                   (lambda L: (_x(L, 1, 2, 5), 2), {}), (lambda L: (_x(L, 1, 2, 5), 1), {"stride": 2})],
    "max_pool2d": [(lambda L: (_x(L, 1, 2, 4, 4), 1), {}), (lambda L: (_x(L, 2, 4, 4), 1), {}),
                   (lambda L: (_x(L, 1, 2, 4, 4), 1), {"return_indices": True}), (lambda L: (_x(L, 1, 2, 4, 4), 2), {})],
    "max_pool3d": [(lambda L: (_x(L, 1, 2, 2, 3, 3), 1), {})],
    "max_pool2d_with_indices": [(lambda L: (_x(L, 1, 2, 4, 4), 1), {})],
    "avg_pool1d": [(lambda L: (_x(L, 1, 2, 5), 1), {})],
    "avg_pool2d": [(lambda L: (_x(L, 1, 2, 4, 4), 1), {}), (lambda L: (_x(L, 1, 2, 4, 4), 1), {"divisor_override": 1}),
                   (lambda L: (_x(L, 2, 4, 4), 1), {})],
    "avg_pool3d": [(lambda L: (_x(L, 1, 2, 2, 3, 3), 1), {})],
    "lp_pool1d": [(lambda L: (_x(L, 1, 2, 5), 1.0, 1), {})],
    "lp_pool2d": [(lambda L: (_x(L, 1, 2, 4, 4), 2.0, 1), {})],
    "adaptive_avg_pool1d": [(lambda L: (_x(L, 1, 2, 5), 5), {})],
    "adaptive_avg_pool2d": [(lambda L: (_x(L, 1, 2, 4, 4), 4), {}), (lambda L: (_x(L, 1, 2, 4, 4), (None, 4)), {})],
    "adaptive_avg_pool3d": [(lambda L: (_x(L, 1, 2, 2, 3, 3), (2, 3, 3)), {})],
    "adaptive_max_pool1d": [(lambda L: (_x(L, 1, 2, 5), 5), {})],
    "adaptive_max_pool2d": [(lambda L: (_x(L, 1, 2, 4, 4), 4), {}), (lambda L: (_x(L, 1, 2, 4, 4), 4), {"return_indices": True})],
    "adaptive_max_pool3d": [(lambda L: (_x(L, 1, 2, 2, 3, 3), (2, 3, 3)), {})],
    "relu": [(lambda L: (_x(L, 3, 4),), {})],
    "relu6": [(lambda L: (_x(L, 3, 4),), {})],
    "relu_": [(lambda L: (_x(L, 3, 4),), {})],
    "hardtanh": [(lambda L: (_x(L, 3, 4),), {}), (lambda L: (_x(L, 3, 4), -10.0, 10.0), {})],
    "leaky_relu": [(lambda L: (_x(L, 3, 4),), {}), (lambda L: (_x(L, 3, 4), 1.0), {})],
    "elu": [(lambda L: (_x(L, 3, 4),), {})],
    "selu": [(lambda L: (_x(L, 3, 4),), {})],
    "celu": [(lambda L: (_x(L, 3, 4),), {})],
    "gelu": [(lambda L: (_x(L, 3, 4),), {}), (lambda L: (_x(L, 3, 4),), {"approximate": "tanh"})],
    "silu": [(lambda L: (_x(L, 3, 4),), {})],
    "mish": [(lambda L: (_x(L, 3, 4),), {})],
    "softplus": [(lambda L: (_x(L, 3, 4),), {})],
    "softsign": [(lambda L: (_x(L, 3, 4),), {})],
    "tanh": [(lambda L: (_x(L, 3, 4),), {})],
    "sigmoid": [(lambda L: (_x(L, 3, 4),), {})],
    "hardsigmoid": [(lambda L: (_x(L, 3, 4),), {})],
    "hardswish": [(lambda L: (_x(L, 3, 4),), {})],
    "logsigmoid": [(lambda L: (_x(L, 3, 4),), {})],
    "tanhshrink": [(lambda L: (_x(L, 3, 4),), {})],
    "softshrink": [(lambda L: (_x(L, 3, 4),), {}), (lambda L: (_x(L, 3, 4), 0.0), {})],
    "hardshrink": [(lambda L: (_x(L, 3, 4),), {}), (lambda L: (_x(L, 3, 4), 0.0), {})],
    "threshold": [(lambda L: (_x(L, 3, 4), -100.0, 0.0), {})],
    "glu": [(lambda L: (_x(L, 3, 4),), {})],
    "softmax": [(lambda L: (_x(L, 3, 4),), {"dim": 1}), (lambda L: (_x(L, 3, 1),), {"dim": 1})],
    "log_softmax": [(lambda L: (_x(L, 3, 4),), {"dim": 1})],
    "softmin": [(lambda L: (_x(L, 3, 4),), {"dim": 1})],
    "prelu": [(lambda L: (_x(L, 3, 4), L.tensor([0.25])), {})],
    "rrelu": [(lambda L: (_x(L, 3, 4),), {"training": False})],
    "batch_norm": [(lambda L: (_x(L, 4, 3), L.zeros(3), L.ones(3)), {}),
                   (lambda L: (_x(L, 4, 3), L.zeros(3), L.ones(3)), {"training": True})],
    "layer_norm": [(lambda L: (_x(L, 3, 4), (4,)), {})],
    "group_norm": [(lambda L: (_x(L, 2, 4, 3), 2), {})],
    "instance_norm": [(lambda L: (_x(L, 2, 3, 5),), {})],
    "local_response_norm": [(lambda L: (_x(L, 2, 3, 5), 2), {})],
    "rms_norm": [(lambda L: (_x(L, 3, 4), (4,)), {})],
    "normalize": [(lambda L: (_x(L, 3, 4),), {})],
    "dropout": [(lambda L: (_x(L, 3, 4),), {"training": False}), (lambda L: (_x(L, 3, 4), 0.0), {})],
    "dropout1d": [(lambda L: (_x(L, 2, 3, 4),), {"training": False})],
    "dropout2d": [(lambda L: (_x(L, 2, 3, 4, 4),), {"training": False})],
    "dropout3d": [(lambda L: (_x(L, 2, 3, 2, 2, 2),), {"training": False})],
    "alpha_dropout": [(lambda L: (_x(L, 3, 4),), {"training": False})],
    "feature_alpha_dropout": [(lambda L: (_x(L, 2, 3, 4),), {"training": False})],
    "interpolate": [(lambda L: (_x(L, 1, 2, 4),), {"scale_factor": 1.0}), (lambda L: (_x(L, 1, 2, 4, 4),), {"size": (4, 4)}),
                    (lambda L: (_x(L, 1, 2, 4, 4),), {"size": (4, 4), "mode": "bilinear"}),
                    (lambda L: (_x(L, 1, 2, 4, 4),), {"size": (4, 4), "mode": "area"})],
    "upsample_nearest": [(lambda L: (_x(L, 1, 2, 4, 4),), {"scale_factor": 1})],
    "pad": [(lambda L: (_x(L, 2, 3), (0, 0)), {}), (lambda L: (_x(L, 2, 3), (1, 1)), {})],
    "pixel_shuffle": [(lambda L: (_x(L, 1, 4, 2, 2), 1), {})],
    "pixel_unshuffle": [(lambda L: (_x(L, 1, 1, 2, 2), 1), {})],
    "channel_shuffle": [(lambda L: (_x(L, 1, 4, 2, 2), 1), {})],
    "linear": [(lambda L: (_x(L, 3, 4), _x(L, 2, 4, seed=1)), {})],
    "one_hot": [(lambda L: (_index(L, [0, 2, 1]), 3), {})],
    "embedding": [(lambda L: (_index(L, [0, 2]), _x(L, 3, 4)), {})],
    "cosine_similarity": [(lambda L: (_x(L, 3, 4), _x(L, 3, 4, seed=1)), {})],
}  # fmt: skip
CASES = [(name, k) for name, samples in FUNCTIONAL.items() for k in range(len(samples))]


@pytest.mark.parametrize(("name", "k"), CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_functional_ops_share_memory_where_pytorch_does(name, k, torch):
    make, kwargs = FUNCTIONAL[name][k]
    args, targs = make(kiln), make(torch)
    out = getattr(F, name)(*args, **kwargs)
    expected = getattr(torch.nn.functional, name)(*targs, **kwargs)
    got, want = _kiln_shares(out, args), _torch_shares(expected, targs)
    assert got and got == want, f"{name}{kwargs}: kiln's results share memory {got}, PyTorch's {want}"


# ----------------------------------------------------------------------------- what it means
FIRST_ROW, ALL = [0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
POOLS = {
    "max_pool1d": (lambda x: F.max_pool1d(x[:, :, 0], 1), FIRST_ROW),
    "max_pool2d": (lambda x: F.max_pool2d(x, 1), ALL),
    "max_pool3d": (lambda x: F.max_pool3d(x[:, :, None], 1), ALL),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 1), ALL),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, (2, 3)), ALL),
    "interpolate": (lambda x: F.interpolate(x, scale_factor=1), ALL),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_a_pooled_result_keeps_its_values_when_the_input_changes_later(name):
    pool, expected = POOLS[name]
    x = kiln.tensor(np.arange(6.0, dtype=np.float32).reshape(1, 1, 2, 3))
    out = pool(x)
    x.add_(100)
    np.testing.assert_array_equal(out.numpy().reshape(-1), expected)
