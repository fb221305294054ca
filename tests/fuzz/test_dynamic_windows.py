"""Random conv/pool nets called at varying image sizes and batches, compiled against eager.

Each program is a random stack of convolutions, transposed convolutions, max and average pools and
ReLUs (and in half of them a dropout) over a ``(batch, C, H, W)`` input, with a loss that reads
every element (a mean of squares) and one that sums over the image (a per-channel sum, meaned), and
a backward. It is called at random heights, widths and batches: programs become dynamic in some
dims, later ones in others (``frontend/jit/size_spelling.py``, ``call_cache._dynamic_key``). Values
and the input's gradient must equal eager's at every call, both from one seed, and the generator's
state after it. (Two silent errors this kind of program found: a mean's count taken for a size that
coincided with it at both traced sizes, and a program dynamic in the image run at another batch than
the one it kept static.)
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import kiln
from kiln import nn

PROGRAMS = 24
CALLS = 6
KINDS = ("conv", "conv_transpose", "max_pool", "avg_pool", "relu")


def _net(r: random.Random, channels: int, kinds=KINDS) -> nn.Module:
    layers: list[nn.Module] = []
    c = channels
    for _ in range(r.randint(1, 3)):
        kind = r.choice(kinds)
        if kind == "conv":
            out = r.randint(1, 4)
            layers.append(nn.Conv2d(c, out, r.randint(1, 3), stride=r.randint(1, 2), padding=r.randint(0, 1)))
            c = out
        elif kind == "conv_transpose":
            out = r.randint(1, 4)
            layers.append(nn.ConvTranspose2d(c, out, r.randint(1, 3), stride=r.randint(1, 2)))
            c = out
        elif kind == "max_pool":
            layers.append(nn.MaxPool2d(r.randint(2, 3), stride=r.randint(1, 2), ceil_mode=r.random() < 0.5))
        elif kind == "avg_pool":
            layers.append(nn.AvgPool2d(r.randint(2, 3), stride=r.randint(1, 2), padding=r.randint(0, 1)))
        elif kind == "batch_norm":
            layers.append(nn.BatchNorm2d(c))
        else:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _equal_at(a: np.ndarray, eager, compiled, where: str) -> None:
    """The compiled loss and its input's gradient at ``a`` against eager's."""
    found = []
    for fn in (eager, compiled):
        x = kiln.tensor(a, requires_grad=True)
        kiln.manual_seed(7)  # the same dropout masks
        value = fn(x)
        value.backward()
        found.append((value.item(), x.grad.numpy(), kiln.get_rng_state().numpy().copy()))
    np.testing.assert_array_equal(found[1][2], found[0][2], err_msg=f"the generator's state; {where}")
    np.testing.assert_allclose(found[1][0], found[0][0], rtol=1e-4, atol=1e-5, err_msg=where)
    np.testing.assert_allclose(found[1][1], found[0][1], rtol=1e-3, atol=1e-5, err_msg=where)


@pytest.mark.fuzz
@pytest.mark.parametrize("seed", range(PROGRAMS))
def test_random_conv_nets_at_varying_image_sizes_match_eager(seed):
    r = random.Random(seed)
    channels = r.randint(1, 3)
    kiln.manual_seed(seed)
    net = _net(r, channels)
    draws = random.Random(seed * 7919 + 1)  # its own stream: the programs without a draw stay as they were
    if draws.random() < 0.5:  # a dropout whose shape follows the dynamic sizes (floor divisions of H, W)
        layers = list(net)
        layers.insert(draws.randint(0, len(layers)), draws.choice((nn.Dropout(0.3), nn.Dropout2d(0.3))))
        net = nn.Sequential(*layers)

    def loss(x):
        y = net(x)
        return (y * y).mean() + y.sum(dim=(2, 3)).mean()

    compiled = kiln.compile(loss)
    rng = np.random.default_rng(seed)
    for call in range(CALLS):
        shape = (r.randint(1, 3), channels, r.randint(9, 29), r.randint(9, 29))
        _equal_at(
            rng.standard_normal(shape).astype(np.float32), loss, compiled, f"seed {seed}: {net}; call {call} at {shape}"
        )
    why_static = [e.detail for e in compiled.state.events if "stay static" in e.detail]
    assert not any("random_" in why for why in why_static), f"seed {seed}: {net}: {why_static}"


@pytest.mark.fuzz
@pytest.mark.parametrize("seed", range(PROGRAMS // 2))
def test_random_conv_nets_with_batch_norm_over_varying_batches_match_eager(seed):
    """One image size, batches of 2 to 6: programs dynamic in the batch alone, whose convolutions,
    filter gradients and sums across the batch are compiled over a symbolic batch."""
    r = random.Random(1000 + seed)
    channels = r.randint(1, 3)
    kiln.manual_seed(seed)
    kinds, twin_r = (*KINDS, "batch_norm", "batch_norm"), random.Random()
    twin_r.setstate(r.getstate())
    net, twin = _net(r, channels, kinds), _net(twin_r, channels, kinds)
    twin.load_state_dict(net.state_dict())  # the running statistics advance in each: one per function
    image = (r.randint(9, 20), r.randint(9, 20))

    def loss_of(model):
        def loss(x):
            y = model(x)
            return (y * y).mean() + y.sum(dim=(2, 3)).mean()

        return loss

    eager, compiled = loss_of(net), kiln.compile(loss_of(twin))
    rng = np.random.default_rng(seed)
    for call in range(CALLS):
        shape = (r.randint(2, 6), channels, *image)
        _equal_at(
            rng.standard_normal(shape).astype(np.float32),
            eager,
            compiled,
            f"seed {seed}: {net}; call {call} at {shape}",
        )
    for a, b in zip(twin.state_dict().values(), net.state_dict().values(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"seed {seed}: {net}")
