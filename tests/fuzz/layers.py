"""Layer families of the op-program generator (the ``layers`` kind): pooling (kernel 1 too),
batch and group normalization (running statistics updated in captured tensors), embeddings with
repeated indices and ``padding_idx``, and convolutions with a bias and an activation (the fused
epilogue of the direct-convolution kernel).

Same conventions as ops.py: each emitter appends one statement with its result's bound and
exactness, or returns False when nothing in the pool fits.
"""

from __future__ import annotations

import math

from .generator import Generator, Program, Var, numel


def _pooled(size: int, k: int, stride: int, pad: int, ceil: bool) -> int:
    span = size + 2 * pad - k
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + pad:  # the last window must start inside the input or left padding
        out -= 1
    return out


def pool(g: Generator) -> bool:
    """max/avg pooling over the last one or two dims of a rank-3 or rank-4 float value."""
    x = g.choose(lambda v: v.is_float and len(v.shape) in (3, 4) and min(v.shape) >= 1)
    if x is None:
        return False
    r = g.r
    dims = len(x.shape) - 2
    kind = r.choice(("max", "avg"))
    if kind == "max" and g.grad_mode and x.grad and not x.exact:
        return False  # a near-tie in a window decides where the gradient goes
    k = min(r.choice((1, 1, 2, 3)), *x.shape[2:])
    stride = r.choice((None, 1, 2))
    pad, ceil = r.randint(0, k // 2), r.random() < 0.2
    out = tuple(_pooled(s, k, stride or k, pad, ceil) for s in x.shape[2:])
    extra = ", ceil_mode=True" if ceil else ""
    if kind == "avg" and r.random() < 0.3:
        extra += ", count_include_pad=False"
    line = f"F.{kind}_pool{dims}d({x.name}, {k}, stride={stride}, padding={pad}{extra})"
    exact = x.exact and (kind == "max" or k == 1 and pad == 0)
    g.add(Var(g.fresh(), (*x.shape[:2], *out), x.dtype, x.bound, exact, x.grad), line, f"{kind}_pool k{k}")
    return True


def _affine(g: Generator, shape: tuple, dtype: str) -> tuple[str, bool]:
    """``weight, bias`` arguments of a normalization (or none), and whether they require grad."""
    if g.r.random() < 0.3:
        return "", False
    w = g.new_input(shape, dtype, capture=True, grad=g.grad_mode and g.r.random() < 0.7)
    b = g.new_input(shape, dtype, capture=True, grad=w.grad)
    return f", {w.name}, {b.name}", w.grad


def batch_norm(g: Generator) -> bool:
    """F.batch_norm in training mode (running statistics in captured tensors, updated in place)
    or in eval mode (normalized by them)."""
    x = g.choose(lambda v: v.is_float and len(v.shape) >= 2 and v.shape[1] >= 1 and numel(v.shape) and v.bound <= 10)
    if x is None:
        return False
    r = g.r
    c = x.shape[1]
    per_channel = numel(x.shape) // c
    training = per_channel > 1 and r.random() < 0.7  # one value per channel has no variance: eager raises
    mean = g.new_input((c,), x.dtype, capture=True)
    var = g.new_input((c,), x.dtype, capture=True)
    affine, grad = _affine(g, (c,), x.dtype)
    eps = 0.1 if x.dtype == "float16" else 1e-5
    if training:
        line = f"F.batch_norm({x.name}, {mean.name}, {var.name}{affine or ', None, None'}, True, 0.1, {eps})"
        g.changed(mean, max(mean.bound, x.bound), False, False)
        g.changed(var, var.bound + 2 * x.bound**2, False, False)
        bound = math.sqrt(per_channel)
    else:  # running variances must be positive
        line = (
            f"F.batch_norm({x.name}, {mean.name}, {var.name}.abs() + 0.5{affine or ', None, None'}, False, 0.1, {eps})"
        )
        bound = (x.bound + mean.bound) / math.sqrt(0.5)
    bound = bound * 2 + 2 if affine else bound
    g.add(Var(g.fresh(), x.shape, x.dtype, bound, False, x.grad or grad), line, f"batch_norm{' train' * training}")
    return True


def group_norm(g: Generator) -> bool:
    x = g.choose(lambda v: v.is_float and len(v.shape) >= 2 and v.shape[1] >= 1 and numel(v.shape))
    if x is None:
        return False
    c = x.shape[1]
    groups = g.r.choice([d for d in range(1, c + 1) if c % d == 0])
    affine, grad = _affine(g, (c,), x.dtype)
    eps = 0.1 if x.dtype == "float16" else 1e-5
    bound = math.sqrt(max(1, numel(x.shape[1:]) // groups))
    bound = bound * 2 + 2 if affine else bound
    line = f"F.group_norm({x.name}, {groups}{affine}, eps={eps})"
    g.add(Var(g.fresh(), x.shape, x.dtype, bound, False, x.grad or grad), line, "group_norm")
    return True


def embedding(g: Generator) -> bool:
    """F.embedding over more indices than rows (repeats), sometimes with ``padding_idx``."""
    r = g.r
    table = g.choose(lambda v: v.is_float and len(v.shape) == 2 and v.shape[0] >= 1)
    if table is None or r.random() < 0.4:
        table = g.new_input((r.randint(1, 5), r.randint(1, 4)), g.fdt, capture=r.random() < 0.6,
                            grad=g.grad_mode and r.random() < 0.7)  # fmt: skip
    rows = table.shape[0]
    shape = (r.randint(rows, rows + 4),) if r.random() < 0.6 else (r.randint(1, 3), r.randint(2, 4))
    index = g.index_input(shape, rows)
    pad = f", padding_idx={r.randrange(-rows, rows)}" if r.random() < 0.4 else ""
    line = f"F.embedding({index.name}, {table.name}{pad})"
    g.add(Var(g.fresh(), (*shape, table.shape[1]), table.dtype, table.bound, table.exact, table.grad), line,
          "embedding" + (" padding_idx" if pad else ""))  # fmt: skip
    return True


def conv_epilogue(g: Generator) -> bool:
    """conv2d + bias + activation at stride 1, with C*kh*kw at most 256 or past it."""
    r = g.r
    x = g.choose(lambda v: v.dtype in ("float32", "float64") and len(v.shape) == 4 and min(v.shape) >= 1
                 and v.bound <= 50 and numel(v.shape) <= 4096)  # fmt: skip
    if x is None or r.random() < 0.4:
        c = 32 if r.random() < 0.2 else r.randint(1, 4)
        x = g.new_input((r.randint(1, 2), c, r.randint(3, 8), r.randint(3, 8)), r.choice(("float32", "float64")),
                        grad=g.grad_mode and r.random() < 0.6)  # fmt: skip
    n, c, h, w = x.shape
    k = min(r.choice((1, 2, 3, 3, 5)), h, w)
    o = r.randint(1, 6)
    weight = g.new_input((o, c, k, k), x.dtype, capture=r.random() < 0.7, grad=g.grad_mode and r.random() < 0.7)
    bias = g.new_input((o,), x.dtype, capture=True, grad=weight.grad)
    pad = r.choice((0, k // 2))
    scale = 1 / (c * k * k)  # keeps the convolution's bound at the input's (weights within 2)
    conv = f"F.conv2d({x.name}, {weight.name} * {scale!r}, {bias.name}, padding={pad})"
    smooth = ("F.gelu({})", "F.silu({})", "kiln.tanh({})", "{}")
    act = r.choice(smooth if g.grad_mode else (*smooth, "F.relu({})", "F.relu({})"))
    out = (h + 2 * pad - k + 1, w + 2 * pad - k + 1)
    tag = "conv2d+bias+" + act.split("(")[0].replace("{}", "none") + (" C*k*k>256" if c * k * k > 256 else "")
    g.add(Var(g.fresh(), (n, o, *out), x.dtype, 2 * x.bound + 2, False, x.grad or weight.grad), act.format(conv), tag)
    return True


LAYER_FAMILIES = {pool: 24, batch_norm: 15, group_norm: 8, embedding: 15, conv_epilogue: 15}


def generate(seed: int) -> Program:
    """An op program whose op families include the layers above (about a third of its ops)."""
    from .ops import FAMILIES  # noqa: PLC0415 - ops builds on generator, as this module does

    program = Generator(seed, families={**FAMILIES, **LAYER_FAMILIES}).program()
    program.kind = "layers"
    return program
