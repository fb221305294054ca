"""Training steps of the kinds the PyTorch paper measured (its section 6), at sizes for 2 cores.

- ``resnet18``: ResNet-18 on a batch of 32 CIFAR-shaped 3x32x32 images, 10 classes, SGD with
  momentum 0.9 and weight decay 5e-4 (the classic CIFAR recipe), cross-entropy, BatchNorm in
  training mode (running statistics updated every step);
- ``lstm``: a 2-layer LSTM language model, hidden 256, batch 32 of 35-token windows (the PTB
  recipe's window), vocabulary 10,000, Adam;
- ``ncf``: NeuMF on MovieLens-1M's sizes (6,040 users, 3,706 items), 32 GMF factors, MLP
  128-64-32, batch 1,024 (user, item, clicked) triples, binary cross-entropy on logits, Adam.

One step is forward, loss, backward, ``optimizer.step()``, ``zero_grad()``, compiled whole for
"kiln". The references are PyTorch eager with its fastest optimizer variants (fused and foreach)
and ``torch.compile`` of the same step. Every implementation starts from the same weights and
batch; kiln's compiled losses are checked against PyTorch eager's over several steps first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import kiln

from . import models
from .common import (
    FASTEST_TORCH,
    KILN,
    Result,
    Target,
    close,
    kiln_compile,
    optional_import,
    side_by_side,
    torch_compile_or_why,
)

RESNET = "ResNet-18 train step, CIFAR 3x32x32, B=32, SGD momentum"
LSTM = "LSTM LM 2x256 train step, B=32 T=35 V=10K, Adam"
NCF = "NCF (NeuMF) train step, B=1024, Adam"
KILN_EAGER, TORCH_FUSED, TORCH_FOREACH = "kiln eager", "torch fused", "torch foreach"
# (rtol, atol): kiln compiled vs torch eager over CHECK_STEPS steps. The first losses agree to 1e-6;
# training on one fixed batch then amplifies float32 rounding (ResNet-18: 3e-4 relative by step 4,
# kiln eager drifting from torch as much as kiln compiled does).
LOSS_TOL = (1e-3, 1e-5)
CHECK_STEPS = 4
UNCHECKED = "unchecked: the reference is PyTorch, which is not installed"

TARGETS = [
    Target("resnet18", RESNET, FASTEST_TORCH, max_ratio=1.0),
    Target("lstm", LSTM, FASTEST_TORCH, max_ratio=1.0),
    Target("ncf", NCF, FASTEST_TORCH, max_ratio=1.0),
]


@dataclass(frozen=True)
class Workload:
    """A training step written once against ``lib`` (kiln or torch)."""

    name: str
    case: str
    build: Callable  # build(lib, quick) -> model
    batch: Callable  # batch(quick) -> tuple of numpy arrays: inputs..., target
    loss: Callable  # loss(lib, model, *batch tensors) -> scalar loss
    optimizer: Callable  # optimizer(lib, parameters, **variant) -> optimizer
    params: Callable  # params(quick) -> the sizes reported with the result


def _resnet_batch(quick: bool):
    rng = np.random.default_rng(0)
    n = 4 if quick else 32
    return rng.standard_normal((n, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, n)


def _lstm_sizes(quick: bool) -> dict:
    return {"vocab": 1000 if quick else 10_000, "hidden": 64 if quick else 256, "layers": 2}


def _lstm_batch(quick: bool):
    rng = np.random.default_rng(0)
    batch, steps = (4, 8) if quick else (32, 35)
    vocab = _lstm_sizes(quick)["vocab"]
    tokens = rng.integers(0, vocab, (batch, steps + 1))
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


def _lstm_loss(lib, model, idx, targets):
    logits = model(idx)
    return lib.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


NCF_SIZES = {"users": 6040, "items": 3706, "factors": 32, "mlp": (128, 64, 32)}


def _ncf_batch(quick: bool):
    rng = np.random.default_rng(0)
    n = 64 if quick else 1024
    users = rng.integers(0, NCF_SIZES["users"], n)
    items = rng.integers(0, NCF_SIZES["items"], n)
    return users, items, rng.integers(0, 2, n).astype(np.float32)


def _ncf_loss(lib, model, users, items, clicked):
    return lib.nn.functional.binary_cross_entropy_with_logits(model(users, items), clicked)


def _classify(lib, model, x, y):
    return lib.nn.functional.cross_entropy(model(x), y)


WORKLOADS = {
    "resnet18": Workload(
        "resnet18",
        RESNET,
        lambda lib, quick: models.resnet18(lib),
        _resnet_batch,
        _classify,
        lambda lib, params, **variant: lib.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4, **variant),
        lambda quick: {"batch": len(_resnet_batch(quick)[1]), "optimizer": "SGD momentum 0.9, wd 5e-4"},
    ),
    "lstm": Workload(
        "lstm",
        LSTM,
        lambda lib, quick: models.lstm_lm(lib, **_lstm_sizes(quick)),
        _lstm_batch,
        _lstm_loss,
        lambda lib, params, **variant: lib.optim.Adam(params, lr=1e-3, **variant),
        lambda quick: {"batch, steps": _lstm_batch(quick)[0].shape, **_lstm_sizes(quick), "optimizer": "Adam"},
    ),
    "ncf": Workload(
        "ncf",
        NCF,
        lambda lib, quick: models.ncf(lib, **NCF_SIZES),
        _ncf_batch,
        _ncf_loss,
        lambda lib, params, **variant: lib.optim.Adam(params, lr=1e-3, **variant),
        lambda quick: {"batch": len(_ncf_batch(quick)[0]), **NCF_SIZES, "optimizer": "Adam"},
    ),
}


def make_step(lib, w: Workload, quick: bool, reference=None, torch=None, **variant):
    """(step, model): a fresh model of ``w`` in ``lib`` -- seeded for kiln, or with ``reference``'s
    weights for torch -- and a no-argument training step over the fixed batch."""
    if lib is kiln:
        kiln.manual_seed(0)
    model = w.build(lib, quick)
    if reference is not None:
        models.same_weights(reference, model, torch)
    batch = [lib.from_numpy(np.ascontiguousarray(a).copy()) for a in w.batch(quick)]
    optimizer = w.optimizer(lib, model.parameters(), **variant)

    def step():
        loss = w.loss(lib, model, *batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return step, model


def kiln_step(w: Workload, quick: bool, compiled: bool = True):
    step, model = make_step(kiln, w, quick)
    return (kiln_compile(step) if compiled else step), model


def torch_step(torch, w: Workload, quick: bool, compiled: bool = False, **variant):
    _, reference = make_step(kiln, w, quick)
    step, _ = make_step(torch, w, quick, reference=reference, torch=torch, **variant)
    return torch.compile(step) if compiled else step


def _verify(w: Workload, quick: bool, torch) -> Callable[[Callable], str]:
    """Losses of a fresh compiled kiln step and PyTorch eager's over CHECK_STEPS steps agree."""

    def verify(_call) -> str:
        if torch is None:
            return UNCHECKED
        ours_step, _ = kiln_step(w, quick)
        theirs_step = torch_step(torch, w, quick)
        ours = [float(ours_step().numpy()) for _ in range(CHECK_STEPS)]
        theirs = [float(theirs_step().numpy()) for _ in range(CHECK_STEPS)]
        return close(ours, theirs, rtol=LOSS_TOL[0], atol=LOSS_TOL[1]) + " on losses"

    return verify


