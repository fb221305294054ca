"""Whole training steps and an optimizer step, compiled: MLP, LeNet-5, a small GPT, Adam alone.

- ``mlp``: MLP 784-512-512-10, batch 128, Adam (lr 1e-3), cross-entropy; one step is forward,
  backward, ``optimizer.step()``, ``zero_grad()``, all inside the compiled function;
- ``lenet``: LeNet-5 on a batch of 64 MNIST-shaped 1x28x28 inputs, the same step;
- ``gpt``: forward and backward (gradients reset to None first) of a GPT with 2 blocks, d=256,
  4 heads, context T=128, batch 8, vocabulary 512 (see ``benchmarks/models.py``);
- ``adam``: one ``Adam.step()`` over 100 float32 parameters of 64K elements with fixed gradients.

The references are PyTorch eager ("torch fused": ``Adam(fused=True)``; "torch foreach";
"torch for-loop": ``foreach=False``), ``torch.compile`` of the same step, and ``jax.jit`` for the
MLP; "kiln eager" is the uncompiled kiln step. Every implementation starts from the same weights
and batch; kiln's compiled step is checked against PyTorch's (losses over several steps, or
gradients, or parameters) before anything is timed.
"""

from __future__ import annotations

from collections.abc import Callable

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
    merge_checks,
    optional_import,
    side_by_side,
    torch_compile_or_why,
)

MLP = "MLP 784-512-512-10 train step, B=128, Adam"
LENET = "LeNet-5 train step, B=64, Adam"
GPT = "GPT 2 blocks d=256 h=4 T=128 B=8, fwd+bwd"
ADAM = "Adam step, 100 x 64K f32 params"
KILN_EAGER = "kiln eager"
TORCH_FUSED, TORCH_FOREACH, TORCH_LOOP = "torch fused", "torch foreach", "torch for-loop"
LOSS_TOL = (1e-4, 1e-5)  # (rtol, atol) on losses, kiln compiled vs torch eager
GRAD_RTOL = 1e-3  # gradients: |err| <= GRAD_RTOL * (|expected| + max |expected|)
PARAM_TOL = (1e-5, 1e-6)  # parameters after Adam steps
CHECK_STEPS = 3
UNCHECKED = "unchecked: the reference is PyTorch, which is not installed"
GPT_CONFIG = {"vocab": 512, "d": 256, "heads": 4, "layers": 2}
GPT_SIZES = {False: (8, 128), True: (2, 32)}  # (batch, T) by `quick`
ADAM_SIZES = {False: (100, 65536), True: (10, 65536)}  # (parameters, elements each) by `quick`

TARGETS = [
    Target("mlp", MLP, FASTEST_TORCH, max_ratio=1.0),
    Target("lenet", LENET, FASTEST_TORCH, max_ratio=1.0),
    Target("gpt", GPT, "torch", max_ratio=1.0),
    Target("adam", ADAM, FASTEST_TORCH, max_ratio=1.0),
]


def _steps_per_s(impl, t) -> str:
    return f"{1e9 / t.median_ns:.0f} steps/s"


# ----------------------------------------------------------------------------- MLP and LeNet
def _classifier_data(kind: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    shape = (128, 784) if kind == "mlp" else (64, 1, 28, 28)
    return rng.standard_normal(shape, dtype=np.float32), rng.integers(0, 10, shape[0])


def kiln_train_step(kind: str, compiled: bool = True):
    """A fresh seeded kiln model (``mlp`` or ``lenet``) and its training step, compiled or eager."""
    kiln.manual_seed(0)
    model = getattr(models, kind)(kiln)
    x, y = _classifier_data(kind)
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-3)
    step = models.train_step(kiln, model, optimizer, kiln.from_numpy(x), kiln.from_numpy(y))
    return (kiln_compile(step) if compiled else step), model


def torch_train_step(torch, kind: str, compiled: bool = False, **adam):
    """The same model, weights and batch in PyTorch, with ``Adam(**adam)``."""
    _, reference = kiln_train_step(kind, compiled=False)
    model = getattr(models, kind)(torch)
    models.same_weights(reference, model, torch)
    x, y = _classifier_data(kind)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **adam)
    step = models.train_step(torch, model, optimizer, torch.from_numpy(x), torch.from_numpy(y))
    return torch.compile(step) if compiled else step


