"""The op emitters of the fuzzer's program generator: one function per family of kiln ops.

Each emitter picks its operands from the generator's pool, appends one statement and returns
True, or returns False when nothing in the pool fits (the generator then tries another family).
Every emitter states the bound of its result and whether it is exact (see generator.py).
"""

from __future__ import annotations

import math

from .generator import CATEGORY, LIMIT, Generator, Var, broadcast, numel, promote


def _bounded(g: Generator, x: Var) -> bool:
    return x.bound <= LIMIT[x.dtype] / 4


def binary(g: Generator) -> bool:
    a = g.choose(lambda v: v.dtype != "bool" and _bounded(g, v))
    if a is None:
        return False
    b, bb = g.operand(a)
    bname = b.name if isinstance(b, Var) else b
    kind = g.r.choice(("add", "sub", "mul", "maximum", "minimum", "div", "rsub", "floordiv", "mod"))
    if kind == "div":
        line = f"{a.name} / ({bname}.square() + 1)" if isinstance(b, Var) else f"{a.name} / {abs(float(b)) + 1}"
        dtype, bound, exact = promote(a, b if isinstance(b, Var) else "float", "float"), a.bound, False
    elif kind in ("floordiv", "mod"):
        if not isinstance(b, Var) or a.is_float or b.is_float:
            return False
        op = "//" if kind == "floordiv" else "%"
        # now and then a divisor that may be zero: eager raises ZeroDivisionError, so must compiled
        divisor = b.name if g.r.random() < 0.05 else f"({b.name}.abs() + 1)"
        line, bound, exact, dtype = f"{a.name} {op} {divisor}", a.bound + bb, a.exact and b.exact, promote(a, b)
    elif kind in ("maximum", "minimum"):
        if not isinstance(b, Var):
            return False
        if g.grad_mode and not (a.exact and b.exact):
            return False  # a near-tie decides where the gradient goes
        line, bound, exact = f"kiln.{kind}({a.name}, {bname})", max(a.bound, bb), a.exact and b.exact
        dtype = promote(a, b)
    else:
        op = {"add": "+", "sub": "-", "mul": "*", "rsub": "-"}[kind]
        line = f"{bname} {op} {a.name}" if kind == "rsub" else g.r.choice((f"{a.name} {op} {bname}",
               f"kiln.{ {'+': 'add', '-': 'sub', '*': 'mul'}[op]}({a.name}, {bname})"))  # fmt: skip
        bound = a.bound * bb if op == "*" else a.bound + bb
        dtype = promote(a, b if isinstance(b, Var) else ("float" if "." in b else "int"))
        exact = CATEGORY[dtype] < 2 and a.exact and (not isinstance(b, Var) or b.exact)
    if CATEGORY[dtype] == 0 or bound > LIMIT[dtype]:
        return False
    shape = broadcast(a.shape, b.shape) if isinstance(b, Var) else a.shape
    grad = a.grad or (isinstance(b, Var) and b.grad)
    g.add(Var(g.fresh(), shape, dtype, bound, exact, grad and CATEGORY[dtype] == 2), line, kind)
    return True


def compare(g: Generator) -> bool:
    a = g.choose(lambda v: v.exact and v.dtype != "bool")
    if a is None:
        return False
    b = g.choose(lambda v: v.exact and v.dtype != "bool" and broadcast(v.shape, a.shape) is not None)
    other = b.name if b is not None and g.r.random() < 0.6 else g.r.choice(("0", "0.5", "-1", "1"))
    op = g.r.choice((">", "<", ">=", "<=", "==", "!="))
    shape = broadcast(a.shape, b.shape) if b is not None and other == b.name else a.shape
    g.add(Var(g.fresh(), shape, "bool", 1.0), f"{a.name} {op} {other}", "compare")
    return True


def logical(g: Generator) -> bool:
    a = g.choose(lambda v: v.dtype == "bool")
    if a is None:
        return False
    b = g.choose(lambda v: v.dtype == "bool" and broadcast(v.shape, a.shape) is not None)
    if b is None or g.r.random() < 0.3:
        g.add(Var(g.fresh(), a.shape, "bool", 1.0), g.r.choice((f"~{a.name}", f"kiln.logical_not({a.name})")), "not")
        return True
    fn = g.r.choice(("logical_and", "logical_or", "logical_xor"))
    g.add(Var(g.fresh(), broadcast(a.shape, b.shape), "bool", 1.0), f"kiln.{fn}({a.name}, {b.name})", fn)
    return True


