"""A two-layer graph convolutional network as pygcn writes it: a normalized sparse adjacency built
with torch.sparse.FloatTensor, torch.spmm in each layer's forward, Adam with weight decay. A plain
PyTorch program."""

import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parameter import Parameter


class GraphConvolution(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = Parameter(torch.FloatTensor(in_features, out_features))
        self.bias = Parameter(torch.FloatTensor(out_features))
        stdv = 1.0 / math.sqrt(out_features)
        self.weight.data.uniform_(-stdv, stdv)
        self.bias.data.uniform_(-stdv, stdv)

    def forward(self, input, adj):
        support = torch.mm(input, self.weight)
        return torch.spmm(adj, support) + self.bias


class GCN(nn.Module):
    def __init__(self, nfeat, nhid, nclass):
        super().__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)

    def forward(self, x, adj):
        x = F.relu(self.gc1(x, adj))
        return F.log_softmax(self.gc2(x, adj), dim=1)


def adjacency(rng, nodes, edges):
    rows, cols = rng.integers(0, nodes, edges), rng.integers(0, nodes, edges)
    dense = np.zeros((nodes, nodes), np.float32)
    dense[rows, cols] = dense[cols, rows] = 1.0
    dense += np.eye(nodes, dtype=np.float32)
    dense /= dense.sum(1, keepdims=True)  # row-normalized, as pygcn's normalize()
    r, c = np.nonzero(dense)
    indices = torch.from_numpy(np.vstack((r, c)).astype(np.int64))
    return torch.sparse.FloatTensor(indices, torch.from_numpy(dense[r, c]), torch.Size(dense.shape))


def main(path):
    rng = np.random.default_rng(0)
    nodes = 40
    adj = adjacency(rng, nodes, 80)
    features = torch.from_numpy(rng.standard_normal((nodes, 12)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, 3, nodes))
    model = GCN(12, 16, 3)
    init = np.random.default_rng(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy((init.standard_normal(tuple(p.shape)) * 0.3).astype(np.float32)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(10):
        optimizer.zero_grad()
        output = model(features, adj)
        loss = F.nll_loss(output, labels)
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1])
