"""The benchmark models, written once against a library (``kiln`` or ``torch``: the same API).

- ``mlp``: Linear 784-512-512-10 with ReLU;
- ``lenet``: LeNet-5 on 1x28x28 (MNIST-shaped) input: Conv2d(1, 6, 5, pad 2) - ReLU - MaxPool(2) -
  Conv2d(6, 16, 5) - ReLU - MaxPool(2) - Flatten - Linear(400, 120) - ReLU - Linear(120, 84) -
  ReLU - Linear(84, 10);
- ``gpt``: a small GPT: token + position embeddings, ``layers`` pre-LayerNorm blocks of causal
  multi-head self-attention and a 4x MLP with tanh-GELU, a final LayerNorm and a linear head;
- ``resnet18``: ResNet-18 for 3x32x32 (CIFAR) input: a 3x3 stem without max-pooling, four stages
  of two basic blocks (64, 128, 256, 512 channels; BatchNorm; 1x1 projection shortcuts), global
  average pooling and a linear head;
- ``lstm_lm``: a word-level language model: embedding, a multi-layer ``nn.LSTM`` (batch-first),
  a linear head over the vocabulary;
- ``ncf``: neural collaborative filtering (He et al. 2017, "NeuMF"): a GMF branch (the product of
  user and item embeddings) next to an MLP over their concatenation, one logit per pair.

:func:`same_weights` copies one model's parameters into another built the same way, so every
implementation of a workload starts from the same numbers and can be checked against the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

MLP_SIZES = (784, 512, 512, 10)


def mlp(lib):
    nn = lib.nn
    layers = []
    for fan_in, fan_out in zip(MLP_SIZES[:-1], MLP_SIZES[1:], strict=True):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def lenet(lib):
    nn = lib.nn
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    )  # fmt: skip


def gpt(lib, *, vocab: int, d: int, heads: int, layers: int, context: int):
    """A GPT built from ``lib.nn`` modules; ``model(idx)`` maps (B, T) token ids to (B, T, vocab) logits."""
    nn = lib.nn
    F = nn.functional
    to_tensor = _from_numpy(lib)
    scale = 1.0 / math.sqrt(d // heads)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.out = nn.Linear(4 * d, d)

        def forward(self, x, mask):
            b, t, c = x.shape
            q, k, v = (
                z.reshape(b, t, heads, c // heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=-1)
            )
            attention = F.softmax((q @ k.transpose(-2, -1)) * scale + mask[:t, :t], dim=-1)
            x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocab, d)
            self.positions = nn.Embedding(context, d)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            # buffers, so that model.to(device) moves them. The additive causal mask is -inf above the
            # diagonal (every row keeps its diagonal, so no row is all -inf).
            self.register_buffer(
                "mask", to_tensor(np.triu(np.full((context, context), -np.inf, np.float32), 1)), persistent=False
            )
            self.register_buffer("position_ids", to_tensor(np.arange(context, dtype=np.int64)), persistent=False)

        def forward(self, idx):
            x = self.tokens(idx) + self.positions(self.position_ids[: idx.shape[1]])
            for block in self.blocks:
                x = block(x, self.mask)
            return self.head(self.ln(x))

    return GPT()


def resnet18(lib, classes: int = 10):
    nn = lib.nn
    relu = nn.functional.relu

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = relu(self.bn1(self.conv1(x)))
            return relu(self.bn2(self.conv2(out)) + self.shortcut(x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn = nn.BatchNorm2d(64)
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
                blocks.append(BasicBlock(cin, cout, stride))
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = self.blocks(relu(self.bn(self.conv(x))))
            return self.fc(self.pool(x).flatten(1))

    return ResNet18()


def lstm_lm(lib, *, vocab: int, hidden: int, layers: int):
    """``model(idx)`` maps (B, T) token ids to (B, T, vocab) logits; the state starts at zero each call."""
    nn = lib.nn

    class LSTMLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab, hidden)
            self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, idx):
            out, _ = self.lstm(self.embedding(idx))
            return self.head(out)

    return LSTMLM()


def ncf(lib, *, users: int, items: int, factors: int, mlp: tuple[int, ...]):
    """``model(users, items)``: one logit per (user, item) pair (NeuMF: GMF and MLP side by side)."""
    nn = lib.nn

    class NCF(nn.Module):
        def __init__(self):
            super().__init__()
            self.gmf_user = nn.Embedding(users, factors)
            self.gmf_item = nn.Embedding(items, factors)
            self.mlp_user = nn.Embedding(users, mlp[0] // 2)
            self.mlp_item = nn.Embedding(items, mlp[0] // 2)
            layers = []
            for fan_in, fan_out in zip(mlp[:-1], mlp[1:], strict=True):
                layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
            self.mlp = nn.Sequential(*layers)
            self.head = nn.Linear(factors + mlp[-1], 1)

        def forward(self, u, i):
            gmf = self.gmf_user(u) * self.gmf_item(i)
            deep = self.mlp(lib.cat([self.mlp_user(u), self.mlp_item(i)], dim=1))
            return self.head(lib.cat([gmf, deep], dim=1)).squeeze(1)

    return NCF()


def _from_numpy(lib) -> Callable[[np.ndarray], object]:
    return lambda a: lib.from_numpy(np.ascontiguousarray(a).copy())


def same_weights(source, target, torch) -> None:
    """Copy kiln model ``source``'s parameters into ``target`` (a torch model built the same way)."""
    with torch.no_grad():
        pairs = zip(source.parameters(), target.parameters(), strict=True)
        for p, q in pairs:
            q.copy_(torch.from_numpy(p.detach().numpy().copy()))


