"""A small CNN with BatchNorm and max pooling, Adam and cosine annealing, train and eval modes.
A plain PyTorch program."""

import sys

import numpy as np
import torch
from torch import nn


def init(model, seed):
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.0 if name.endswith("bias") else 0.3
            p.copy_(torch.from_numpy((rng.standard_normal(tuple(p.shape)) * scale).astype(np.float32)))


def main(path):
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((64, 1, 12, 12)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 3, 64))
    model = nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    )
    init(model, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=6)
    loss_fn = nn.CrossEntropyLoss()
    for _step in range(6):
        model.train()
        for i in range(0, 64, 16):
            optimizer.zero_grad()
            loss = loss_fn(model(x[i : i + 16]), y[i : i + 16])
            loss.backward()
            optimizer.step()
        scheduler.step()
        model.eval()
        with torch.no_grad():
            print(f"loss {loss_fn(model(x), y).item():.6f}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 6}, path)
    checkpoint = torch.load(path)
    print(f"loss {float(checkpoint['step']):.6f}")


if __name__ == "__main__":
    main(sys.argv[1])
