"""A character-level LSTM language model: Embedding, a 2-layer batch-first LSTM, a linear head,
AdamW with gradient clipping and an exponential learning-rate decay. A plain PyTorch program."""

import sys

import numpy as np
import torch
import torch.nn as nn


class CharLM(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, idx):
        out, (h, c) = self.lstm(self.embed(idx))
        return self.head(out)


def main(path):
    rng = np.random.default_rng(0)
    text = rng.integers(0, 12, (8, 17))
    inputs, targets = torch.from_numpy(text[:, :-1]), torch.from_numpy(text[:, 1:])
    model = CharLM(12, 16)
    params = np.random.default_rng(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy((params.standard_normal(tuple(p.shape)) * 0.3).astype(np.float32)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    criterion = nn.CrossEntropyLoss()
    for _step in range(8):
        optimizer.zero_grad()
        logits = model(inputs)
        loss = criterion(logits.reshape(-1, 12), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1])
