"""An MLP classifier trained from a DataLoader with worker processes, SGD with Nesterov momentum and
StepLR, then saved and loaded back (state_dict). A plain PyTorch program."""

import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def init(model, seed):
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy((rng.standard_normal(tuple(p.shape)) * 0.2).astype(np.float32)))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = torch.tanh(self.fc2(x))
        return self.fc3(x)


def main(path):
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((256, 20)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 4, 256))
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=False, num_workers=2)
    model = MLP()
    init(model, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for _epoch in range(4):
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(xb)
        scheduler.step()
        print(f"loss {total / len(x):.6f}")
    torch.save(model.state_dict(), path)
    restored = MLP()
    restored.load_state_dict(torch.load(path))
    restored.eval()
    with torch.no_grad():
        print(f"loss {F.cross_entropy(restored(x), y).item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1])
