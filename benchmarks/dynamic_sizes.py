"""Dynamic sequence lengths, batches and image sizes (issue 33, items 2 and 5): one compile for every size.

    OPENBLAS_NUM_THREADS=1 python -m benchmarks.dynamic_sizes [--quick] [--only cnn_speed]

Two measurements, each in this one process, on one thread (kiln's pool and BLAS), so that the
ratios compare like with like on a shared machine:

- ``speed``: a GPT-like training step (2 blocks, causal attention, AdamW) at one length, run by the
  static program of that length and by the dynamic program (made by a call at another length),
  calls interleaved, each timed by the process's CPU time; the ratio of the fastest and of the
  median calls.
- ``cnn_speed``: the same for a CNN training step (conv, BatchNorm, ReLU, max_pool, a global mean,
  Linear, Adam) at one batch and image size, its dynamic program made by a call at another batch
  (``batch``), at another height and width (``image``), or both (``batch and image``). Where the
  calls at two sizes make no dynamic program the line says why (then two static programs are compared).
  Its second convolution (16 -> 32 channels, 3x3) takes Winograd unless ``--no-winograd``.
- ``epoch``: 40 batches of 25 distinct lengths through the same step, compiled (``dynamic=None``,
  the default; and ``dynamic=False``, every length its own program up to the recompile limit, as
  before) and eagerly on the same data: compiles made, process CPU time of the epoch and of a
  second epoch over the same batches (wall time too: the compiles run in an LLVM worker process).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import kiln
import kiln.nn as nn
import kiln.nn.functional as F


class Block(nn.Module):
    def __init__(self, c: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.heads) ** 0.5)
        att = att.masked_fill(kiln.tril(kiln.ones(T, T)) == 0, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int = 64, c: int = 64, heads: int = 4, layers: int = 2, block: int = 128) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, c), nn.Embedding(block, c)
        self.blocks = nn.ModuleList([Block(c, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(c), nn.Linear(c, vocab)

    def forward(self, idx):
        B, T = idx.shape
        x = self.tok(idx) + self.pos(kiln.arange(T))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def make_step():
    kiln.manual_seed(0)
    model = GPT()
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-3)

    def step(idx, targets):
        opt.zero_grad()
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        loss.backward()
        opt.step()
        return loss

    return step


def batch(rng, b: int, t: int):
    return kiln.tensor(rng.integers(0, 64, (b, t))), kiln.tensor(rng.integers(0, 64, (b, t)))


def speed(b: int, t: int, rounds: int) -> str:
    rng = np.random.default_rng(0)
    static, dynamic = kiln.compile(make_step(), dynamic=False, wait=True), kiln.compile(make_step(), wait=True)
    x = batch(rng, b, t)
    for _ in range(2):
        static(*x)
    # first another length (a static program runs the sizes it was made for), then t: the dynamic program
    dynamic(*batch(rng, b, t // 2 + 3))
    dynamic(*x)
    dynamic(*x)
    assert [s.dynamic is not None for s in dynamic.state.specializations] == [False, True], dynamic.state.events
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for k, fn in enumerate((static, dynamic)):
            start = time.process_time()  # CPU time: one thread, and robust to a machine shared with others
            fn(*x)
            times[k].append(time.process_time() - start)
    (s_min, d_min), (s_med, d_med) = (min(t) for t in times), (float(np.median(t)) for t in times)
    return (f"GPT step B={b} T={t}: static {s_min * 1e3:.2f} ms, dynamic {d_min * 1e3:.2f} ms (fastest calls: "
            f"dynamic/static {d_min / s_min:.3f}; median calls {d_med / s_med:.3f})")  # fmt: skip


def make_cnn_step(pool: tuple[int, int, int]):
    """A CNN training step; ``pool``: the max pools' (kernel, stride, padding)."""
    kiln.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(*pool),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(*pool),
    )  # fmt: skip
    head = nn.Linear(32, 10)
    opt = kiln.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-3)

    def step(x, y):
        loss = F.cross_entropy(head(model(x).mean(dim=(2, 3))), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step


def images(rng, b: int, h: int, w: int):
    return kiln.tensor(rng.standard_normal((b, 3, h, w)).astype(np.float32)), kiln.tensor(rng.integers(0, 10, b))


#: The other sizes (batch, height, width) that make the dynamic program of ``cnn_speed``, by name.
CNN_OTHER = {"batch": (20, 32, 32), "image": (32, 24, 20), "batch and image": (20, 24, 20)}


def cnn_speed(dims: str, pool: tuple[int, int, int], rounds: int) -> str:
    """The CNN step at (32, 3, 32, 32): static program against the dynamic one made by a call at
    ``CNN_OTHER[dims]``, interleaved, one thread."""
    rng = np.random.default_rng(0)
    static, dynamic = (
        kiln.compile(make_cnn_step(pool), dynamic=False, wait=True),
        kiln.compile(make_cnn_step(pool), wait=True),
    )
    x = images(rng, 32, 32, 32)
    for _ in range(2):
        static(*x)
    dynamic(*images(rng, *CNN_OTHER[dims]))  # (as in ``speed``: the other size first)
    dynamic(*x)
    dynamic(*x)
    made = dynamic.state.specializations[-1]
    what = f"CNN step (32, 3, 32, 32), max_pool{pool}, dynamic in {dims}"
    if made.dynamic is None:
        why = getattr(made, "not_dynamic", None) or dynamic.state.events[-1].detail
        what += f" -- NOT DYNAMIC ({why}); static against static"
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for k, fn in enumerate((static, dynamic)):
            start = time.process_time()
            fn(*x)
            times[k].append(time.process_time() - start)
    (s_min, d_min), (s_med, d_med) = (min(t) for t in times), (float(np.median(t)) for t in times)
    return (f"{what}: static {s_min * 1e3:.2f} ms, dynamic {d_min * 1e3:.2f} ms (fastest calls: dynamic/static "
            f"{d_min / s_min:.3f}; median calls {d_med / s_med:.3f})")  # fmt: skip


def epoch(b: int, quick: bool) -> str:
    lengths = [int(n) for n in np.random.default_rng(5).choice(np.arange(8, 72), 25, replace=False)]
    lengths = (lengths + lengths[:15])[: 12 if quick else 40]
    rng = np.random.default_rng(1)
    data = [batch(rng, b, t) for t in lengths]
    lines = [f"ragged epoch: {len(lengths)} batches, {len(set(lengths))} distinct lengths, B={b}"]
    make_step()(*batch(rng, 2, 5))  # one-time costs of the first eager ops, outside every timing
    cpu: dict[str, list[tuple[float, float]]] = {}
    for name, fn in (("eager", make_step()), ("compiled", kiln.compile(make_step(), wait=True)),
                     ("compiled, dynamic=False", kiln.compile(make_step(), dynamic=False, wait=True))):  # fmt: skip
        cpu[name] = []
        for _ in range(2):
            start, wall = time.process_time(), time.perf_counter()
            for x in data:
                fn(*x)
            cpu[name].append((time.perf_counter() - wall, time.process_time() - start))
        if name != "eager":
            made = len(fn.state.specializations)
            eager_calls = sum(e.kind == "recompile limit" for e in fn.state.events)
            seconds = sum(getattr(s.report, "compile_seconds", 0.0) or 0.0 for s in fn.state.specializations)
            lines.append(
                f"  {name}: {made} compiles ({seconds:.2f} s compiling){', then calls run eagerly' if eager_calls else ''}"
            )
    for name, ((wall_1, cpu_1), (wall_2, cpu_2)) in cpu.items():
        lines.append(f"  {name}: first epoch {wall_1:.2f} s wall, {cpu_1:.2f} s CPU of this process (the LLVM "
                     f"worker's not counted); second {wall_2:.2f} s wall, {cpu_2:.2f} s CPU ({cpu_2 / cpu['eager'][1][1]:.2f} "
                     "x eager's CPU)")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("speed", "cnn_speed", "epoch"), help="one of the measurements")
    parser.add_argument("--no-winograd", action="store_true", help="convolutions without Winograd (cpu.winograd)")
    args = parser.parse_args()
    kiln.backends.cpu.winograd = not args.no_winograd
    rounds = 10 if args.quick else 40
    kiln.runtime.threads.set_num_threads(1)
    if args.only in (None, "speed"):
        print(speed(8, 64, rounds))
    if args.only in (None, "cnn_speed"):
        for pool in ((2, 2, 0), (3, 2, 1)):
            for dims in CNN_OTHER:
                print(cnn_speed(dims, pool, rounds))
    if args.only in (None, "epoch"):
        print(epoch(8, args.quick))


if __name__ == "__main__":
    main()
