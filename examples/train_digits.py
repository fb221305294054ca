"""Train a small MLP on scikit-learn's handwritten digits with eager kiln tensors and autograd.

    python examples/train_digits.py [--epochs N] [--fast] [--seed S] [--min-accuracy A]

Plain Python, no ``nn.Module`` and no optimizer class: the parameters are kiln tensors that
require grad, the forward pass is ``relu(x @ w1 + b1) @ w2 + b2``, ``loss.backward()`` fills
their ``.grad``, and SGD with momentum updates them in place under ``kiln.no_grad()``. The
data set (1,797 8x8 images, bundled with scikit-learn: no download) is split 80/20 with a
fixed seed and standardized with the training set's statistics. Exits with status 1 when the
test accuracy is below ``--min-accuracy``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from sklearn.datasets import load_digits

import kiln
import kiln.nn.functional as F

EPOCHS, FAST_EPOCHS = 20, 5
MIN_ACCURACY, FAST_MIN_ACCURACY = 0.95, 0.90


def load_data(generator: kiln.Generator, test_fraction: float = 0.2):
    """(x_train, y_train, x_test, y_test): standardized float32 features, int64 labels."""
    digits = load_digits()
    x = kiln.tensor(digits.data, dtype=kiln.float32)
    y = kiln.tensor(digits.target, dtype=kiln.int64)
    order = kiln.randperm(len(x), generator=generator)
    n_test = round(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    x_train, x_test = x[train], x[test]

    # Statistics of the training set only, so nothing about the test set leaks into training.
    mean = x_train.mean(dim=0)
    std = ((x_train - mean) ** 2).mean(dim=0).sqrt()
    std = kiln.where(std > 0, std, 1.0)  # some border pixels are 0 in every training image
    return (x_train - mean) / std, y[train], (x_test - mean) / std, y[test]


def init_params(sizes: list[int], generator: kiln.Generator) -> list[kiln.Tensor]:
    """Weights and biases uniform in +-1/sqrt(fan_in), as ``nn.Linear`` initializes them."""
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = 1.0 / math.sqrt(fan_in)
        for shape in ((fan_in, fan_out), (fan_out,)):
            p = (kiln.rand(*shape, generator=generator) * 2 - 1) * bound
            params.append(p.requires_grad_())
    return params


def forward(params: list[kiln.Tensor], x: kiln.Tensor) -> kiln.Tensor:
    """Logits of an MLP with ReLU between layers; ``params`` is [w1, b1, w2, b2, ...]."""
    for i in range(0, len(params), 2):
        if i:
            x = kiln.relu(x)
        x = x @ params[i] + params[i + 1]
    return x


def sgd_momentum_step(params: list[kiln.Tensor], velocities: list[kiln.Tensor], lr: float, momentum: float) -> None:
    """``v = momentum * v + grad; p -= lr * v`` in place, outside the graph, then clear the grads."""
    with kiln.no_grad():
        for p, v in zip(params, velocities):
            v.mul_(momentum).add_(p.grad)
            p.sub_(v, alpha=lr)
            p.grad = None


def accuracy(params: list[kiln.Tensor], x: kiln.Tensor, y: kiln.Tensor) -> float:
    with kiln.no_grad():
        predicted = forward(params, x).argmax(dim=1)
    return (predicted == y).float().mean().item()


def train(args: argparse.Namespace) -> float:
    """Train, printing the mean loss per epoch; return the test accuracy."""
    generator = kiln.Generator().manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(generator)
    params = init_params([x_train.shape[1], args.hidden, 10], generator)
    velocities = [kiln.zeros_like(p) for p in params]
    n = len(x_train)
    for epoch in range(1, args.epochs + 1):
        order = kiln.randperm(n, generator=generator)
        total = 0.0
        for start in range(0, n, args.batch_size):
            batch = order[start : start + args.batch_size]
            loss = F.cross_entropy(forward(params, x_train[batch]), y_train[batch])
            loss.backward()
            sgd_momentum_step(params, velocities, args.lr, args.momentum)
            total += loss.item() * len(batch)
        print(f"epoch {epoch:3d}/{args.epochs}  loss {total / n:.4f}")
    return accuracy(params, x_test, y_test)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--epochs", type=int, help=f"passes over the training set (default {EPOCHS}, {FAST_EPOCHS} with --fast)"
    )
    parser.add_argument("--fast", action="store_true", help="a few epochs only (for tests)")
    parser.add_argument("--hidden", type=int, default=128, help="width of the hidden layer")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--min-accuracy",
        type=float,
        help=f"exit with status 1 below this test accuracy (default {MIN_ACCURACY}, {FAST_MIN_ACCURACY} with --fast)",
    )
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = FAST_EPOCHS if args.fast else EPOCHS
    if args.min_accuracy is None:
        args.min_accuracy = FAST_MIN_ACCURACY if args.fast else MIN_ACCURACY
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    test_accuracy = train(args)
    print(f"test accuracy: {test_accuracy:.2%}")
    print(f"wall time: {time.perf_counter() - start:.2f} s")
    if test_accuracy < args.min_accuracy:
        print(f"test accuracy {test_accuracy:.2%} is below --min-accuracy {args.min_accuracy:.2%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