def run_workload(name: str, quick: bool = False) -> list[Result]:
    w = WORKLOADS[name]
    torch = optional_import("torch")
    builders: dict[str, Callable | str] = {
        KILN: lambda: kiln_step(w, quick)[0],
        KILN_EAGER: lambda: kiln_step(w, quick, compiled=False)[0],
    }
    if torch is None:
        builders[TORCH_FUSED] = builders[TORCH_FOREACH] = builders["torch.compile"] = "torch is not installed"
    else:
        builders[TORCH_FUSED] = lambda: torch_step(torch, w, quick, fused=True)
        builders[TORCH_FOREACH] = lambda: torch_step(torch, w, quick, foreach=True)
        builders["torch.compile"] = torch_compile_or_why(torch) or (lambda: torch_step(torch, w, quick, compiled=True))
    return side_by_side(
        name,
        w.case,
        builders,
        quick=quick,
        verify=_verify(w, quick, torch),
        params={**w.params(quick), "dtype": "float32"},
        notes=lambda impl, t: f"{1e9 / t.median_ns:.1f} steps/s",
    )


def run_resnet18(quick: bool = False) -> list[Result]:
    return run_workload("resnet18", quick)


def run_lstm(quick: bool = False) -> list[Result]:
    return run_workload("lstm", quick)


def run_ncf(quick: bool = False) -> list[Result]:
    return run_workload("ncf", quick)
