"""The newer layers against torch.nn: same constructor arguments, same state_dict keys, same outputs
and gradients; and the torch.nn.modules import paths."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from tests.conftest import assert_close, to_torch
from tests.nn.modules.helpers import copy_from_torch, leaf_pair, module_pair

RTOL, ATOL = 1e-5, 1e-5
rng = np.random.default_rng(0)


def _parity(torch, name, args, kwargs, shape, *, train=True, grad=True, calls=1):
    tmod, kmod = module_pair(torch, name, *args, **kwargs)
    tmod.train(train)
    kmod.train(train)
    for _ in range(calls):
        kx, tx = leaf_pair(torch, (rng.standard_normal(shape) * 2).astype(np.float32))
        kout, tout = kmod(kx), tmod(tx)
        assert_close(kout, tout, rtol=RTOL, atol=ATOL)
        if grad:
            g = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
            (kout * kiln.from_numpy(g.copy())).sum().backward()
            (tout * to_torch(torch, g)).sum().backward()
            assert_close(kx.grad, tx.grad, rtol=RTOL, atol=ATOL)
    tparams = dict(tmod.named_parameters())
    for key, p in kmod.named_parameters():
        if grad:
            assert_close(p.grad, tparams[key].grad, rtol=RTOL, atol=ATOL)
    tstate = tmod.state_dict()
    for key, value in kmod.state_dict().items():
        assert_close(value, tstate[key], rtol=RTOL, atol=ATOL)
    assert repr(kmod) == repr(tmod)
    return kmod, tmod


ACTIVATIONS = [
    ("ReLU6", (), {}), ("Hardtanh", (-0.5, 2.0), {}), ("ELU", (), {"alpha": 0.7}), ("CELU", (), {"alpha": 1.5}),
    ("SELU", (), {}), ("GLU", (), {"dim": 1}), ("Hardswish", (), {}), ("Hardsigmoid", (), {}), ("Mish", (), {}),
    ("Softsign", (), {}), ("Softmin", (), {"dim": 1}), ("Softshrink", (0.3,), {}), ("Hardshrink", (), {}),
    ("Tanhshrink", (), {}), ("Threshold", (0.1, 20.0), {}), ("PReLU", (), {}), ("PReLU", (4,), {"init": 0.1}),
    ("LogSigmoid", (), {}), ("Softmax2d", (), {}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "args", "kwargs"), ACTIVATIONS)
def test_activation_modules_match_torch(torch, name, args, kwargs):
    _parity(torch, name, args, kwargs, (3, 4, 2, 5))


def test_rrelu_eval_matches_torch_and_train_is_random(torch):
    _parity(torch, "RReLU", (0.1, 0.3), {}, (3, 4), train=False)
    m = nn.RReLU()
    x = -kiln.ones(1000)
    slopes = (m(x) / x).numpy()
    assert slopes.min() >= 1 / 8 and slopes.max() <= 1 / 3 and slopes.std() > 0.03


@pytest.mark.parametrize("name", ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"])
@pytest.mark.parametrize(("affine", "track"), [(False, False), (True, False), (True, True), (False, True)])
def test_instance_norm_matches_torch(torch, name, affine, track):
    d = int(name[-2])
    shape = (3, 4) + (5, 3, 2)[:d]
    kmod, tmod = _parity(torch, name, (4,), {"affine": affine, "track_running_stats": track}, shape, calls=3)
    # eval: running statistics normalize when tracked
    kmod.eval()
    tmod.eval()
    x = rng.standard_normal(shape).astype(np.float32)
    assert_close(kmod(kiln.from_numpy(x.copy())), tmod(to_torch(torch, x)), rtol=RTOL, atol=ATOL)
    # unbatched input
    assert_close(kmod(kiln.from_numpy(x[0].copy())), tmod(to_torch(torch, x[0])), rtol=RTOL, atol=ATOL)


def test_instance_norm_errors():
    with pytest.raises(ValueError, match="expected 3D or 4D input"):
        nn.InstanceNorm2d(3)(kiln.ones(2, 3))
    with pytest.raises(ValueError, match="num_features"):
        nn.InstanceNorm1d(3, affine=True)(kiln.ones(2, 4, 5))


PADS = [
    ("ReflectionPad1d", (2,)), ("ReflectionPad1d", ((1, 3),)), ("ReflectionPad2d", (1,)),
    ("ReflectionPad2d", ((1, 2, 0, 3),)), ("ReflectionPad3d", (1,)), ("ReplicationPad1d", ((3, 1),)),
    ("ReplicationPad2d", (2,)), ("ReplicationPad3d", ((1, 0, 2, 1, 0, 1),)), ("ZeroPad1d", (2,)),
    ("ZeroPad2d", ((1, 2, 3, 0),)), ("ZeroPad3d", (1,)), ("ConstantPad1d", (2, 3.5)),
    ("ConstantPad2d", ((1, 0, 2, 1), -1.0)), ("ConstantPad3d", (1, 2.0)), ("CircularPad1d", (2,)),
    ("CircularPad2d", ((1, 2, 2, 0),)), ("CircularPad3d", (1,)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "args"), PADS)
@pytest.mark.parametrize("batched", [True, False])
def test_padding_modules_match_torch(torch, name, args, batched):
    d = int(name[-2])
    shape = ((2,) if batched else ()) + (3,) + (5, 4, 4)[:d]
    _parity(torch, name, args, {}, shape)


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "shape"),
    [("PixelShuffle", (2,), {}, (2, 8, 3, 4)), ("PixelUnshuffle", (2,), {}, (2, 3, 4, 6)),
     ("ChannelShuffle", (2,), {}, (2, 6, 3, 3)),
     ("Upsample", (), {"scale_factor": 2, "mode": "nearest"}, (2, 3, 4, 5)),
     ("Upsample", (), {"size": (5, 7), "mode": "bilinear", "align_corners": False}, (2, 3, 4, 5)),
     ("Upsample", (), {"scale_factor": 3, "mode": "bicubic"}, (1, 2, 3, 4)),
     ("Upsample", (), {"scale_factor": 2, "mode": "trilinear", "align_corners": True}, (1, 2, 3, 2, 4)),
     ("UpsamplingNearest2d", (), {"scale_factor": 2}, (2, 3, 4, 5)),
     ("UpsamplingBilinear2d", (), {"size": (6, 9)}, (2, 3, 4, 5)),
     ("Fold", (), {"output_size": (4, 5), "kernel_size": 2}, (2, 12, 12)),
     ("Unfold", (), {"kernel_size": 2, "stride": 1}, (2, 3, 4, 5)),
     ("Conv3d", (2, 4, 3), {"padding": 1, "stride": (1, 2, 1)}, (2, 2, 4, 5, 4)),
     ("Conv2d", (2, 3, 3), {"padding": 1, "padding_mode": "reflect"}, (2, 2, 5, 4)),
     ("Conv2d", (2, 3, (3, 2)), {"padding": (2, 1), "padding_mode": "circular"}, (2, 2, 5, 4)),
     ("Conv1d", (2, 3, 3), {"padding": 2, "padding_mode": "replicate"}, (2, 2, 6)),
     ("BatchNorm3d", (3,), {}, (2, 3, 2, 3, 2)), ("RMSNorm", ((4, 5),), {}, (2, 3, 4, 5)),
     ("RMSNorm", (5,), {"eps": 1e-3, "elementwise_affine": False}, (2, 3, 4, 5)),
     ("MaxPool3d", (2,), {}, (2, 2, 4, 4, 6)), ("AvgPool3d", (2,), {"stride": 1}, (2, 2, 3, 4, 5)),
     ("AdaptiveAvgPool3d", ((2, 1, 3),), {}, (2, 2, 4, 5, 6)),
     ("AdaptiveMaxPool2d", ((3, 2),), {}, (2, 2, 7, 5)), ("AdaptiveMaxPool1d", (4,), {}, (2, 3, 8)),
     ("LPPool2d", (2, 2), {}, (2, 2, 4, 6)), ("ConvTranspose1d", (4, 6, 3), {"stride": 2, "groups": 2}, (2, 4, 5)),
     ("ConvTranspose1d", (2, 3, 2), {"padding": 1, "dilation": 2, "bias": False}, (2, 7)),
     ("ConvTranspose3d", (4, 2, (2, 3, 2)), {"stride": (2, 1, 2), "padding": (0, 1, 1), "output_padding": (1, 0, 1),
                                            "groups": 2}, (2, 4, 3, 4, 3)),
     ("ConvTranspose3d", (2, 3, 3), {"dilation": 2}, (2, 3, 3, 3)), ("LPPool1d", (3, 2), {"stride": 1}, (2, 2, 5)),
     ("Dropout1d", (0.5,), {}, (2, 3, 4)), ("Dropout2d", (), {}, (2, 3, 4, 5)), ("Dropout3d", (), {}, (2, 3, 4, 5, 2)),
     ("AlphaDropout", (0.2,), {}, (2, 3)), ("FeatureAlphaDropout", (0.2,), {}, (2, 3, 4))],
)  # fmt: skip
def test_layers_match_torch(torch, name, args, kwargs, shape):
    # dropout layers are compared in eval mode (identity); their training statistics are tested in test_functional_more
    _parity(torch, name, args, kwargs, shape, train="ropout" not in name)


@pytest.mark.parametrize(
    ("name", "kwargs", "target"),
    [("SmoothL1Loss", {"beta": 0.5}, "real"), ("HuberLoss", {"delta": 0.5, "reduction": "sum"}, "real"),
     ("KLDivLoss", {"reduction": "batchmean"}, "prob"), ("KLDivLoss", {"log_target": True}, "real"),
     ("SoftMarginLoss", {}, "sign"), ("HingeEmbeddingLoss", {"margin": 0.5}, "sign"),
     ("PoissonNLLLoss", {"full": True}, "count"), ("MultiLabelSoftMarginLoss", {}, "binary")],
)  # fmt: skip
def test_loss_modules_match_torch(torch, name, kwargs, target):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    t = {"real": rng.standard_normal((4, 5)), "prob": rng.dirichlet(np.ones(5), size=4),
         "sign": np.sign(rng.standard_normal((4, 5))), "count": rng.integers(0, 4, (4, 5)),
         "binary": rng.integers(0, 2, (4, 5))}[target].astype(np.float32)  # fmt: skip
    kmod, tmod = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    kx, tx = leaf_pair(torch, x)
    kout, tout = kmod(kx, kiln.from_numpy(t.copy())), tmod(tx, to_torch(torch, t))
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    kout.backward()
    tout.backward()
    assert_close(kx.grad, tx.grad, rtol=RTOL, atol=ATOL)


def test_three_input_loss_modules_match_torch(torch):
    a, b, c = (rng.standard_normal((4, 5)).astype(np.float32) for _ in range(3))
    y = np.array([1, -1, 1, -1], dtype=np.float32)
    var = rng.uniform(0.5, 2, (4, 5)).astype(np.float32)
    cases = [("MarginRankingLoss", {"margin": 0.1}, (a[:, 0], b[:, 0], y)),
             ("CosineEmbeddingLoss", {"margin": 0.2}, (a, b, y)),
             ("TripletMarginLoss", {"margin": 0.5, "swap": True}, (a, b, c)),
             ("GaussianNLLLoss", {"full": True}, (a, b, var))]  # fmt: skip
    for name, kwargs, arrays in cases:
        kout = getattr(nn, name)(**kwargs)(*(kiln.from_numpy(v.copy()) for v in arrays))
        tout = getattr(torch.nn, name)(**kwargs)(*(to_torch(torch, v) for v in arrays))
        assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    kmod = nn.MultiMarginLoss(p=2, margin=0.5, weight=kiln.tensor([1.0, 2.0, 0.5, 1.0, 1.0]))
    tmod = torch.nn.MultiMarginLoss(p=2, margin=0.5, weight=torch.tensor([1.0, 2.0, 0.5, 1.0, 1.0]))
    target = np.array([0, 4, 2, 1])
    assert_close(kmod(kiln.from_numpy(a.copy()), kiln.tensor(target)), tmod(to_torch(torch, a), torch.tensor(target)),
                 rtol=RTOL, atol=ATOL)  # fmt: skip


def test_distance_modules_and_parameter_dict(torch):
    a, b = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    ka, kb, ta, tb = kiln.from_numpy(a), kiln.from_numpy(b), to_torch(torch, a), to_torch(torch, b)
    assert_close(nn.CosineSimilarity(dim=0)(ka, kb), torch.nn.CosineSimilarity(dim=0)(ta, tb), rtol=RTOL, atol=ATOL)
    assert_close(nn.PairwiseDistance(p=1.0, keepdim=True)(ka, kb), torch.nn.PairwiseDistance(p=1.0, keepdim=True)(ta, tb),
                 rtol=RTOL, atol=ATOL)  # fmt: skip
    pd = nn.ParameterDict({"w": kiln.ones(2), "b": nn.Parameter(kiln.zeros(3))})
    assert isinstance(pd["w"], nn.Parameter) and list(pd.keys()) == ["w", "b"] and len(pd) == 2
    holder = nn.Module()
    holder.params = pd
    assert [n for n, _ in holder.named_parameters()] == ["params.w", "params.b"]
    assert "b" in pd and pd.pop("b").shape == (3,)


def test_dropout_modules_train_and_errors():
    kiln.manual_seed(0)
    out = nn.Dropout2d(0.5)(kiln.ones(8, 16, 3, 3)).numpy().reshape(8, 16, 9)
    assert np.all(out.min(-1) == out.max(-1)) and 0 < (out == 0).mean() < 1
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout1d(1.5)


MODULE_PATHS = ["container", "activation", "linear", "transformer", "rnn", "conv", "batchnorm", "normalization",
                "loss", "dropout", "pooling", "sparse", "module", "instancenorm", "padding", "pixelshuffle",
                "upsampling", "distance", "fold", "flatten"]  # fmt: skip


@pytest.mark.parametrize("path", MODULE_PATHS)
def test_torch_module_paths_expose_the_same_classes(torch, path):
    tmod = importlib.import_module(f"torch.nn.modules.{path}")
    kmod = importlib.import_module(f"kiln.nn.modules.{path}")
    names = [n for n in getattr(tmod, "__all__", []) if n[0].isupper()]
    # The names kiln implements are importable from the same path, and are the classes of kiln.nn.
    present = [n for n in names if hasattr(nn, n)]
    assert present, path
    for n in present:
        assert getattr(kmod, n) is getattr(nn, n), f"kiln.nn.modules.{path}.{n}"
    if path in ("container", "activation", "transformer", "rnn", "dropout", "padding", "pixelshuffle", "upsampling",
                "distance", "fold", "flatten"):  # fmt: skip
        assert present == [n for n in names if n not in ("Container",)], set(names) - set(present)


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("mean", "2d"), ("sum", "offsets"), ("max", "offsets"), ("mean", "last_offset"), ("sum", "weights"),
     ("mean", "padding"), ("max", "padding"), ("sum", "empty_bag")],
)  # fmt: skip
def test_embedding_bag_matches_torch(torch, mode, kind):
    kwargs = {"mode": mode}
    if kind == "last_offset":
        kwargs["include_last_offset"] = True
    if kind == "padding":
        kwargs["padding_idx"] = 2
    tmod, kmod = module_pair(torch, "EmbeddingBag", 7, 3, **kwargs)
    if kind == "2d":
        idx, offsets = np.array([[1, 2, 4], [4, 3, 0]]), None
    else:
        idx = np.array([1, 2, 4, 5, 4, 3, 2, 6, 0])
        offsets = {"last_offset": np.array([0, 2, 5, 9]), "empty_bag": np.array([0, 3, 3, 7])}.get(
            kind, np.array([0, 2, 5])
        )
    args_k, args_t = [kiln.tensor(idx)], [torch.tensor(idx)]
    if offsets is not None:
        args_k.append(kiln.tensor(offsets))
        args_t.append(torch.tensor(offsets))
    if kind == "weights":
        w = rng.uniform(0.5, 2, idx.shape).astype(np.float32)
        args_k.append(kiln.from_numpy(w.copy()))
        args_t.append(to_torch(torch, w))
    kout, tout = kmod(*args_k), tmod(*args_t)
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    g = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    (kout * kiln.from_numpy(g.copy())).sum().backward()
    (tout * to_torch(torch, g)).sum().backward()
    assert_close(kmod.weight.grad, tmod.weight.grad, rtol=RTOL, atol=ATOL)
    assert repr(kmod) == repr(tmod)


def test_local_response_norm_and_sync_batchnorm_match_torch(torch):
    for size, shape in ((3, (2, 6, 5)), (4, (2, 5, 3, 4)), (2, (1, 4, 2, 3, 2))):
        _parity(torch, "LocalResponseNorm", (size,), {"alpha": 0.1, "beta": 0.6, "k": 2.0}, shape)
    kmod, _ = _parity(torch, "SyncBatchNorm", (3,), {}, (4, 3, 5), calls=2)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3)))
    assert isinstance(model[1], nn.SyncBatchNorm) and model[1].running_mean.shape == (3,)


@pytest.mark.parametrize(
    ("lazy", "regular", "args", "kwargs", "shape"),
    [("LazyLinear", "Linear", (4,), {}, (2, 5, 3)), ("LazyConv2d", "Conv2d", (4, 3), {"padding": 1}, (2, 3, 5, 5)),
     ("LazyConv1d", "Conv1d", (4, 3), {"groups": 2, "bias": False}, (2, 6, 7)),
     ("LazyConvTranspose2d", "ConvTranspose2d", (4, 3), {"stride": 2}, (2, 3, 4, 4)),
     ("LazyBatchNorm2d", "BatchNorm2d", (), {}, (4, 3, 2, 2)),
     ("LazyInstanceNorm1d", "InstanceNorm1d", (), {"affine": True, "track_running_stats": True}, (2, 3, 5))],
)  # fmt: skip
def test_lazy_modules_become_regular_and_match_torch(torch, lazy, regular, args, kwargs, shape):
    kmod = getattr(nn, lazy)(*args, **kwargs)
    assert kmod.has_uninitialized_params()
    opt = kiln.optim.SGD(kmod.parameters(), lr=0.1)  # built before the sizes are known, as PyTorch allows
    x = rng.standard_normal(shape).astype(np.float32)
    kmod(kiln.from_numpy(x.copy()))
    assert type(kmod) is getattr(nn, regular)
    channels = shape[-1] if regular == "Linear" else shape[1]
    tmod = getattr(torch.nn, regular)(*((channels, *args) if args else (channels,)), **kwargs)
    copy_from_torch(torch, tmod, kmod)
    kout, tout = kmod(kiln.from_numpy(x.copy())), tmod(to_torch(torch, x))
    assert_close(kout, tout, rtol=RTOL, atol=ATOL)
    kout.sum().backward()
    opt.step()  # the optimizer holds the materialized parameters
    assert repr(kmod) == repr(tmod)
    from kiln.nn.modules import linear

    assert linear.LazyLinear is nn.LazyLinear