# (template, bound of the result given the operand's bound, exact when the operand is). Denominators
# and logarithms read ``x * x + c``, not ``|x| + c``: a value that is zero up to rounding noise must
# not flip the sign of a gradient.
UNARY = {
    "exp": ("{x}.clamp(-3, 3).exp()", lambda b: math.exp(min(b, 3)), False),
    "tanh": ("kiln.tanh({x})", lambda b: 1.0, False),
    "sigmoid": ("{x}.sigmoid()", lambda b: 1.0, False),
    "sin": ("kiln.sin({x})", lambda b: 1.0, False),
    "cos": ("{x}.cos()", lambda b: 1.0, False),
    "neg": ("-{x}", lambda b: b, True),
    "abs": ("{x}.abs()", lambda b: b, True),
    "relu": ("F.relu({x})", lambda b: b, True),
    "sqrt": ("kiln.sqrt({x}.square() + 0.1)", lambda b: b + 0.4, False),
    "log": ("kiln.log({x} * {x} + 0.5)", lambda b: max(1.0, math.log(b * b + 0.5)), False),
    "rsqrt": ("({x}.square() + 0.5).rsqrt()", lambda b: 1.5, False),
    "square": ("{x}.square()", lambda b: b * b, False),
    "pow": ("{x} ** 2", lambda b: b * b, False),
    "gelu": ("F.gelu({x})", lambda b: b, False),
    "silu": ("F.silu({x})", lambda b: b, False),
    "softplus": ("F.softplus({x})", lambda b: b + 1, False),
    "erf": ("kiln.erf({x})", lambda b: 1.0, False),
    "reciprocal": ("({x}.square() + 1).reciprocal()", lambda b: 1.0, False),
    "log1p": ("kiln.log1p({x}.square())", lambda b: math.log1p(b * b), False),
}
DISCRETE = ("floor", "ceil", "round", "trunc", "sign")


def unary(g: Generator) -> bool:
    if g.r.random() < 0.2:
        x = g.choose(lambda v: v.exact and v.is_float)
        if x is None:
            return False
        op = g.r.choice(DISCRETE)
        g.add(Var(g.fresh(), x.shape, x.dtype, x.bound + 1, True, x.grad), f"kiln.{op}({x.name})", op)
        return True
    x = g.choose(lambda v: v.is_float or (v.dtype != "bool" and g.r.random() < 0.3))
    if x is None:
        return False
    op = g.r.choice(list(UNARY)) if x.is_float else g.r.choice(("neg", "abs"))
    if op in ("abs", "relu") and g.grad_mode and not x.exact:
        op = "neg"  # the kink at 0: rounding noise around 0 would choose the gradient
    template, bound, exact = UNARY[op]
    b = bound(x.bound)
    if b > LIMIT[x.dtype]:
        template, b, op = "kiln.tanh({x})", 1.0, "tanh"
    g.add(Var(g.fresh(), x.shape, x.dtype, b, exact and x.exact, x.grad), template.format(x=x.name), op)
    return True


def cast(g: Generator) -> bool:
    x = g.choose(lambda v: True)
    to = g.r.choice(("float16", "float32", "float64", "int64", "int32", "bool"))
    if x is None or to == x.dtype or x.bound > LIMIT[to] and CATEGORY[to] > 0:
        return False
    if CATEGORY[to] < 2 and x.is_float and not x.exact:
        return False
    spelled = {"float16": ".half()", "float32": ".float()", "float64": ".double()", "int64": ".long()",
               "int32": ".int()", "bool": ".bool()"}[to]  # fmt: skip
    line = x.name + (spelled if g.r.random() < 0.5 else f".to(kiln.{to})")
    bound = 1.0 if to == "bool" else x.bound + 1
    g.add(Var(g.fresh(), x.shape, to, bound, x.exact, x.grad and CATEGORY[to] == 2), line, "cast")
    return True


def _dims(g: Generator, x: Var) -> str | None:
    """A ``dim`` argument for ``x``: None, one axis (sometimes negative) or a tuple of axes."""
    r = g.r
    if not x.shape or r.random() < 0.25:
        return None
    if r.random() < 0.6 or len(x.shape) == 1:
        d = r.randrange(len(x.shape))
        return str(d - len(x.shape) if r.random() < 0.3 else d)
    dims = sorted(r.sample(range(len(x.shape)), r.randint(2, len(x.shape))))
    return str(tuple(dims))


def _reduced(shape: tuple, dim: str | None, keepdim: bool) -> tuple:
    if dim is None:
        return tuple(1 for _ in shape) if keepdim else ()
    axes = {d % len(shape) for d in (eval(dim) if dim.startswith("(") else (int(dim),))}  # noqa: S307
    return tuple(1 if i in axes else n for i, n in enumerate(shape) if keepdim or i not in axes)