def _verify_steps(kind: str, torch) -> Callable[[Callable], str]:
    """Losses of a fresh compiled kiln step and PyTorch's over CHECK_STEPS + 2 steps agree."""

    def verify(_call) -> str:
        if torch is None:
            return UNCHECKED
        kiln_step, _ = kiln_train_step(kind)
        torch_step = torch_train_step(torch, kind)
        steps = CHECK_STEPS + 2  # kiln compiles on call 2 (call 1 creates Adam's state)
        ours = [float(kiln_step().numpy()) for _ in range(steps)]
        theirs = [float(torch_step().detach().numpy()) for _ in range(steps)]
        return close(ours, theirs, rtol=LOSS_TOL[0], atol=LOSS_TOL[1]) + " on losses"

    return verify


def _classifier(kind: str, case: str, quick: bool) -> list[Result]:
    torch = optional_import("torch")
    builders: dict[str, Callable | str] = {
        KILN: lambda: kiln_train_step(kind)[0],
        KILN_EAGER: lambda: kiln_train_step(kind, compiled=False)[0],
    }
    if torch is None:
        builders[TORCH_FUSED] = builders[TORCH_FOREACH] = builders["torch.compile"] = "torch is not installed"
    else:
        builders[TORCH_FUSED] = lambda: torch_train_step(torch, kind, fused=True)
        builders[TORCH_FOREACH] = lambda: torch_train_step(torch, kind, foreach=True)
        why = torch_compile_or_why(torch)
        builders["torch.compile"] = why or (lambda: torch_train_step(torch, kind, compiled=True))
    if kind == "mlp":
        builders["jax.jit"] = _jax_mlp_builder()
    params = {"optimizer": "Adam", "lr": 1e-3, "dtype": "float32", "batch": 128 if kind == "mlp" else 64}
    return side_by_side(
        kind, case, builders, quick=quick, verify=_verify_steps(kind, torch), params=params, notes=_steps_per_s
    )


def _jax_mlp_builder() -> Callable | str:
    jax = optional_import("jax")
    if jax is None:
        return "jax is not installed"

    def build():
        _, model = kiln_train_step("mlp", compiled=False)
        x, y = _classifier_data("mlp")
        return models.jax_mlp_step(jax, [p.detach().numpy().copy() for p in model.parameters()], x, y)

    return build


def run_mlp(quick: bool = False) -> list[Result]:
    return _classifier("mlp", MLP, quick)


def run_lenet(quick: bool = False) -> list[Result]:
    return _classifier("lenet", LENET, quick)


# ----------------------------------------------------------------------------- GPT
def _gpt_pair(torch, quick: bool):
    """Fresh seeded kiln GPT, and the same GPT in PyTorch when installed; with the batch as numpy."""
    batch, context = GPT_SIZES[quick]
    kiln.manual_seed(0)
    ours = models.gpt(kiln, context=context, **GPT_CONFIG)
    theirs = None
    if torch is not None:
        theirs = models.gpt(torch, context=context, **GPT_CONFIG)
        models.same_weights(ours, theirs, torch)
    rng = np.random.default_rng(0)
    idx, targets = (rng.integers(0, GPT_CONFIG["vocab"], (batch, context)) for _ in range(2))
    return ours, theirs, idx, targets


def _gpt_step(lib, model, idx, targets):
    return models.forward_backward(lib, model, lib.from_numpy(idx.copy()), lib.from_numpy(targets.copy()))


def _verify_gpt(torch, quick: bool) -> Callable[[Callable], str]:
    """A fresh compiled kiln GPT's loss and every gradient against PyTorch eager's, same weights."""

    def verify(_call) -> str:
        if torch is None:
            return UNCHECKED
        ours, theirs, idx, targets = _gpt_pair(torch, quick)
        step = kiln_compile(_gpt_step(kiln, ours, idx, targets))
        losses = [float(step().numpy()) for _ in range(3)]  # call 3 runs the compiled program
        expected = float(_gpt_step(torch, theirs, idx, targets)().numpy())
        checks = [close(losses[-1], expected, rtol=LOSS_TOL[0], atol=LOSS_TOL[1])]
        for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
            g = q.grad.numpy()
            checks.append(close(p.grad.numpy(), g, rtol=GRAD_RTOL, atol=GRAD_RTOL * float(np.abs(g).max())))
        return merge_checks(checks) + " on loss and gradients"

    return verify


