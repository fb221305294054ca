"""optim.swa_utils against torch's: averaged weights (SWA, EMA, avg_fn, use_buffers), SWALR's lr sequence,
update_bn's statistics."""

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.optim import swa_utils
from tests.conftest import assert_close
from tests.nn.modules.helpers import copy_from_torch


def _pair(torch):
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    kmodel = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    copy_from_torch(torch, tmodel, kmodel)
    return tmodel, kmodel


@pytest.mark.parametrize("how", ["swa", "ema", "avg_fn", "buffers"])
def test_averaged_model_matches_torch(torch, how):
    tmodel, kmodel = _pair(torch)

    def build(lib, module, model):
        su = module.optim.swa_utils
        kwargs = {"swa": {}, "ema": {"multi_avg_fn": su.get_ema_multi_avg_fn(0.8)},
                  "avg_fn": {"avg_fn": su.get_ema_avg_fn(0.7)}, "buffers": {"use_buffers": True}}[how]  # fmt: skip
        return su.AveragedModel(model, **kwargs)

    kavg, tavg = build(kiln, kiln, kmodel), build(torch, torch, tmodel)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x = rng.standard_normal((5, 3)).astype(np.float32)
        kmodel(kiln.tensor(x))  # moves the BatchNorm statistics
        tmodel(torch.tensor(x))
        with kiln.no_grad():
            for p in kmodel.parameters():
                p.add_(0.1)
        with torch.no_grad():
            for p in tmodel.parameters():
                p.add_(0.1)
        kavg.update_parameters(kmodel)
        tavg.update_parameters(tmodel)
    tstate = tavg.state_dict()
    for key, value in kavg.state_dict().items():
        assert_close(value, tstate[key], rtol=1e-5, atol=1e-6)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    kavg.eval()
    tavg.eval()
    assert_close(kavg(kiln.tensor(x)), tavg(torch.tensor(x)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("kwargs", "steps"), [({"swa_lr": 0.05}, 15), ({"swa_lr": 0.2, "anneal_epochs": 4,
                                                "anneal_strategy": "linear"}, 8), ({"swa_lr": 0.01, "anneal_epochs": 0}, 4)])  # fmt: skip
def test_swalr_matches_torch(torch, kwargs, steps):
    def run(lib):
        w = lib.zeros(2, requires_grad=True)
        opt = lib.optim.SGD([w], lr=0.5)
        sched = lib.optim.swa_utils.SWALR(opt, **kwargs)
        out = [opt.param_groups[0]["lr"]]
        for _ in range(steps):
            opt.step()
            sched.step()
            out.append(opt.param_groups[0]["lr"])
        return out

    np.testing.assert_allclose(run(kiln), run(torch), rtol=1e-9, atol=1e-12)


def test_update_bn_matches_torch(torch):
    tmodel, kmodel = _pair(torch)
    data = [np.random.default_rng(i).standard_normal((6, 3)).astype(np.float32) * (i + 1) for i in range(3)]
    kmodel.eval()
    swa_utils.update_bn([(kiln.tensor(d), 0) for d in data], kmodel)
    torch.optim.swa_utils.update_bn([(torch.tensor(d), 0) for d in data], tmodel)
    assert not kmodel.training and kmodel[1].momentum == 0.1
    for key, value in kmodel.state_dict().items():
        assert_close(value, tmodel.state_dict()[key], rtol=1e-5, atol=1e-6)
