"""A GRU sequence classifier with RMSprop and a multi-step learning-rate schedule, gradient
accumulation over two batches, and a custom loss written with tensor ops. A plain PyTorch program."""

import sys

import numpy as np
import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(5, 12, batch_first=True)
        self.out = nn.Linear(12, 2)

    def forward(self, x):
        _, h = self.gru(x)
        return self.out(h[-1])


def main(path):
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((32, 7, 5)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((32, 2)).astype(np.float32))
    model = Classifier()
    params = np.random.default_rng(4)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy((params.standard_normal(tuple(p.shape)) * 0.3).astype(np.float32)))
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[3, 5], gamma=0.3)
    for _step in range(7):
        optimizer.zero_grad()
        for half in (slice(0, 16), slice(16, 32)):
            diff = model(x[half]) - y[half]
            loss = (diff.abs() + 0.5 * diff.pow(2)).mean() / 2
            loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1])