def train_step(lib, model, optimizer, x, y, loss_fn=None) -> Callable[[], object]:
    """One training step: forward, the loss (cross-entropy unless ``loss_fn``), backward, the
    optimizer's step, zero_grad; returns the loss, detached (kiln does not cache a call whose
    result requires grad while it updated parameters in place)."""
    loss_fn = loss_fn or lib.nn.functional.cross_entropy

    def step():
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return step


def forward_backward(lib, model, idx, targets) -> Callable[[], object]:
    """The GPT's forward and backward on one batch: gradients reset to None, then filled."""
    cross_entropy = lib.nn.functional.cross_entropy
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        logits = model(idx)
        loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        return loss.detach()

    return step


def jax_mlp_step(jax, weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> Callable[[], object]:
    """The MLP's training step in JAX, jitted, Adam written out as in ``torch.optim.Adam``
    (lr 1e-3); ``weights`` in ``mlp``'s parameter order. Each call takes one step, returns the loss."""
    jnp = jax.numpy
    x, y = jnp.asarray(x), jnp.asarray(y)
    lr, beta1, beta2, eps = 1e-3, 0.9, 0.999, 1e-8

    def loss_fn(params):
        h = x
        for i in range(0, len(params), 2):
            h = h @ params[i].T + params[i + 1]
            if i + 2 < len(params):
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def step(params, m, v, t):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        t = t + 1
        m = [beta1 * a + (1 - beta1) * g for a, g in zip(m, grads, strict=True)]
        v = [beta2 * a + (1 - beta2) * g * g for a, g in zip(v, grads, strict=True)]
        scale = lr / (1 - beta1**t)
        root = jnp.sqrt(1 - beta2**t)
        params = [p - scale * a / (jnp.sqrt(b) / root + eps) for p, a, b in zip(params, m, v, strict=True)]
        return params, m, v, t, loss

    jitted = jax.jit(step)
    params = [jnp.asarray(w) for w in weights]
    state = [params, [jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params], jnp.float32(0)]

    def run():
        *state[:], loss = jitted(*state)  # the new params, moments and count replace the old
        return loss.block_until_ready()

    return run
