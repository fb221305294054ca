"""Module machinery: registration, state dicts, hooks, modes, dtypes, repr, containers, init and utils."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.nn import init, utils
from tests.conftest import assert_close


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)
        self.scale = nn.Parameter(kiln.ones(1))
        self.register_buffer("tmp", kiln.zeros(2), persistent=False)
        self.shared = self.fc  # same module twice: listed once

    def forward(self, x):
        return self.bn(self.fc(x)) * self.scale


def test_registration_and_traversal():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == ["scale", "fc.weight", "fc.bias", "bn.weight", "bn.bias"]
    assert [n for n, _ in net.named_buffers()] == ["tmp", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert [n for n, _ in net.named_children()] == ["fc", "bn"]
    assert [n for n, _ in net.named_modules()] == ["", "fc", "bn"]
    assert len(list(net.parameters(recurse=False))) == 1
    assert [n for n, _ in net.named_parameters(prefix="m")][0] == "m.scale"
    assert "tmp" not in net.state_dict()
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = net.nope
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'scale'"):
        net.scale = kiln.ones(1)


def test_parameter_basics():
    p = nn.Parameter(kiln.ones(2))
    assert p.requires_grad and p.is_leaf and isinstance(p, kiln.Tensor)
    assert repr(p) == "Parameter containing:\ntensor([1., 1.], requires_grad=True)"
    assert not nn.Parameter(kiln.ones(2), requires_grad=False).requires_grad


def test_state_dict_roundtrip_and_keep_vars():
    a, b = Net(), Net()
    sd = a.state_dict()
    assert isinstance(sd, dict) and type(sd).__name__ == "OrderedDict"
    assert not sd["fc.weight"].requires_grad
    assert a.state_dict(keep_vars=True)["fc.weight"] is a.fc.weight
    result = b.load_state_dict(sd)
    assert result.missing_keys == [] and result.unexpected_keys == []
    x = kiln.randn(4, 3)
    assert_close(b(x), a(x), rtol=0, atol=0)


def test_load_state_dict_errors():
    net = Net()
    sd = net.state_dict()
    del sd["fc.bias"]
    sd["extra"] = kiln.zeros(1)
    sd["bn.weight"] = kiln.zeros(5)
    with pytest.raises(RuntimeError) as info:
        net.load_state_dict(sd)
    msg = str(info.value)
    assert 'Missing key(s) in state_dict: "fc.bias"' in msg
    assert 'Unexpected key(s) in state_dict: "extra"' in msg
    assert "size mismatch for bn.weight" in msg
    del sd["bn.weight"]
    result = net.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["fc.bias", "bn.weight"] and result.unexpected_keys == ["extra"]


def test_hooks_and_handles():
    lin = nn.Linear(2, 2)
    calls = []
    h1 = lin.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    h2 = lin.register_forward_hook(lambda m, args, out: calls.append(out.shape) or out + 1)
    out = lin(kiln.ones(3, 2))
    assert_close(out, (lin.bias + 1).detach().expand(3, 2), rtol=0, atol=1e-6)
    assert calls == [kiln.Size([3, 2])]
    h1.remove()
    h2.remove()
    lin(kiln.ones(1, 2))
    assert len(calls) == 1


def test_train_eval_requires_grad_zero_grad():
    net = Net()
    assert net.training and net.bn.training
    net.eval()
    assert not net.training and not net.bn.training
    net.train()
    net(kiln.randn(4, 3)).sum().backward()
    assert net.fc.weight.grad is not None
    net.zero_grad(set_to_none=False)
    assert net.fc.weight.grad.abs().sum().item() == 0
    net.zero_grad()
    assert net.fc.weight.grad is None
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_to_double_keeps_parameter_objects_and_int_buffers():
    net = Net()
    w = net.fc.weight
    net.double()
    assert net.fc.weight is w and w.dtype == kiln.float64 and isinstance(w, nn.Parameter)
    assert net.bn.running_mean.dtype == kiln.float64 and net.bn.num_batches_tracked.dtype == kiln.int64
    net.to(kiln.float32)
    assert net.fc.weight.dtype == kiln.float32
    with pytest.raises(TypeError, match="floating point"):
        net.to(kiln.int64)
    visited = []
    net.apply(lambda m: visited.append(type(m).__name__))
    assert visited == ["Linear", "BatchNorm1d", "Net"]


def test_repr_matches_torch(torch):
    def build(m):
        return m.Sequential(m.Conv2d(1, 4, 3, padding=1, bias=False), m.BatchNorm2d(4), m.ReLU(), m.Dropout(0.1),
                            m.Sequential(m.Flatten(), m.Linear(16, 2)), m.GELU(approximate="tanh"),
                            m.LayerNorm(2), m.Embedding(5, 2, padding_idx=0), m.Softmax(dim=1))  # fmt: skip

    assert repr(build(nn)) == repr(build(torch.nn))


def test_containers():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(seq) == 3 and isinstance(seq[-1], nn.Linear) and len(seq[1:]) == 2
    assert [type(m).__name__ for m in seq] == ["Linear", "ReLU", "Linear"]
    seq.append(nn.Sigmoid())
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    with pytest.raises(IndexError, match="out of range"):
        seq[7]
    ml = nn.ModuleList([nn.Linear(1, 1) for _ in range(2)])
    ml.append(nn.Linear(1, 1))
    assert len(list(ml.parameters())) == 6
    md = nn.ModuleDict({"a": nn.Linear(1, 2)})
    md["b"] = nn.Tanh()
    assert list(md.keys()) == ["a", "b"] and "a" in md
    pl = nn.ParameterList([kiln.ones(2), nn.Parameter(kiln.zeros(3))])
    assert [n for n, _ in pl.named_parameters()] == ["0", "1"] and all(p.requires_grad for p in pl)


def test_init_statistics():
    w = kiln.empty(400, 300)
    init.kaiming_uniform_(w, a=0, nonlinearity="relu")
    assert abs(float(w.std()) - math.sqrt(2 / 300)) < 0.03 * math.sqrt(2 / 300)
    init.kaiming_normal_(w, mode="fan_out")
    assert abs(float(w.std()) - init.calculate_gain("leaky_relu") / math.sqrt(400)) < 0.002
    init.xavier_uniform_(w, gain=2.0)
    assert abs(float(w.std()) - 2 * math.sqrt(2 / 700)) < 0.002
    init.xavier_normal_(w)
    assert abs(float(w.std()) - math.sqrt(2 / 700)) < 0.002
    init.trunc_normal_(w, std=1.0, a=-1.0, b=1.5)
    assert float(w.min()) >= -1.0 and float(w.max()) <= 1.5
    q = kiln.empty(3, 5)
    init.orthogonal_(q)
    assert_close(q @ q.t(), np.eye(3, dtype=np.float32), rtol=0, atol=1e-5)
    assert init.calculate_gain("tanh") == 5 / 3 and init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2 / 1.04)
    assert init._calculate_fan_in_and_fan_out(kiln.empty(4, 3, 2, 2)) == (12, 16)
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(kiln.empty(3))


def test_default_init_bounds():
    lin = nn.Linear(50, 40)
    bound = 1 / math.sqrt(50)  # kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert float(lin.weight.abs().max()) <= bound and float(lin.weight.abs().max()) > 0.9 * bound
    assert float(lin.bias.abs().max()) <= bound


def test_clip_grad_norm_and_value(torch):
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(s).astype(np.float32) for s in ((3, 2), (4,))]
    kp = [nn.Parameter(kiln.zeros(*g.shape)) for g in grads]
    tp = [torch.nn.Parameter(torch.zeros(*g.shape)) for g in grads]
    for p, q, g in zip(kp, tp, grads, strict=True):
        p.grad, q.grad = kiln.from_numpy(g.copy()), torch.from_numpy(g.copy())
    for norm_type in (2.0, math.inf):
        total = utils.clip_grad_norm_(kp, 0.5, norm_type)
        expected = torch.nn.utils.clip_grad_norm_(tp, 0.5, norm_type)
        assert_close(total, expected, rtol=1e-5, atol=1e-6)
        for p, q in zip(kp, tp, strict=True):
            assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    utils.clip_grad_value_(kp, 0.1)
    assert float(kp[0].grad.abs().max()) <= np.float32(0.1)


def test_parameters_vector_roundtrip():
    lin = nn.Linear(3, 2)
    vec = utils.parameters_to_vector(lin.parameters())
    assert vec.shape == kiln.Size([8])
    utils.vector_to_parameters(kiln.arange(8.0), lin.parameters())
    assert lin.bias.tolist() == [6.0, 7.0] and isinstance(lin.weight, nn.Parameter)
    with pytest.raises(ValueError, match="vec has 9 elements"):
        utils.vector_to_parameters(kiln.arange(9.0), lin.parameters())
