"""Model scenarios: whole training steps (forward, loss, backward, optimizer step) of small conv
nets, MLPs, embedding models and recurrent ones (LSTM, GRU, RNN), compiled against eager over
several calls.

The conv nets take kiln's direct-convolution paths (unit stride, filters with C*kh*kw at most 256
and above it) with fused bias and activation epilogues, and strided, dilated and grouped ones;
then BatchNorm/GroupNorm, max/avg pooling (kernel 1 too), dropout (in eval or training mode).
Embeddings read repeated indices, sometimes with ``padding_idx``.

False differences are kept out by construction. A program with kinks (relu, max pooling) runs
in float64, where a tie decided by rounding is out of reach. A gradient that is 0 in exact
arithmetic comes out as rounding noise (a bias before a normalization that removes it, directly
or through a linear path: pooling, a 1x1 convolution, an activation on its linear side), and an
optimizer that divides by the gradients' size would turn that noise into a full step: such a
bias is left out where it is adjacent, Rprop (the sign of the gradient) is left to the optim
kind's models, which have no such gradients, and ``eps`` is at least 1e-6 (float64) or 1e-3
(float32), which keeps the noise's step below the tolerance.
"""

from __future__ import annotations

import random

from .optimizers import CLOSURE, SPECS, optimizer, scheduler, step_line, zero_grad_line
from .scenario import Builder, Scenario

SMOOTH = ("nn.Tanh()", "nn.GELU()", "nn.SiLU()", "nn.Sigmoid()", "nn.GELU(approximate='tanh')")
KINKED = ("nn.ReLU()", "nn.LeakyReLU(0.1)", "nn.ReLU6()", "nn.Hardtanh()")


class Net:
    """The layers of a model being generated, and the shape of what flows through them."""

    def __init__(self, r: random.Random, smooth: bool, shape: tuple):
        self.r, self.smooth, self.shape = r, smooth, shape
        self.layers: list[tuple[str, str]] = []  # (constructor, tag)

    def add(self, layer: str, tag: str, shape: tuple | None = None) -> None:
        self.layers.append((layer, tag))
        self.shape = shape or self.shape

    def activation(self) -> None:
        if self.r.random() < 0.85:
            act = self.r.choice(SMOOTH if self.smooth else SMOOTH + KINKED + KINKED)
            self.add(act, act.split("(")[0].removeprefix("nn.").lower())

    def dropout(self) -> None:
        if self.r.random() < 0.2:
            self.add(f"nn.Dropout({self.r.choice((0.2, 0.5))})", "dropout")


