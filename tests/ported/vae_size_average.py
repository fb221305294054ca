"""A variational autoencoder written as old PyTorch tutorials write it: the reconstruction term is
``F.binary_cross_entropy(..., size_average=False)`` (summed), the KL term by hand, Adam, a mask
assignment on the gradients' way (``x[x < 0.02] = 0``), and the losses logged to TensorBoard. A plain
PyTorch program."""

import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.tensorboard import SummaryWriter


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, 8)
        self.fc22 = nn.Linear(32, 8)
        self.fc3 = nn.Linear(8, 32)
        self.fc4 = nn.Linear(32, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x, eps):
        mu, logvar = self.encode(x)
        z = mu + eps * torch.exp(0.5 * logvar)  # the noise comes from numpy: both libraries draw the same
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x, size_average=False)
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def main(path):
    rng = np.random.default_rng(0)
    data = torch.from_numpy(rng.uniform(0, 1, (128, 64)).astype(np.float32))
    data[data < 0.02] = 0
    model = VAE()
    init = np.random.default_rng(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy((init.standard_normal(tuple(p.shape)) * 0.2).astype(np.float32)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    writer = SummaryWriter(os.path.join(os.path.dirname(path), "runs"))
    for step in range(8):
        eps = torch.from_numpy(rng.standard_normal((128, 8)).astype(np.float32))
        optimizer.zero_grad()
        recon, mu, logvar = model(data, eps)
        loss = loss_function(recon, data, mu, logvar)
        loss.backward()
        optimizer.step()
        writer.add_scalar("loss", loss.item(), step)
        print(f"loss {loss.item() / len(data):.6f}")
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1])
