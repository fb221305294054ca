"""A character-level language model: a small causal transformer and an LSTM, trained on a text in the repository.

    python examples/char_lm.py [--model transformer|lstm|both] [--steps N] [--fast] [--seed S] [--max-ratio R]

The text (``examples/data/kiln_tales.txt``, an original story in plain ASCII) is encoded one
integer per character and split 90/10 into training and validation text. The yardstick is
the unigram baseline: the cross-entropy of predicting every validation character from the
training set's character frequencies alone, with no context. Both models see random windows
of the training text, drawn with a seeded ``kiln.Generator``, and learn to predict each next
character with ``F.cross_entropy``, ``optim.AdamW`` and ``nn.utils.clip_grad_norm_``:

- ``transformer``: token and learned position ``nn.Embedding``, pre-norm
  ``nn.TransformerEncoderLayer`` blocks with a causal mask (each position attends to itself
  and the positions before it), a final ``nn.LayerNorm`` and a ``nn.Linear`` head;
- ``lstm``: ``nn.Embedding``, ``nn.LSTM(batch_first=True)`` and a ``nn.Linear`` head.

Each model prints its training loss every so often, its validation loss (under
``kiln.no_grad()`` and ``model.eval()``), a short sample drawn with ``kiln.multinomial``, and
a summary line: ``<model>: val loss L nats/char (unigram U, ratio L/U), N steps, T ms/step``.
Exits with status 1 when a model's validation loss is above ``--max-ratio`` times the unigram
baseline (default 0.7; 0.85 with ``--fast``, which trains for about a hundred steps only).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from progress import progress

import kiln
import kiln.nn.functional as F
from kiln import nn, optim

TEXT = Path(__file__).resolve().parent / "data" / "kiln_tales.txt"
MODELS = ("transformer", "lstm")
STEPS = {"transformer": 600, "lstm": 500}
FAST_STEPS = {"transformer": 120, "lstm": 100}
MAX_RATIO, FAST_MAX_RATIO = 0.7, 0.85
LR = {"transformer": 3e-3, "lstm": 1e-2}
PROMPT = "The potter "


class Vocabulary:
    """The characters of a text, each mapped to an index (sorted order, so the mapping is stable)."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> kiln.Tensor:
        return kiln.tensor([self.index[c] for c in text], dtype=kiln.int64)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


def load_data(path: Path = TEXT, val_fraction: float = 0.1) -> tuple[Vocabulary, kiln.Tensor, kiln.Tensor]:
    """(vocabulary, training ids, validation ids): the last ``val_fraction`` of the text is held out."""
    text = path.read_text(encoding="ascii")
    vocab = Vocabulary(text)
    data = vocab.encode(text)
    n_train = int(len(data) * (1 - val_fraction))
    return vocab, data[:n_train], data[n_train:]


def unigram_loss(train: kiln.Tensor, val: kiln.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats/char) of the validation text under the training text's character frequencies."""
    counts = F.one_hot(train, vocab_size).sum(dim=0).double()
    # Add-one smoothing: a character that never occurs in training must not cost an infinite loss.
    probs = (counts + 1) / (counts.sum() + vocab_size)
    return -probs.log()[val].mean().item()


def get_batch(data: kiln.Tensor, block: int, batch: int, generator: kiln.Generator) -> tuple[kiln.Tensor, kiln.Tensor]:
    """``batch`` random windows of ``block`` characters (inputs) and the same windows shifted by one (targets)."""
    starts = kiln.randint(0, len(data) - block, (batch, 1), generator=generator)
    index = starts + kiln.arange(block)  # (batch, block)
    return data[index], data[index + 1]