def _conv_size(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def conv_block(net: Net, r: random.Random, first: bool) -> None:
    n, c, h, w = net.shape
    o = r.randint(1, 6) if r.random() < 0.85 else r.randint(8, 12)
    k = r.choice((1, 2, 3, 3, 5)) if not first or c < 12 else r.choice((3, 5))  # 12 channels: C*k*k past 256
    stride = 1 if r.random() < 0.75 else 2
    pad, dil = r.choice((0, k // 2)), 2 if r.random() < 0.1 else 1
    if _conv_size(h, k, stride, pad, dil) < 1 or _conv_size(w, k, stride, pad, dil) < 1:
        k, stride, pad, dil = 1, 1, 0, 1
    groups = r.choice([g for g in (2, 3) if c % g == 0 and o % g == 0] or [1]) if r.random() < 0.15 else 1
    h, w = _conv_size(h, k, stride, pad, dil), _conv_size(w, k, stride, pad, dil)
    norm = r.choice((None, None, "batch", "group")) if n * h * w > 1 else None
    norm_groups = r.choice([g for g in range(1, o + 1) if o % g == 0])
    bias = norm is None or (norm == "group" and norm_groups < o)  # else the norm removes the bias (see above)
    tag = f"conv2d k{k} s{stride}" + (" grouped" if groups > 1 else "") + (" C*k*k>256" if c * k * k > 256 else "")
    net.add(f"nn.Conv2d({c}, {o}, {k}, stride={stride}, padding={pad}, dilation={dil}, groups={groups}, bias={bias})",
            tag, (n, o, h, w))  # fmt: skip
    if norm == "batch":
        net.add(f"nn.BatchNorm2d({o})", "batch_norm2d")
    elif norm == "group":
        net.add(f"nn.GroupNorm({norm_groups}, {o})", "group_norm")
    net.activation()
    pool(net, r)
    net.dropout()


def pool(net: Net, r: random.Random) -> None:
    n, c, h, w = net.shape
    kind = r.choice(("avg", "avg", "max", "max", None)) if not net.smooth else r.choice(("avg", None))
    if kind is None:
        return
    k = min(r.choice((1, 1, 2, 2, 3)), h, w)
    stride = r.choice((None, 1, 2))
    pad = r.randint(0, k // 2)
    s = stride or k
    h, w = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    layer = "MaxPool2d" if kind == "max" else "AvgPool2d"
    net.add(f"nn.{layer}({k}, stride={stride}, padding={pad})", f"{kind}_pool2d k{k}", (n, c, h, w))


def conv_net(b: Builder, r: random.Random, dtype: str, smooth: bool) -> Net:
    c = 12 if r.random() < 0.15 else r.randint(1, 4)
    shape = (r.randint(1, 3), c, r.randint(4, 9), r.randint(4, 9))
    b.float_input(shape, dtype)
    net = Net(r, smooth, shape)
    for i in range(r.randint(1, 2)):
        conv_block(net, r, first=i == 0)
    n, c, h, w = net.shape
    net.add("nn.Flatten()", "flatten", (n, c * h * w))
    return net


def mlp(b: Builder, r: random.Random, dtype: str, smooth: bool) -> Net:
    n, d = r.randint(2, 4), r.randint(1, 6)
    b.float_input((n, d), dtype)
    net = Net(r, smooth, (n, d))
    for _ in range(r.randint(1, 3)):
        out = r.randint(1, 8)
        norm = r.choice((None, None, "batch", "layer"))
        net.add(f"nn.Linear({net.shape[1]}, {out}, bias={norm != 'batch'})", "linear", (n, out))
        if norm == "batch":
            net.add(f"nn.BatchNorm1d({out})", "batch_norm1d")
        elif norm == "layer":
            net.add(f"nn.LayerNorm({out}, elementwise_affine={r.random() < 0.8})", "layer_norm")
        net.activation()
        net.dropout()
    return net


def embedding(b: Builder, r: random.Random, dtype: str, smooth: bool) -> Net:
    n, length, vocab, dim = r.randint(1, 3), r.randint(2, 6), r.randint(3, 10), r.randint(2, 6)
    b.int_input((n, length), min(vocab, max(2, n * length // 2)))  # fewer values than indices: repeats
    net = Net(r, smooth, (n, length, dim))
    padded = r.random() < 0.5  # (kiln's embedding has no max_norm: NotImplementedError)
    extra = f", padding_idx={r.choice((0, vocab - 1))}" if padded else ""
    net.add(f"nn.Embedding({vocab}, {dim}{extra})", "embedding padding_idx" if padded else "embedding")
    if r.random() < 0.4:
        net.add(f"nn.LayerNorm({dim})", "layer_norm")
    net.activation()
    net.add("nn.Flatten()", "flatten", (n, length * dim))
    return net


#: The module that puts a recurrent layer in an ``nn.Sequential``: its output, not its final states.
RECURRENT_PREAMBLE = [
    "class LastOutput(nn.Module):",
    "    def __init__(self, rnn):",
    "        super().__init__()",
    "        self.rnn = rnn",
    "    def forward(self, x):",  # no blank line: a scenario's preamble is read back up to one
    "        return self.rnn(x)[0]",
]


def recurrent(b: Builder, r: random.Random, dtype: str, smooth: bool) -> Net:
    """nn.LSTM/GRU/RNN over (batch, time, features), batch_first (traced: rnn_scan per direction)."""
    n, length, d, hidden = r.randint(1, 3), r.randint(1, 6), r.randint(1, 5), r.randint(1, 6)
    b.float_input((n, length, d), dtype)
    net = Net(r, smooth, (n, length, d))
    kind = r.choice(("LSTM", "GRU", "RNN"))
    layers, directions = r.choice((1, 1, 2)), r.choice((1, 2))
    extra = ", bidirectional=True" if directions == 2 else ""
    extra += ", bias=False" if r.random() < 0.2 else ""
    extra += ", nonlinearity='relu'" if kind == "RNN" and not smooth and r.random() < 0.5 else ""
    b.preamble += RECURRENT_PREAMBLE
    rnn = f"nn.{kind}({d}, {hidden}, num_layers={layers}, batch_first=True{extra})"
    net.add(f"LastOutput({rnn})", kind.lower(), (n, length, directions * hidden))
    net.activation()
    net.add("nn.Flatten()", "flatten", (n, length * directions * hidden))
    return net


FAMILIES = {"conv": conv_net, "mlp": mlp, "embedding": embedding, "recurrent": recurrent}


def training_step(b: Builder, r: random.Random, net: Net, name: str, y: str) -> None:
    """The body of ``f``: zero_grad, the forward (whole, or one statement per layer, which the
    shrinker can delete), the loss, backward and the optimizer's step."""
    x = b.arg_names[0]
    if name == "LBFGS":
        b.preamble += CLOSURE  # its step evaluates the model again, through a closure
    else:
        b.stmt(zero_grad_line(r), "zero_grad")
    if r.random() < 0.3:
        b.stmt(f"h = model({x})", "model")
    else:
        b.stmt(f"h = model[0]({x})", net.layers[0][1])
        for i, (_, tag) in enumerate(net.layers[1:], 1):
            b.stmt(f"h = model[{i}](h)", tag)
    b.stmt(f"loss = loss_fn(h, {y})", "loss")
    if name != "LBFGS":
        b.stmt("loss.backward()", "backward")
    b.stmt(step_line(name, "model", x, y, "loss_fn"), f"step:{name}")


def generate(seed: int) -> Scenario:
    """A random model, loss and optimizer; ``f`` is one training step returning the loss and output."""
    r = random.Random(seed)
    b = Builder(seed)
    family = r.choice(("conv", "conv", "mlp", "embedding"))
    if random.Random(seed * 7919 + 1).random() < 0.15:  # its own stream: the other seeds' programs stay as they were
        family = "recurrent"
    name = r.choice(sorted(set(SPECS) - {"Rprop"}))
    dtype = "float64" if name == "LBFGS" or r.random() < 0.6 else "float32"
    net = FAMILIES[family](b, r, dtype, smooth=dtype == "float32")
    classes = r.randint(2, 5)  # one class: a cross entropy of 0 whatever the model
    net.add(f"nn.Linear({net.shape[1]}, {classes})", "linear", (net.shape[0], classes))
    classify = r.random() < 0.6
    y = b.int_input((net.shape[0],), classes) if classify else b.float_input((net.shape[0], classes), dtype)
    loss_fn = r.choice(("F.cross_entropy", "lambda out, y: F.cross_entropy(out, y, label_smoothing=0.1)")) \
        if classify else r.choice(("F.mse_loss", "F.smooth_l1_loss"))  # fmt: skip
    layers = ", ".join(layer for layer, _ in net.layers)
    b.setup += [f"kiln.manual_seed({seed % 1000})", f"model = nn.Sequential({layers}).to(kiln.{dtype})",
                f"loss_fn = {loss_fn}"]  # fmt: skip
    b.state_names.append("model")
    for i, (layer, _) in enumerate(net.layers):
        if layer.startswith("nn.Dropout") and r.random() < 0.5:
            b.setup.append(f"model[{i}].eval()")  # dropout in eval mode, the rest training
    groups = 2 if r.random() < 0.2 and name != "LBFGS" else 1  # LBFGS takes one group
    min_eps = 1e-6 if dtype == "float64" else 1e-3
    values = optimizer(b, r, name, "model.parameters()", groups, default_values=r.random() < 0.5, min_eps=min_eps)
    training_step(b, r, net, name, y)
    if name != "LBFGS" and r.random() < 0.2:
        scheduler(b, r, name, values, inside=False)
    if r.random() < 0.15:  # the training flag is guarded: a switch must retrace
        b.action(r.randint(1, 4), "model.eval()", "eval")
        b.action(5, "model.train()", "train")
    # float32: reductions over a batch and a window (a few hundred terms) round to about 1e-6
    rtol = 1e-8 if dtype == "float64" else 2e-4
    return b.scenario("models", "loss.detach(), h.detach()", scale=1.0, rtol=rtol)
