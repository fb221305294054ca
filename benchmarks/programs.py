"""Training programs written once against a library (``kiln`` or ``torch``), for the ``eager`` and
``compile_cost`` workloads: the repository's ports of the programs issues 33 and 34 name.

- ``mlp``: Linear(64, 128) - ReLU - Linear(128, 10) over a DataLoader-like list of batches, Adam;
- ``cnn``: two Conv2d - BatchNorm2d - ReLU - MaxPool2d blocks, Dropout, a linear head, on 1x28x28
  inputs, Adam, in train mode;
- ``dcgan``: a DCGAN step on 1x16x16 images: the discriminator's step (real, then generated and
  detached), then the generator's, each with its own Adam (betas 0.5, 0.999);
- ``lstm_lm``: a word-level LSTM language model (``models.lstm_lm``: embedding and 2 layers of 128,
  V=500), batch 16, SGD with gradient clipping (max norm 0.25);
- ``lstm_cells``: two ``nn.LSTMCell``s (hidden 51) looped in Python over the time steps of a batch
  of sequences, a linear read-out per step, MSE, SGD (pytorch/examples' time_sequence_prediction);
- ``gpt``: ``models.gpt`` with 2 blocks, d=128, 4 heads, T=64, batch 8, Adam.

:func:`setup` builds one (kiln's seeded, torch's with kiln's weights copied in) and returns its
step, ``step(*batch) -> loss`` (detached; the DCGAN's two losses stacked); :func:`batches` makes
the same numpy batches for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import kiln

from . import models


@dataclass(frozen=True)
class Setup:
    """A built program: its modules (in a fixed order, for copying weights) and its training step."""

    modules: list
    step: Callable[..., object]


# ----------------------------------------------------------------------------- the programs
def _mlp(lib, sizes: dict, dropout: bool) -> Setup:
    nn = lib.nn
    model = nn.Sequential(nn.Linear(sizes["features"], sizes["hidden"]), nn.ReLU(), nn.Linear(sizes["hidden"], 10))
    return Setup([model], _classifier_step(lib, model, lib.optim.Adam(model.parameters(), lr=1e-3)))


def _cnn(lib, sizes: dict, dropout: bool) -> Setup:
    nn = lib.nn
    c1, c2, side = sizes["channels"], 2 * sizes["channels"], sizes["side"]
    model = nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.5 if dropout else 0.0), nn.Linear(c2 * (side // 4) ** 2, 10),
    )  # fmt: skip
    model.train()
    return Setup([model], _classifier_step(lib, model, lib.optim.Adam(model.parameters(), lr=1e-3)))


def _classifier_step(lib, model, optimizer) -> Callable:
    cross_entropy = lib.nn.functional.cross_entropy

    def step(x, y):
        loss = cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return step


def _dcgan(lib, sizes: dict, dropout: bool) -> Setup:
    nn = lib.nn
    nz, g, d = sizes["noise"], sizes["width"], sizes["width"]
    generator = nn.Sequential(
        nn.ConvTranspose2d(nz, 2 * g, 4, 1, 0, bias=False), nn.BatchNorm2d(2 * g), nn.ReLU(),  # 4x4
        nn.ConvTranspose2d(2 * g, g, 4, 2, 1, bias=False), nn.BatchNorm2d(g), nn.ReLU(),  # 8x8
        nn.ConvTranspose2d(g, 1, 4, 2, 1, bias=False), nn.Tanh(),  # 16x16
    )  # fmt: skip
    discriminator = nn.Sequential(
        nn.Conv2d(1, d, 4, 2, 1, bias=False), nn.LeakyReLU(0.2),  # 8x8
        nn.Conv2d(d, 2 * d, 4, 2, 1, bias=False), nn.BatchNorm2d(2 * d), nn.LeakyReLU(0.2),  # 4x4
        nn.Conv2d(2 * d, 1, 4, 1, 0, bias=False), nn.Flatten(),  # one logit per image
    )  # fmt: skip
    opt_g = lib.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = lib.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = lib.nn.functional.binary_cross_entropy_with_logits

    def step(real, noise):
        ones, zeros = lib.ones(real.shape[0], 1), lib.zeros(real.shape[0], 1)
        opt_d.zero_grad()
        fake = generator(noise)
        loss_d = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_g = bce(discriminator(fake), ones)
        loss_g.backward()
        opt_g.step()
        return lib.stack([loss_d.detach(), loss_g.detach()])

    return Setup([generator, discriminator], step)


def _lstm_lm(lib, sizes: dict, dropout: bool) -> Setup:
    model = models.lstm_lm(lib, vocab=sizes["vocab"], hidden=sizes["hidden"], layers=2)
    optimizer = lib.optim.SGD(model.parameters(), lr=0.5)
    cross_entropy, clip = lib.nn.functional.cross_entropy, lib.nn.utils.clip_grad_norm_

    def step(idx, targets):
        optimizer.zero_grad()
        logits = model(idx)
        loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        clip(model.parameters(), 0.25)
        optimizer.step()
        return loss.detach()

    return Setup([model], step)


def _lstm_cells(lib, sizes: dict, dropout: bool) -> Setup:
    nn = lib.nn
    hidden = sizes["hidden"]
    cell1, cell2, head = nn.LSTMCell(1, hidden), nn.LSTMCell(hidden, hidden), nn.Linear(hidden, 1)
    params = [*cell1.parameters(), *cell2.parameters(), *head.parameters()]
    optimizer = lib.optim.SGD(params, lr=0.1)
    mse = lib.nn.functional.mse_loss

    def step(inputs, targets):
        rows = inputs.shape[0]
        h1, c1, h2, c2 = (lib.zeros(rows, hidden) for _ in range(4))
        outputs = []
        for x in inputs.split(1, dim=1):  # the Python loop over time steps, as the example writes it
            h1, c1 = cell1(x, (h1, c1))
            h2, c2 = cell2(h1, (h2, c2))
            outputs.append(head(h2))
        loss = mse(lib.cat(outputs, dim=1), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return Setup([cell1, cell2, head], step)


def _gpt(lib, sizes: dict, dropout: bool) -> Setup:
    config = {k: sizes[k] for k in ("vocab", "d", "heads", "layers")}
    model = models.gpt(lib, **config, context=sizes["steps"])
    optimizer = lib.optim.Adam(model.parameters(), lr=3e-4)
    cross_entropy = lib.nn.functional.cross_entropy

    def step(idx, targets):
        logits = model(idx)
        loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return Setup([model], step)


# ----------------------------------------------------------------------------- their batches
def _classifier_batch(sizes: dict, rng: np.random.Generator, rows: int) -> tuple:
    shape = (rows, sizes["features"]) if "features" in sizes else (rows, 1, sizes["side"], sizes["side"])
    return rng.standard_normal(shape, dtype=np.float32), rng.integers(0, 10, rows)


def _dcgan_batch(sizes: dict, rng: np.random.Generator, rows: int) -> tuple:
    real = np.tanh(rng.standard_normal((rows, 1, 16, 16), dtype=np.float32))
    return real, rng.standard_normal((rows, sizes["noise"], 1, 1), dtype=np.float32)


def _token_batch(sizes: dict, rng: np.random.Generator, rows: int) -> tuple:
    tokens = rng.integers(0, sizes["vocab"], (rows, sizes["steps"] + 1))
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


def _wave_batch(sizes: dict, rng: np.random.Generator, rows: int) -> tuple:
    phase = rng.uniform(0, 2 * np.pi, (rows, 1))
    wave = np.sin(phase + 0.1 * np.arange(sizes["steps"] + 1)).astype(np.float32)
    return wave[:, :-1].copy(), wave[:, 1:].copy()


@dataclass(frozen=True)
class Program:
    name: str
    title: str  # the case's name in the tables (its sizes go with the results' params)
    build: Callable[..., Setup]  # build(lib, sizes, dropout) -> Setup
    batch: Callable[..., tuple]  # batch(sizes, rng, rows) -> tuple of numpy arrays
    sizes: dict  # by ``quick``: the sizes the program is built and fed with


_GPT = {"vocab": 256, "d": 128, "heads": 4, "layers": 2}
PROGRAMS = {
    p.name: p
    for p in (
        Program("mlp", "MLP from a batch list, Adam", _mlp, _classifier_batch,
                {False: {"features": 64, "hidden": 128, "batch": 64}, True: {"features": 8, "hidden": 16, "batch": 8}}),
        Program("cnn", "CNN, BatchNorm + dropout, Adam", _cnn, _classifier_batch,
                {False: {"side": 28, "channels": 8, "batch": 32}, True: {"side": 8, "channels": 2, "batch": 4}}),
        Program("dcgan", "DCGAN step, 2 Adams", _dcgan, _dcgan_batch,
                {False: {"noise": 16, "width": 16, "batch": 16}, True: {"noise": 4, "width": 2, "batch": 2}}),
        Program("lstm_lm", "LSTM LM, 2 layers, SGD + clipping", _lstm_lm, _token_batch,
                {False: {"vocab": 500, "hidden": 128, "batch": 16, "steps": 35},
                 True: {"vocab": 20, "hidden": 8, "batch": 2, "steps": 4}}),
        Program("lstm_cells", "2 LSTMCells looped over time, SGD", _lstm_cells, _wave_batch,
                {False: {"hidden": 51, "batch": 16, "steps": 100}, True: {"hidden": 4, "batch": 2, "steps": 3}}),
        Program("gpt", "GPT, 2 blocks, Adam", _gpt, _token_batch,
                {False: {**_GPT, "batch": 8, "steps": 64},
                 True: {**_GPT, "vocab": 16, "d": 8, "heads": 2, "batch": 2, "steps": 4}}),
    )
}  # fmt: skip


def setup(program: Program, lib, sizes: dict, *, dropout: bool = True, reference: Setup | None = None) -> Setup:
    """``program`` built with ``lib``: kiln's seeded (``kiln.manual_seed(0)``), a torch one with
    ``reference``'s (kiln's) weights copied in. ``dropout=False`` builds dropout with p=0, so that
    the losses of two libraries can be compared step by step."""
    if lib is kiln:
        kiln.manual_seed(0)
    else:
        lib.manual_seed(0)
    built = program.build(lib, sizes, dropout)
    if reference is not None:
        for source, target in zip(reference.modules, built.modules, strict=True):
            models.same_weights(source, target, lib)
    return built


def batches(program: Program, sizes: dict, count: int, *, last_rows: int | None = None, seed: int = 0) -> list:
    """``count`` batches (tuples of numpy arrays) of ``sizes["batch"]`` rows, the last one of
    ``last_rows`` rows when given (a DataLoader's ragged last batch)."""
    rng = np.random.default_rng(seed)
    rows = [sizes["batch"]] * count
    if last_rows is not None:
        rows[-1] = last_rows
    return [program.batch(sizes, rng, n) for n in rows]


def on(lib, batch_list: list) -> list:
    """The batches as ``lib`` tensors (fresh copies: neither library shares the other's memory)."""
    return [tuple(lib.from_numpy(np.ascontiguousarray(a).copy()) for a in batch) for batch in batch_list]


def cycling(step: Callable, batch_list: list) -> Callable[[], object]:
    """A no-argument callable: each call runs ``step`` on the next batch, round and round."""
    position = [0]

    def call():
        batch = batch_list[position[0] % len(batch_list)]
        position[0] += 1
        return step(*batch)

    return call


def losses(call: Callable[[], object], steps: int) -> np.ndarray:
    """``steps`` calls' losses, as float64 rows (one row per step; the DCGAN's has two)."""
    return np.array([np.atleast_1d(np.asarray(_numpy(call()), dtype=np.float64)) for _ in range(steps)])


def _numpy(t):
    return t.detach().numpy() if hasattr(t, "detach") else t