class CharTransformer(nn.Module):
    """A decoder-only transformer: every position predicts the next character from itself and those before."""

    def __init__(self, vocab_size: int, block: int, d_model: int = 64, nhead: int = 4, layers: int = 2,
                 dropout: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        self.block = block
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(block, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model, dropout, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        # -inf above the diagonal: position t may not look at t+1, t+2, ... (PyTorch's float mask convention).
        self.mask = kiln.full((block, block), -math.inf).triu(1)

    def forward(self, ids: kiln.Tensor) -> kiln.Tensor:
        """(N, T) character ids, T <= block -> (N, T, vocab) next-character logits."""
        length = ids.shape[1]
        x = self.token(ids) + self.position(kiln.arange(length))
        mask = self.mask[:length, :length]
        for layer in self.layers:
            x = layer(x, src_mask=mask)
        return self.head(self.norm(x))


class CharLSTM(nn.Module):
    """Embedding -> LSTM -> Linear; ``forward`` also takes and returns the recurrent state, for sampling."""

    def __init__(self, vocab_size: int, hidden: int = 128, embed: int = 32, layers: int = 1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, ids: kiln.Tensor, state=None) -> tuple[kiln.Tensor, tuple]:
        out, state = self.lstm(self.embed(ids), state)
        return self.head(out), state


def build_model(kind: str, vocab_size: int, args: argparse.Namespace) -> nn.Module:
    if kind == "transformer":
        return CharTransformer(vocab_size, args.block, d_model=args.d_model, dropout=args.dropout)
    if kind == "lstm":
        return CharLSTM(vocab_size, hidden=args.hidden)
    raise ValueError(f"unknown model {kind!r}; expected one of {', '.join(MODELS)}")


def logits_of(model: nn.Module, ids: kiln.Tensor) -> kiln.Tensor:
    out = model(ids)
    return out[0] if isinstance(out, tuple) else out


def evaluate(model: nn.Module, data: kiln.Tensor, block: int) -> float:
    """Mean next-character loss over the text cut into consecutive windows of ``block`` characters."""
    n = (len(data) - 1) // block
    x = data[: n * block].reshape(n, block)
    y = data[1 : n * block + 1].reshape(n, block)
    model.eval()
    with kiln.no_grad():
        logits = logits_of(model, x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    model.train()
    return loss


def sample(model: nn.Module, vocab: Vocabulary, length: int, generator: kiln.Generator, temperature: float = 0.8):
    """``PROMPT`` continued by ``length`` characters, each drawn from the model's softmax with ``kiln.multinomial``."""
    ids = vocab.encode(PROMPT).reshape(1, -1)
    out = ids[0].tolist()
    model.eval()
    with kiln.no_grad():
        state = None
        for _ in range(length):
            if isinstance(model, CharLSTM):  # the state carries the context: feed only the new characters
                logits, state = model(ids, state)
            else:  # the transformer sees (at most) the last ``block`` characters each time
                logits = model(kiln.tensor([out[-model.block :]], dtype=kiln.int64))
            probs = F.softmax(logits[0, -1] / temperature, dim=-1)
            nxt = kiln.multinomial(probs, 1, generator=generator)
            out.append(int(nxt.item()))
            ids = nxt.reshape(1, 1)
    model.train()
    return vocab.decode(out)


def train(kind: str, data: tuple, args: argparse.Namespace) -> tuple[float, float]:
    """Train one model, printing its loss every ``--log-every`` steps; return (val loss, seconds per step)."""
    vocab, train_ids, val_ids = data
    kiln.manual_seed(args.seed)  # the same initial weights for the same seed, whichever models run
    generator = kiln.Generator().manual_seed(args.seed + 1)  # which windows
    model = build_model(kind, len(vocab), args)
    optimizer = optim.AdamW(model.parameters(), lr=args.lr or LR[kind], weight_decay=0.01)
    steps = args.steps or (FAST_STEPS if args.fast else STEPS)[kind]
    # Cosine decay to a tenth of the learning rate: the last steps settle instead of bouncing.
    schedule = optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.1 + 0.45 * (1 + math.cos(math.pi * s / steps)))
    params = sum(p.numel() for p in model.parameters())
    print(f"{kind}: {params} parameters, {steps} steps of {args.batch_size} windows of {args.block} characters")

    def train_step(x, y):
        logits = logits_of(model, x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.detach()

    # One compiled program per step (the schedule's learning rate is read each call, not baked in).
    train_step = train_step if args.eager else kiln.compile(train_step)
    start = time.perf_counter()
    running = 0.0
    for step in progress(range(1, steps + 1), desc=f"{kind} steps"):
        x, y = get_batch(train_ids, args.block, args.batch_size, generator)
        loss = train_step(x, y)
        schedule.step()
        running += loss.item()
        if step % args.log_every == 0 or step == steps:
            done = step % args.log_every or args.log_every
            print(f"{kind} step {step:5d}/{steps}  loss {running / done:.4f}")
            running = 0.0
    per_step = (time.perf_counter() - start) / steps
    val = evaluate(model, val_ids, args.block)
    print(f"{kind} sample: {sample(model, vocab, args.sample_length, generator)!r}")
    return val, per_step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=(*MODELS, "both"), default="both", help="which model(s) to train")
    parser.add_argument("--steps", type=int, help=f"training steps (default {STEPS}; {FAST_STEPS} with --fast)")
    parser.add_argument("--fast", action="store_true", help="about a hundred steps per model (for tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager", action="store_true", help="run the training step without kiln.compile")
    parser.add_argument("--block", type=int, default=64, help="characters per training window (context length)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, help=f"AdamW's learning rate (default {LR})")
    parser.add_argument("--d-model", type=int, default=64, help="the transformer's width")
    parser.add_argument("--dropout", type=float, default=0.0, help="the transformer's dropout")
    parser.add_argument("--hidden", type=int, default=128, help="the LSTM's hidden size")
    parser.add_argument("--log-every", type=int, help="print the mean training loss every this many steps")
    parser.add_argument("--sample-length", type=int, help="characters to sample after training")
    parser.add_argument(
        "--max-ratio",
        type=float,
        help=f"exit with status 1 when val loss > this x unigram (default {MAX_RATIO}; {FAST_MAX_RATIO} with --fast)",
    )
    args = parser.parse_args(argv)
    if args.max_ratio is None:
        args.max_ratio = FAST_MAX_RATIO if args.fast else MAX_RATIO
    if args.log_every is None:
        args.log_every = 50 if args.fast else 100
    if args.sample_length is None:
        args.sample_length = 60 if args.fast else 200
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = load_data()
    vocab, train_ids, val_ids = data
    unigram = unigram_loss(train_ids, val_ids, len(vocab))
    print(f"text: {len(train_ids)} training and {len(val_ids)} validation characters, vocabulary of {len(vocab)}")
    print(f"unigram baseline: {unigram:.4f} nats/char")
    failed = []
    for kind in MODELS if args.model == "both" else (args.model,):
        start = time.perf_counter()
        val, per_step = train(kind, data, args)
        ratio = val / unigram
        print(f"{kind}: val loss {val:.4f} nats/char (unigram {unigram:.4f}, ratio {ratio:.3f}), "
              f"{per_step * 1000:.1f} ms/step, {time.perf_counter() - start:.1f} s")  # fmt: skip
        if not ratio <= args.max_ratio:  # not <=: a nan loss fails too
            failed.append(kind)
            print(f"{kind} val loss {val:.4f} is above --max-ratio {args.max_ratio} x unigram {unigram:.4f}",
                  file=sys.stderr)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
