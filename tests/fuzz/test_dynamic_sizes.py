"""Random programs called with varying sizes, compiled against eager (``frontend/jit/dynamic.py``).

Each program is a random chain of batch-preserving ops over an input of shape ``(batch, F)`` (and
integer targets of ``(batch,)``), or of ``(2, length, F)`` or ``(batch, batch + 1, F)`` (a sequence
length varying, or two sizes at once, flattened to rows and back by the views): elementwise ops with captured weights, linear layers, softmax and
log_softmax, sums over the features, views with ``-1`` and with ``x.shape[0]``, random draws of the
hidden values' shape (dropout, noise), numbers Python computes from a size (``n % 5``, one number
at two sizes), a branch on a size's text, steps read from either end of the dynamic dim, means over the batch, cross-entropy,
a result that views the input, and optionally a backward pass and an SGD step. It is called at batch sizes that repeat and change (with a size 1
among them, which specializes) and compared with the same program run eagerly at every call, both
from the same seed: values, the parameters after each step, and the random generator's state. Most
programs become dynamic at their second size; none may differ from eager, and none may trace again for a
size >= 2 once dynamic.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F

SIZES = (6, 6, 11, 3, 1, 17, 6, 2, 11)
PROGRAMS = 24


def _shape(layout: str, n: int, features: int) -> tuple[int, ...]:
    return {"batch": (n, features), "length": (2, n, features), "both": (n, n + 1, features)}[layout]


def _program(seed: int, layout: str = "batch"):
    """``(make, description)``: ``make()`` builds the program's parameters and its step function."""
    r = random.Random(seed)
    features = r.choice((3, 4, 8))
    ops = [r.choice(("unary", "binary", "linear", "softmax", "sum", "view", "view_n", "scale"))
           for _ in range(r.randint(2, 6))]  # fmt: skip
    draws = random.Random(seed * 7919 + 1)  # its own stream: the programs without a draw stay as they were
    if draws.random() < 0.5:
        ops.insert(draws.randint(0, len(ops)), draws.choice(("dropout", "noise")))
    # numbers Python computes from a size (n % 5 is 1 at both 6 and 11: one constant in both traces) and
    # steps read from either end of the dynamic dim; a result viewing the input: streams of their own too
    extra = random.Random(seed * 104729 + 3)
    if extra.random() < 0.5:
        ops.insert(extra.randint(0, len(ops)), extra.choice(("size_number", "ends")))
    # a branch on a size's text, taken alike at 6 and 11 ("6", "11") and the other way at 3: a stream of its own
    text = random.Random(seed * 15485863 + 5)
    if text.random() < 0.3:
        ops.insert(text.randint(0, len(ops)), "size_text")
    loss = r.choice(("mean", "cross_entropy", "sum_over_batch", "none"))
    if loss == "none" and extra.random() < 0.3:
        loss = "input_view"
    train = loss != "none" and r.random() < 0.6 and any(op in ("binary", "linear") for op in ops)  # has parameters

    def make():
        rng = np.random.default_rng(seed)
        weights = [kiln.tensor(rng.normal(size=(features, features)).astype(np.float32) * 0.5, requires_grad=train)
                   for _ in ops]  # fmt: skip
        bias = kiln.tensor(rng.normal(size=(features,)).astype(np.float32), requires_grad=train)
        opt = kiln.optim.SGD([*weights, bias], lr=0.05) if train else None

        def step(x, target):
            h = x
            for op, w in zip(ops, weights, strict=True):
                if op == "unary":
                    h = kiln.tanh(h) if seed % 2 else F.relu(h)
                elif op == "binary":
                    h = h * bias + h
                elif op == "linear":
                    h = h @ w + bias
                elif op == "softmax":
                    h = F.log_softmax(h, dim=-1) if seed % 3 else F.softmax(h, dim=-1)
                elif op == "dropout":
                    h = F.dropout(h, 0.3, training=True)
                elif op == "noise":  # n * 3 elements where F is 3: the advance rounds up to whole blocks
                    h = h + kiln.randn(h.shape) * 0.1 + kiln.rand_like(h)
                elif op == "sum":
                    h = h - h.sum(-1, keepdim=True) / features
                elif op == "view" and layout != "batch":  # rows of every leading size, and back
                    h = h.reshape(-1, features).view(h.shape)
                elif op == "view_n" and layout != "batch":
                    h = h.reshape(x.shape[0], -1).view(h.shape) * 1.5
                elif op == "view":
                    h = (
                        h.view(-1, 2, features // 2 if features % 2 == 0 else features).reshape(-1, features)
                        if features % 2 == 0
                        else h.view(-1, features)
                    )
                elif op == "view_n":
                    h = h.reshape(x.shape[0], -1) * 1.5
                elif op == "size_number":
                    n = x.shape[0] if layout == "batch" else x.shape[1]
                    h = h * (n % 5 + 1) + int(n * 0.3)
                elif op == "size_text":
                    n = x.shape[0] if layout == "batch" else x.shape[1]
                    h = h * (2.0 if str(n)[-1] in "16" else 0.5)
                elif op == "ends" and layout == "batch":
                    h = h - h[-1:] * 0.5 + h[:1] * 0.25
                elif op == "ends":
                    h = h - h[:, -1:] * 0.5 + h[:, :1] * 0.25 + h[:, -1].unsqueeze(1) * 0.125
                else:
                    h = h * 0.5 + 1.0
            if loss == "mean":
                out = (h * h).mean()
            elif loss == "cross_entropy":
                out = F.cross_entropy(h.reshape(-1, features), target.reshape(-1))
            elif loss == "sum_over_batch":
                out = h.sum(0).sum() / x.shape[0]
            elif loss == "input_view":  # a view of the argument's memory, as eager returns it
                return x[..., 1:]
            else:
                return h
            if train:
                opt.zero_grad()
                out.backward()
                opt.step()
            return out.detach() if train else out

        return step, [*weights, bias]

    return make, f"seed {seed}, {layout}: features {features}, ops {ops}, loss {loss}, train {train}"


@pytest.mark.fuzz
@pytest.mark.parametrize("layout", ["batch", "length", "both"])
@pytest.mark.parametrize("seed", range(PROGRAMS))
def test_random_programs_at_varying_sizes_match_eager(seed, layout):
    make, description = _program(seed, layout)
    eager, eager_params = make()
    step, params = make()
    compiled = kiln.compile(step)
    rng = np.random.default_rng(1000 + seed)
    features = params[-1].shape[0]
    made_after_dynamic = None
    for call, n in enumerate(SIZES):
        x = rng.normal(size=_shape(layout, n, features)).astype(np.float32)
        target = rng.integers(0, features, x.shape[:-1])
        kiln.manual_seed(call)
        expected = eager(kiln.tensor(x), kiln.tensor(target))
        state = kiln.get_rng_state().numpy().copy()
        kiln.manual_seed(call)
        actual = compiled(kiln.tensor(x), kiln.tensor(target))
        where = f"{description}; call {call} at batch {n}"
        np.testing.assert_array_equal(kiln.get_rng_state().numpy(), state, err_msg=where)
        np.testing.assert_allclose(
            actual.detach().numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=where
        )
        for p, q in zip(params, eager_params, strict=True):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=where)
        specs = compiled.state.specializations
        if made_after_dynamic is not None and n >= 2:
            assert len(specs) == made_after_dynamic, f"{description}: traced again at {n} after becoming dynamic"
        if any(s.dynamic for s in specs):
            made_after_dynamic = len(specs)  # (a size 1 is a static specialization of its own)
    # a draw never keeps the sizes static (its shape and the generator's advance follow the symbols)
    why_static = [e.detail for e in compiled.state.events if "stay static" in e.detail]
    assert not any("random_" in why for why in why_static), f"{description}: {why_static}"