def reduce(g: Generator) -> bool:
    x = g.choose(lambda v: True)
    if x is None:
        return False
    r = g.r
    if x.is_float:
        op = r.choice(("sum", "mean", "amax", "amin", "prod", "std", "var", "logsumexp", "norm", "argmax"))
    elif x.dtype == "bool":
        op = r.choice(("any", "all", "sum"))
    else:
        op = r.choice(("sum", "amax", "amin", "argmin"))
    dim = _dims(g, x)
    if op in ("argmax", "argmin"):
        if not x.exact or (dim is not None and dim.startswith("(")):
            return False
        if dim is None:
            g.add(Var(g.fresh(), (), "int64", 1e3), f"{x.name}.{op}()", op)
            return True
    if op in ("any", "all", "std", "var", "prod", "logsumexp", "norm") and dim is None and r.random() < 0.5:
        dim = _dims(g, x) or None
    keepdim = r.random() < 0.4
    n = numel(x.shape) or 1
    bound = {"sum": x.bound * n, "prod": math.exp(min(n * math.log(x.bound), 700.0)) if x.bound > 1 else 1.0, "std": 2 * x.bound, "var": 4 * x.bound**2,
             "logsumexp": x.bound + math.log(n) + 1, "norm": x.bound * math.sqrt(n)}.get(op, x.bound)  # fmt: skip
    dtype = "int64" if op in ("sum", "argmax", "argmin") and not x.is_float else x.dtype
    dtype = "bool" if op in ("any", "all") else dtype
    if bound > LIMIT[dtype]:
        return False
    if op in ("amax", "amin", "argmax", "argmin") and 0 in x.shape:
        return False  # eager raises: nothing to take the maximum of
    args = [] if dim is None else [f"dim={dim}" if r.random() < 0.5 or op == "norm" else dim]
    if keepdim:
        args.append("keepdim=True")
    shape = _reduced(x.shape, dim, keepdim)
    exact = x.exact and op in ("amax", "amin", "any", "all", "argmax", "argmin") or (not x.is_float and op == "sum")
    grad = x.grad and dtype in ("float16", "float32", "float64")
    if op in ("amax", "amin", "std", "var", "norm") and g.grad_mode and not x.exact:
        return False  # a near-tie, or a spread that is zero up to rounding, decides the gradient
    line = f"{x.name}.{op}({', '.join(args)})" if r.random() < 0.6 else f"kiln.{op}({', '.join([x.name, *args])})"
    g.add(Var(g.fresh(), shape, dtype, bound, exact, grad), line, op)
    return True


def normalize(g: Generator) -> bool:
    x = g.choose(lambda v: v.is_float and v.shape)
    if x is None:
        return False
    r = g.r
    d = r.randrange(len(x.shape)) - (len(x.shape) if r.random() < 0.4 else 0)
    kind = r.choice(("softmax", "log_softmax", "layer_norm"))
    if kind == "softmax":
        line = r.choice((f"kiln.softmax({x.name}, dim={d})", f"{x.name}.softmax({d})", f"F.softmax({x.name}, {d})"))
        g.add(Var(g.fresh(), x.shape, x.dtype, 1.0, False, x.grad), line, kind)
        return True
    if kind == "log_softmax":
        line = r.choice((f"kiln.log_softmax({x.name}, dim={d})", f"F.log_softmax({x.name}, {d})"))
        g.add(Var(g.fresh(), x.shape, x.dtype, 2 * x.bound + 3, False, x.grad), line, kind)
        return True
    k = r.randint(1, len(x.shape))
    normalized = x.shape[len(x.shape) - k :]
    # float16 rounding noise over a near-constant row would be amplified by 1/sqrt(eps)
    eps = ", eps=0.1" if x.dtype == "float16" else ""
    extra, bound, grad = "", math.sqrt(max(1, numel(normalized))), x.grad
    if r.random() < 0.5:
        w = g.new_input(normalized, x.dtype, capture=True, grad=g.grad_mode and r.random() < 0.7)
        b = g.new_input(normalized, x.dtype, capture=True, grad=w.grad)
        extra, bound, grad = f", {w.name}, {b.name}", bound * 2 + 2, grad or w.grad
    g.add(Var(g.fresh(), x.shape, x.dtype, bound, False, grad), f"F.layer_norm({x.name}, {normalized}{extra}{eps})",
          kind)  # fmt: skip
    return True


from .inplace import backward_inside, emit_return, inplace  # noqa: E402 - the in-place families
from .shaping import constant, conv, index, join, matmul, random_op, select_values, view  # noqa: E402

FAMILIES = {binary: 12, compare: 3, logical: 2, unary: 10, cast: 3, reduce: 7, normalize: 4, view: 10, matmul: 3,
            select_values: 5, index: 4, join: 3, random_op: 2, constant: 1, inplace: 14, backward_inside: 1, conv: 2}  # fmt: skip


def emit_op(g: Generator, families: dict | None = None) -> bool:
    families = families or FAMILIES
    family = g.r.choices(list(families), weights=list(families.values()))[0]
    return family(g)


__all__ = ["emit_op", "emit_return"]
