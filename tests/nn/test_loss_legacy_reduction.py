"""PyTorch's deprecated ``size_average``/``reduce`` arguments of every functional loss are honoured.

They used to be accepted and ignored: a VAE written with ``F.binary_cross_entropy(...,
size_average=False)`` trained on the mean, 1/100,352 of PyTorch's loss, with no error. The table
below holds inputs for each loss; a loss added to ``kiln.nn.functional`` with these arguments and
without an entry here fails ``test_every_loss_with_the_legacy_arguments_is_covered``.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from tests.conftest import assert_close

rng = np.random.default_rng(11)


def _probs(*shape):
    return rng.uniform(0.05, 0.95, size=shape)


def _signs(*shape):
    return np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0)


# name -> the loss's positional arguments (numpy arrays; int64 ones are class indices)
INPUTS = {
    "nll_loss": lambda: [np.log(_probs(4, 3)), np.array([0, 2, 1, 2])],
    "cross_entropy": lambda: [rng.normal(size=(4, 3)), np.array([0, 2, 1, 2])],
    "mse_loss": lambda: [rng.normal(size=(4, 3)), rng.normal(size=(4, 3))],
    "l1_loss": lambda: [rng.normal(size=(4, 3)), rng.normal(size=(4, 3))],
    "binary_cross_entropy": lambda: [_probs(4, 3), _probs(4, 3)],
    "binary_cross_entropy_with_logits": lambda: [rng.normal(size=(4, 3)), _probs(4, 3)],
    "smooth_l1_loss": lambda: [rng.normal(size=(4, 3)), rng.normal(size=(4, 3))],
    "kl_div": lambda: [np.log(_probs(4, 3)), _probs(4, 3)],
    "soft_margin_loss": lambda: [rng.normal(size=(4, 3)), _signs(4, 3)],
    "margin_ranking_loss": lambda: [rng.normal(size=5), rng.normal(size=5), _signs(5)],
    "hinge_embedding_loss": lambda: [rng.normal(size=(4, 3)), _signs(4, 3)],
    "cosine_embedding_loss": lambda: [rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), _signs(4)],
    "poisson_nll_loss": lambda: [rng.normal(size=(4, 3)), rng.uniform(0, 3, size=(4, 3))],
    "triplet_margin_loss": lambda: [rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 3))],
    "multilabel_soft_margin_loss": lambda: [rng.normal(size=(4, 3)), (rng.uniform(size=(4, 3)) < 0.5) * 1.0],
    "multi_margin_loss": lambda: [rng.normal(size=(4, 3)), np.array([0, 2, 1, 2])],
    "multilabel_margin_loss": lambda: [
        rng.normal(size=(4, 3)),
        np.array([[0, 2, -1], [1, -1, 0], [2, 0, 1], [-1, 0, 0]]),
    ],
}

LEGACY = [
    {"size_average": False},
    {"reduce": False},
    {"size_average": True, "reduce": True},
    {"size_average": False, "reduce": True},
    {"size_average": False, "reduce": False},
]
AS_REDUCTION = ["sum", "none", "mean", "sum", "none"]  # what PyTorch maps each of LEGACY to


def _legacy_losses() -> list[str]:
    names = []
    for name in dir(F):
        fn = getattr(F, name)
        if callable(fn) and not name.startswith("_"):
            try:
                params = inspect.signature(fn).parameters
            except (TypeError, ValueError):
                continue
            if "size_average" in params and "reduce" in params:
                names.append(name)
    return sorted(names)


def test_every_loss_with_the_legacy_arguments_is_covered():
    assert _legacy_losses() == sorted(INPUTS)


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_legacy_arguments_mean_what_reduction_says(name):
    """Without torch: each legacy spelling equals the ``reduction`` PyTorch maps it to."""
    fn = getattr(F, name)
    args = [kiln.tensor(a) for a in INPUTS[name]()]
    for legacy, reduction in zip(LEGACY, AS_REDUCTION):
        assert_close(fn(*args, **legacy), fn(*args, reduction=reduction), rtol=1e-12, atol=1e-12)
    summed, mean = fn(*args, size_average=False), fn(*args)
    assert summed.shape == () and abs(summed.item()) > abs(mean.item())  # not the mean any more


@pytest.mark.parametrize("legacy", LEGACY, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("name", sorted(INPUTS))
def test_legacy_arguments_match_torch(torch, name, legacy):
    arrays = INPUTS[name]()
    expected = getattr(torch.nn.functional, name)(*[torch.tensor(a) for a in arrays], **legacy)
    assert_close(getattr(F, name)(*[kiln.tensor(a) for a in arrays], **legacy), expected, rtol=1e-10, atol=1e-12)


def test_a_vae_step_with_a_summed_reconstruction_compiles_as_eager():
    """The VAE tutorial's loss (``binary_cross_entropy(..., size_average=False)`` plus the KL term),
    trained compiled against eager: equal losses and weights, one specialization, no trace break."""

    def build():
        kiln.manual_seed(0)
        enc, dec = kiln.nn.Linear(16, 8), kiln.nn.Linear(4, 16)
        opt = kiln.optim.Adam([*enc.parameters(), *dec.parameters()], lr=1e-2)

        def step(x, eps):
            mu, logvar = enc(x).chunk(2, dim=1)
            recon = dec(mu + eps * (0.5 * logvar).exp()).sigmoid()
            loss = F.binary_cross_entropy(recon, x, size_average=False)
            loss = loss - 0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        return enc, step

    (enc_eager, eager), (enc_compiled, step) = build(), build()
    compiled = kiln.compile(step)
    data = rng.uniform(0.05, 0.95, size=(6, 8, 16)).astype(np.float32)
    noise = rng.standard_normal((6, 8, 4)).astype(np.float32)
    for x, eps in zip(data, noise):
        assert_close(compiled(kiln.tensor(x), kiln.tensor(eps)), eager(kiln.tensor(x), kiln.tensor(eps)),
                     rtol=1e-5, atol=1e-5)  # fmt: skip
    assert_close(enc_compiled.weight, enc_eager.weight, rtol=1e-5, atol=1e-6)
    summary = kiln.explain(compiled, kiln.tensor(data[0]), kiln.tensor(noise[0])).summary()
    assert "1 specialization(s), 0 trace break(s)" in summary
