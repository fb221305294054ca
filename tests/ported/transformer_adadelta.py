"""A Transformer encoder (two post-norm layers, no dropout) over embedded tokens with a causal
mask, trained with Adadelta and a LambdaLR warm-up. A plain PyTorch program."""

import math
import sys

import numpy as np
import torch
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self, vocab=16, d=24, heads=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=48, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.scale = math.sqrt(d)

    def forward(self, idx):
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        return self.head(self.encoder(self.embed(idx) * self.scale, mask=mask, is_causal=True))


def main(path):
    rng = np.random.default_rng(0)
    tokens = torch.from_numpy(rng.integers(0, 16, (6, 10)))
    model = Encoder()
    params = np.random.default_rng(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 1.0 if "norm" in name and name.endswith("weight") else 0.2
            base = 1.0 if scale == 1.0 else 0.0
            p.copy_(torch.from_numpy((base + params.standard_normal(tuple(p.shape)) * 0.2).astype(np.float32)))
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))
    for _step in range(6):
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 16), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1])
