"""Loop scenarios: Python ``for`` loops over time steps (RNN, LSTM and GRU cells, stacked, with a
read-out per step) or over layers of one shape -- the traces ``kiln.passes.roll_loops`` rolls into
loop nodes -- as training steps (forward, loss, backward, an optimizer's step) or forward only,
compiled against eager over several calls.

The loops live in helper functions of the module's preamble (no blank lines: a printed program's
preamble ends at its first), so each statement of ``f`` stays one line the shrinker can delete. How a step's input is taken varies (``unbind``, ``split`` and
``squeeze``, indexing), and so does the first state (None, or zeros made in the call). Kinked
activations (relu) run in float64 only, where a tie decided by rounding is out of reach.
"""

from __future__ import annotations

import random

from .optimizers import SPECS, optimizer, step_line, zero_grad_line
from .scenario import Builder, Scenario

HELPERS = [
    "def steps_of(x, how):",
    "    if how == 'unbind':",
    "        return x.unbind(1)",
    "    if how == 'split':",
    "        return [s.squeeze(1) for s in x.split(1, dim=1)]",
    "    return [x[:, t] for t in range(x.shape[1])]",
    "def run_time(cells, head, x, how, zeros, lstm):",
    "    states = [None] * len(cells)",
    "    if zeros:",
    "        h0 = kiln.zeros(x.shape[0], head.in_features, dtype=x.dtype)",
    "        states = [(h0, h0) if lstm else h0 for _ in cells]",
    "    outs = []",
    "    for xt in steps_of(x, how):",
    "        h = xt",
    "        for c, cell in enumerate(cells):",
    "            states[c] = cell(h, states[c])",
    "            h = states[c][0] if lstm else states[c]",
    "        outs.append(head(h))",
    "    return kiln.stack(outs, 1)",
    "def run_layers(layers, x, act):",
    "    for layer in layers:",
    "        x = x + act(layer(x)) / len(layers)",
    "    return x",
]
CELLS = {"lstm": "nn.LSTMCell", "gru": "nn.GRUCell", "rnn": "nn.RNNCell"}
SMOOTH = ("kiln.tanh", "kiln.sigmoid", "F.silu")


def _over_time(b: Builder, r: random.Random, dtype: str) -> str:
    """Cells over the time steps of ``x``; returns the expression of the model's output."""
    kind = r.choice(sorted(CELLS))
    n, steps, features, hidden = r.randint(1, 4), r.randint(4, 24), r.randint(1, 4), r.randint(2, 8)
    x = b.float_input((n, steps, features), dtype)
    extra = ", nonlinearity='relu'" if kind == "rnn" and dtype == "float64" and r.random() < 0.5 else ""
    sizes = [features] + [hidden] * r.randint(1, 2)
    cells = ", ".join(f"{CELLS[kind]}({a}, {hidden}{extra})" for a in sizes[:-1])
    b.setup += [f"cells = nn.ModuleList([{cells}]).to(kiln.{dtype})", f"head = nn.Linear({hidden}, 1).to(kiln.{dtype})",
                "model = nn.ModuleList([cells, head])"]  # fmt: skip
    how, zeros = r.choice(("unbind", "split", "index")), r.random() < 0.5
    return f"run_time(cells, head, {x}, {how!r}, {zeros}, {kind == 'lstm'})"


def _over_layers(b: Builder, r: random.Random, dtype: str) -> str:
    """Residual layers of one shape applied in turn (without the residual, a deep stack of squashing
    activations forgets its input, and a compiled copy that ignored it would pass; each step is
    divided by the depth, which bounds the growth); returns the
    expression of the model's output."""
    n, width, count = r.randint(1, 6), r.randint(2, 10), r.randint(6, 24)
    x = b.float_input((n, width), dtype)
    act = r.choice(SMOOTH + (("F.relu",) if dtype == "float64" else ()))
    bias = r.random() < 0.8
    b.setup.append(f"model = nn.ModuleList([nn.Linear({width}, {width}, bias={bias}) for _ in range({count})])"
                   f".to(kiln.{dtype})")  # fmt: skip
    return f"run_layers(model, {x}, {act})"


def generate(seed: int) -> Scenario:
    """A random loop over time steps or layers; ``f`` trains it one step (or runs it forward only)
    and returns the loss and the output."""
    r = random.Random(seed)
    b = Builder(seed)
    dtype = "float64" if r.random() < 0.5 else "float32"
    b.preamble += HELPERS
    b.setup.append(f"kiln.manual_seed({seed % 1000})")
    output = _over_time(b, r, dtype) if r.random() < 0.6 else _over_layers(b, r, dtype)
    b.state_names.append("model")
    train = r.random() < 0.8
    if train:
        name = r.choice(sorted(set(SPECS) - {"Rprop", "LBFGS"}))
        optimizer(b, r, name, "model.parameters()", 1, default_values=r.random() < 0.5,
                  min_eps=1e-6 if dtype == "float64" else 1e-3)  # fmt: skip
        b.stmt(zero_grad_line(r), "zero_grad")
    b.stmt(f"h = {output}", "loop")
    b.stmt("loss = (h * h).mean()", "loss")
    if train:
        b.stmt("loss.backward()", "backward")
        b.stmt(step_line(name, "model", "", "", ""), f"step:{name}")
    rtol = 1e-8 if dtype == "float64" else 2e-4
    return b.scenario("loops", "loss.detach(), h.detach()", scale=1.0, rtol=rtol)