def run_gpt(quick: bool = False) -> list[Result]:
    torch = optional_import("torch")

    def kiln_build(compiled: bool):
        ours, _, idx, targets = _gpt_pair(None, quick)
        step = _gpt_step(kiln, ours, idx, targets)
        return kiln_compile(step) if compiled else step

    def torch_build(compiled: bool):
        _, theirs, idx, targets = _gpt_pair(torch, quick)
        step = _gpt_step(torch, theirs, idx, targets)
        return torch.compile(step) if compiled else step

    builders: dict[str, Callable | str] = {KILN: lambda: kiln_build(True), KILN_EAGER: lambda: kiln_build(False)}
    if torch is None:
        builders["torch"] = builders["torch.compile"] = "torch is not installed"
    else:
        builders["torch"] = lambda: torch_build(False)
        builders["torch.compile"] = torch_compile_or_why(torch) or (lambda: torch_build(True))
    batch, context = GPT_SIZES[quick]
    params = {**GPT_CONFIG, "batch": batch, "context": context, "dtype": "float32"}
    return side_by_side(
        "gpt", GPT, builders, quick=quick, verify=_verify_gpt(torch, quick), params=params, notes=_steps_per_s
    )


# ----------------------------------------------------------------------------- Adam alone
def _adam_arrays(quick: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    count, size = ADAM_SIZES[quick]
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(size, dtype=np.float32) for _ in range(count)]
    grads = [rng.standard_normal(size, dtype=np.float32) for _ in range(count)]
    return weights, grads


def kiln_adam(quick: bool, compiled: bool = True):
    """(step, params): kiln's Adam over fresh parameters holding fixed gradients."""
    weights, grads = _adam_arrays(quick)
    params = [kiln.from_numpy(w).requires_grad_() for w in weights]
    for p, g in zip(params, grads, strict=True):
        p.grad = kiln.from_numpy(g)
    optimizer = kiln.optim.Adam(params, lr=1e-3)

    def step():
        optimizer.step()

    return (kiln_compile(step) if compiled else step), params


def torch_adam(torch, quick: bool, **adam):
    weights, grads = _adam_arrays(quick)
    params = [torch.from_numpy(w).requires_grad_() for w in weights]
    for p, g in zip(params, grads, strict=True):
        p.grad = torch.from_numpy(g)
    optimizer = torch.optim.Adam(params, lr=1e-3, **adam)
    return optimizer.step, params


def numpy_adam(quick: bool, steps: int, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8) -> list[np.ndarray]:
    """The parameters after ``steps`` Adam steps, in float64 numpy (PyTorch's Adam, no weight decay)."""
    weights, grads = _adam_arrays(quick)
    out = []
    for w, g in zip(weights, grads, strict=True):
        p, g = w.astype(np.float64), g.astype(np.float64)
        m, v = np.zeros_like(p), np.zeros_like(p)
        for t in range(1, steps + 1):
            m = betas[0] * m + (1 - betas[0]) * g
            v = betas[1] * v + (1 - betas[1]) * g * g
            denom = np.sqrt(v) / np.sqrt(1 - betas[1] ** t) + eps
            p = p - lr / (1 - betas[0] ** t) * m / denom
        out.append(p)
    return out


def _verify_adam(torch, quick: bool) -> Callable[[Callable], str]:
    """A fresh compiled kiln Adam's parameters after a few steps against PyTorch's fused Adam, or without
    torch against float64 numpy."""

    def verify(_call) -> str:
        steps = CHECK_STEPS + 2
        step, ours = kiln_adam(quick)
        for _ in range(steps):
            step()
        if torch is None:
            expected, against = numpy_adam(quick, steps), "float64 numpy"
        else:
            reference, theirs = torch_adam(torch, quick, fused=True)
            for _ in range(steps):
                reference()
            expected, against = [q.detach().numpy() for q in theirs], "torch fused"
        rtol, atol = PARAM_TOL
        checks = [close(p.detach().numpy(), q, rtol=rtol, atol=atol) for p, q in zip(ours, expected, strict=True)]
        return merge_checks(checks) + f" on parameters, against {against}"

    return verify


def run_adam(quick: bool = False) -> list[Result]:
    torch = optional_import("torch")
    builders: dict[str, Callable | str] = {
        KILN: lambda: kiln_adam(quick)[0],
        KILN_EAGER: lambda: kiln_adam(quick, compiled=False)[0],
    }
    if torch is None:
        builders[TORCH_FUSED] = builders[TORCH_FOREACH] = builders[TORCH_LOOP] = "torch is not installed"
    else:
        builders[TORCH_FUSED] = lambda: torch_adam(torch, quick, fused=True)[0]
        builders[TORCH_FOREACH] = lambda: torch_adam(torch, quick, foreach=True)[0]
        builders[TORCH_LOOP] = lambda: torch_adam(torch, quick, foreach=False)[0]
    count, size = ADAM_SIZES[quick]
    params = {"parameters": count, "elements_each": size, "dtype": "float32", "lr": 1e-3}
    return side_by_side(
        "adam", ADAM, builders, quick=quick, verify=_verify_adam(torch, quick), params=params, notes=_steps_per_s
    )
