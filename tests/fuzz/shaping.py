"""Op emitters for views, matmul, selections, indexing, joins, random ops and constants.

The other half of the generator's op families (see ops.py for the conventions): views share the
root, the bound and the exactness of what they view; indices are new int64 inputs whose values are
valid for the dimension they index.
"""

from __future__ import annotations

from .generator import CATEGORY, LIMIT, Generator, Var, broadcast, numel, promote


def _view(g: Generator, x: Var, shape: tuple, line: str, op: str, *, contiguous: bool = False,
          writable: bool = True) -> bool:  # fmt: skip
    var = Var(g.fresh(), shape, x.dtype, x.bound, x.exact, x.grad, x.root, x.writable and writable, contiguous)
    g.add(var, line, op)
    return True


def view(g: Generator) -> bool:
    x = g.choose(lambda v: True)
    if x is None:
        return False
    r, s, n = g.r, x.shape, x.name
    kind = r.choice(("transpose", "permute", "slice", "reshape", "expand", "unsqueeze", "narrow", "select", "flatten"))
    if kind == "transpose" and len(s) >= 2:
        i, j = r.sample(range(len(s)), 2)
        shape = list(s)
        shape[i], shape[j] = s[j], s[i]
        line = f"{n}.t()" if len(s) == 2 and r.random() < 0.3 else f"{n}.transpose({i}, {j})"
        return _view(g, x, tuple(shape), line, kind)
    if kind == "permute" and len(s) >= 2:
        perm = r.sample(range(len(s)), len(s))
        return _view(g, x, tuple(s[p] for p in perm), f"{n}.permute{tuple(perm)}", kind)
    if kind == "slice" and s:
        d = r.randrange(len(s))
        start, step = r.choice((0, 0, 1)), r.choice((1, 2, 2, 3))
        length = len(range(start, s[d], step))
        index = ", ".join([":"] * d + [f"{start or ''}::{step}"])
        shape = (*s[:d], length, *s[d + 1 :])
        return _view(g, x, shape, f"{n}[{index}]", kind)
    if kind == "reshape" and numel(s) > 0:
        total = numel(s)
        factors = [f for f in (1, 2, 3, 4, 5, 6) if total % f == 0]
        first = r.choice(factors)
        shape = (first, total // first) if r.random() < 0.6 else (total,)
        spelled = f"{n}.view{shape}" if x.contiguous and r.random() < 0.5 else f"{n}.reshape({shape})"
        return _view(g, x, shape, spelled, kind, contiguous=x.contiguous)
    if kind == "expand" and 1 in s:
        shape = tuple(r.randint(2, 4) if d == 1 else d for d in s)
        return _view(g, x, shape, f"{n}.expand{shape}", kind, writable=False)
    if kind == "unsqueeze":
        d = r.randint(0, len(s))
        return _view(g, x, (*s[:d], 1, *s[d:]), f"{n}.unsqueeze({d})", kind, contiguous=x.contiguous)
    if kind == "narrow" and s:
        d = r.randrange(len(s))
        start = r.randint(0, s[d])
        length = r.randint(0, s[d] - start)
        return _view(g, x, (*s[:d], length, *s[d + 1 :]), f"{n}.narrow({d}, {start}, {length})", kind)
    if kind == "select" and s and s[0] > 0:
        i = r.randrange(s[0])
        return _view(g, x, s[1:], f"{n}[{i}]", kind, contiguous=x.contiguous)
    if kind == "flatten" and len(s) >= 2:
        return _view(g, x, (numel(s),), f"{n}.flatten()", kind, contiguous=x.contiguous)
    return False


def matmul(g: Generator) -> bool:
    a = g.choose(lambda v: v.is_float and 1 <= len(v.shape) <= 3 and v.bound <= 50)
    if a is None:
        return False
    k = a.shape[-1]
    b = g.choose(lambda v: v is not a and v.dtype == a.dtype and 1 <= len(v.shape) <= 2 and v.shape[0] == k
                 and v.bound <= 50)  # fmt: skip
    if b is None:
        shape = (k,) if g.r.random() < 0.2 else (k, g.r.randint(1, 4))
        b = g.new_input(shape, a.dtype, capture=g.r.random() < 0.4, grad=g.grad_mode and g.r.random() < 0.5)
    out = (*a.shape[:-1], *b.shape[1:])
    bound = a.bound * b.bound * max(k, 1)
    if bound > LIMIT[a.dtype]:
        return False
    line = g.r.choice((f"{a.name} @ {b.name}", f"kiln.matmul({a.name}, {b.name})"))
    if len(a.shape) == 2 and len(b.shape) == 2 and g.r.random() < 0.3:
        line = f"{a.name}.mm({b.name})"
    g.add(Var(g.fresh(), out, a.dtype, bound, False, a.grad or b.grad), line, "matmul")
    return True


def conv(g: Generator) -> bool:
    """conv2d, 3x3: half the time with 16 or more channels in and out (the input's channels
    repeated), which takes Winograd's path (F(4x4, 3x3) on planes of 16 and more); else a few
    channels at dilation 1 or 2, which take the direct ``conv`` primitive at stride 1 (its compiled
    kernel, and its input gradient a flipped ``conv``) and im2col at stride 2."""
    r = g.r
    x = g.choose(lambda v: v.dtype in ("float32", "float64") and len(v.shape) == 4 and min(v.shape[2:]) >= 3
                 and v.shape[1] >= 1 and v.bound <= 50 and numel(v.shape) <= 2048)  # fmt: skip
    if x is None or r.random() < 0.3:
        side = (r.randint(16, 18), r.randint(16, 19)) if r.random() < 0.3 else (r.randint(3, 9), r.randint(3, 9))
        x = g.new_input((r.randint(1, 2), r.randint(1, 3), *side), r.choice(("float32", "float64")),
                        grad=g.grad_mode and r.random() < 0.6)  # fmt: skip
    n, c, h, w = x.shape
    wide = r.random() < 0.5
    reps = -(-16 // c) if wide else 1
    k = r.randint(16, 18) if wide else r.randint(1, 4)
    weight = g.new_input((k, c * reps, 3, 3), x.dtype, capture=r.random() < 0.5, grad=g.grad_mode and r.random() < 0.7)
    padding = r.choice((0, 1))
    stride = 1 if wide else r.choice((1, 1, 2))
    dilation = 2 if not wide and min(h, w) + 2 * padding >= 5 and r.random() < 0.3 else 1
    scale = 1 / (9 * c * reps)  # keeps the result's bound at the input's (weights are within 2)
    source = f"{x.name}.repeat(1, {reps}, 1, 1)" if reps > 1 else x.name
    line = f"F.conv2d({source}, {weight.name} * {scale!r}, padding={padding}, stride={stride}, dilation={dilation})"
    out = [(s + 2 * padding - 2 * dilation - 1) // stride + 1 for s in (h, w)]
    g.add(Var(g.fresh(), (n, k, *out), x.dtype, 2 * x.bound, False, x.grad or weight.grad), line, "conv2d")
    return True


def select_values(g: Generator) -> bool:
    x = g.choose(lambda v: v.dtype != "bool")
    if x is None:
        return False
    r = g.r
    kind = r.choice(("where", "clamp", "masked_fill"))
    if kind == "clamp":
        lo, hi = sorted((r.choice((-1.5, -0.5, 0, 0.5)), r.choice((0.5, 1, 1.5))))
        line = r.choice((f"{x.name}.clamp({lo}, {hi})", f"kiln.clamp({x.name}, min={lo})", f"{x.name}.clamp(max={hi})",
                         f"kiln.clip({x.name}, {lo}, {hi})"))  # fmt: skip
        dtype = x.dtype if x.is_float or float(lo).is_integer() and float(hi).is_integer() else "float32"
        if g.grad_mode and not x.exact:
            return False
        g.add(Var(g.fresh(), x.shape, promote(x, "float") if dtype != x.dtype else x.dtype, x.bound, x.exact, x.grad),
              line, kind)  # fmt: skip
        return True
    mask = g.mask(x.shape)
    if mask is None:
        return False
    if kind == "masked_fill":
        value = "1.5" if x.is_float else "-2"
        g.add(Var(g.fresh(), x.shape, x.dtype, max(x.bound, 2), x.exact, x.grad), f"{x.name}.masked_fill({mask}, {value})",
              kind)  # fmt: skip
        return True
    other, bound = g.operand(x)
    oname = other.name if isinstance(other, Var) else other
    shape = broadcast(x.shape, other.shape) if isinstance(other, Var) else x.shape
    dtype = promote(x, other if isinstance(other, Var) else ("float" if "." in other else "int"))
    exact = x.exact and (not isinstance(other, Var) or other.exact)
    grad = (x.grad or isinstance(other, Var) and other.grad) and CATEGORY[dtype] == 2
    g.add(
        Var(g.fresh(), shape, dtype, max(x.bound, bound), exact, grad), f"kiln.where({mask}, {x.name}, {oname})", kind
    )
    return True


def index(g: Generator) -> bool:
    x = g.choose(lambda v: v.shape and all(v.shape))
    if x is None:
        return False
    r, s = g.r, x.shape
    kind = r.choice(("gather", "index_select", "advanced", "advanced_inner"))
    d = r.randrange(len(s))
    if kind == "gather":
        ishape = tuple(r.randint(1, 4) if i == d else r.randint(1, n) for i, n in enumerate(s))
        idx = g.index_input(ishape, s[d])
        line = f"{x.name}.gather({d}, {idx.name})" if r.random() < 0.5 else f"kiln.gather({x.name}, {d}, {idx.name})"
        shape = ishape
    elif kind == "index_select":
        idx = g.index_input((r.randint(0, 4),), s[d])
        line = f"kiln.index_select({x.name}, {d}, {idx.name})"
        shape = (*s[:d], idx.shape[0], *s[d + 1 :])
    elif kind == "advanced":
        ishape = (r.randint(1, 4),) if r.random() < 0.7 else (2, 2)
        idx = g.index_input(ishape, s[0], negative=True)
        line, shape = f"{x.name}[{idx.name}]", (*ishape, *s[1:])
    else:
        if len(s) < 2:
            return False
        idx = g.index_input((r.randint(1, 4),), s[1])
        line, shape = f"{x.name}[:, {idx.name}]", (s[0], idx.shape[0], *s[2:])
    g.add(Var(g.fresh(), shape, x.dtype, x.bound, x.exact, x.grad), line, kind)
    return True


def join(g: Generator) -> bool:
    a = g.choose(lambda v: True)
    if a is None:
        return False
    r = g.r
    b = g.choose(lambda v: v.shape == a.shape and v.dtype == a.dtype) if r.random() < 0.7 else a
    if r.random() < 0.5 or not a.shape:
        d = r.randint(0, len(a.shape))
        shape = (*a.shape[:d], 2, *a.shape[d:])
        line, kind = f"kiln.stack([{a.name}, {b.name}], dim={d})", "stack"
    else:
        d = r.randrange(len(a.shape))
        shape = (*a.shape[:d], 2 * a.shape[d], *a.shape[d + 1 :])
        line, kind = f"kiln.cat([{a.name}, {b.name}], {d})", "cat"
    g.add(Var(g.fresh(), shape, a.dtype, max(a.bound, b.bound), a.exact and b.exact, a.grad or b.grad), line, kind)
    return True


def random_op(g: Generator) -> bool:
    x = g.choose(lambda v: v.is_float)
    if x is None:
        return False
    kind = g.r.choice(("dropout", "rand_like", "randn_like"))
    if kind == "dropout":
        line, bound = f"F.dropout({x.name}, p={g.r.choice((0.2, 0.5))})", x.bound * 2
    elif kind == "rand_like":
        line, bound = f"{x.name} * kiln.rand_like({x.name})", x.bound
    else:
        line, bound = f"kiln.randn_like({x.name}) + {x.name}", x.bound + 7
    if bound > LIMIT[x.dtype]:
        return False
    g.add(Var(g.fresh(), x.shape, x.dtype, bound, False, x.grad), line, kind)
    return True


def constant(g: Generator) -> bool:
    r = g.r
    kind = r.choice(("tensor", "zeros", "ones_like", "full", "arange"))
    x = g.choose(lambda v: True)
    if kind == "tensor":
        g.add(Var(g.fresh(), (2,), "int64", 1.0), "kiln.tensor([0, 0])", kind)
    elif kind == "zeros":
        shape = g.shape()
        g.add(Var(g.fresh(), shape, g.fdt, 1.0), f"kiln.zeros({shape}, dtype=kiln.{g.fdt})", kind)
    elif kind == "ones_like" and x is not None:
        g.add(Var(g.fresh(), x.shape, x.dtype, 1.0), f"kiln.ones_like({x.name})", kind)
    elif kind == "full":
        shape = g.shape()
        g.add(Var(g.fresh(), shape, "float32", 1.5), f"kiln.full({shape}, 1.5)", kind)
    else:
        n = r.randint(0, 5)
        g.add(Var(g.fresh(), (n,), "int64", 5.0), f"kiln.arange({n})", kind)
    return True
