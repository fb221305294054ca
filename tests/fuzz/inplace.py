"""In-place ops, backward inside the function, and the return statement of a generated program.

In-place targets are arguments, views of arguments, captured tensors, intermediates and their
views: whatever the generator knows to be writable (not expanded, not a leaf requiring grad).
A write changes every value sharing the target's memory (``Generator.changed``).
"""

from __future__ import annotations

from .generator import CATEGORY, LIMIT, Generator, Var, broadcast


def _where(g: Generator, t: Var) -> str:
    if t.root in g.arg_names:
        return "arg" if t.name == t.root else "argview"
    if t.root in g.cap_names:
        return "capture" if t.name == t.root else "capview"
    return "tmp"


def _fits(g: Generator, t: Var, other) -> bool:
    """Whether ``other`` can be written into ``t``: broadcasts to it, promotes within its category."""
    if not isinstance(other, Var):
        return not ("." in other and not t.is_float) and not (other == "True" and t.dtype != "bool")
    return broadcast(other.shape, t.shape) == t.shape and CATEGORY[other.dtype] <= CATEGORY[t.dtype]


def inplace(g: Generator) -> bool:
    t = g.choose(lambda v: v.writable)
    if t is None:
        return False
    r, n = g.r, t.name
    kind = r.choice(("arith", "arith", "copy_", "zero_", "fill_", "clamp_", "masked_fill_", "unary_", "lerp_",
                     "setitem", "setindex", "index_add_"))  # fmt: skip
    if t.dtype == "bool" and kind not in ("copy_", "zero_", "fill_", "masked_fill_", "setitem"):
        return False
    bound, exact, grad = t.bound, t.exact, False
    if kind in ("arith", "copy_", "lerp_", "setitem"):
        other, ob = g.operand(t, tensor_only=kind in ("copy_", "lerp_"), same_dtype=kind == "lerp_")
        if kind != "copy_" and not _fits(g, t, other) or kind == "copy_" and broadcast(other.shape, t.shape) != t.shape:
            return False
        o = other.name if isinstance(other, Var) else other
        exact_o = not isinstance(other, Var) or other.exact
        grad = isinstance(other, Var) and other.grad and t.is_float
        if kind == "arith":
            # ``G += x`` would make a captured name local to f (UnboundLocalError)
            op = r.choice(("add_", "sub_", "mul_") + (() if t.name in g.cap_names else ("+=", "*=")))
            bound = t.bound * ob if op in ("mul_", "*=") else t.bound + ob
            exact = t.exact and exact_o and not t.is_float
            line = f"{n} {op} {o}" if op.endswith("=") else f"{n}.{op}({o})"
            kind = op
        elif kind == "copy_":
            if other.is_float and not t.is_float and not other.exact:
                return False
            line, bound, exact = f"{n}.copy_({o})", ob + 1, other.exact
        elif kind == "lerp_":
            if not t.is_float:
                return False
            line, bound, exact = f"{n}.lerp_({o}, 0.25)", max(t.bound, ob), False
        else:
            if not t.shape or not t.shape[0]:
                return False
            line, bound, exact = (
                f"{n}[{r.choice(('1:', '::2', '0', '-1'))}] = {o}",
                max(t.bound, ob),
                t.exact and exact_o,
            )
        if bound > LIMIT[t.dtype]:
            return False
    elif kind == "zero_":
        line = f"{n}.zero_()"
    elif kind == "fill_":
        value = {"bool": "True", "int32": "3", "int64": "-2"}.get(t.dtype, "0.75")
        line, bound = f"{n}.fill_({value})", max(t.bound, 3)
    elif kind == "clamp_":
        line = f"{n}.clamp_({r.choice((-1, 0))}, {r.choice((1, 2))})"
        if g.grad_mode and not t.exact:
            return False
    elif kind == "masked_fill_":
        mask = g.mask(t.shape)
        value = {"bool": "False", "int32": "7", "int64": "7"}.get(t.dtype, "-0.5")
        line, bound = f"{n}.masked_fill_({mask}, {value})", max(t.bound, 7)
    elif kind == "unary_":
        if not t.is_float:
            line = f"{n}.{r.choice(('neg_', 'abs_'))}()"
        else:
            op = r.choice(("relu_", "neg_", "abs_", "sigmoid_", "tanh_", "exp_", "pow_"))
            if op in ("exp_", "pow_") and t.bound > 3:
                op = "tanh_"
            if op in ("relu_", "abs_") and g.grad_mode and not t.exact:
                op = "neg_"  # the kink at 0 (see ops.unary)
            line = f"{n}.{op}(2)" if op == "pow_" else f"{n}.{op}()"
            bound = {"sigmoid_": 1.0, "tanh_": 1.0, "exp_": 21.0, "pow_": 9.0}.get(op, t.bound)
            exact = t.exact and op in ("relu_", "neg_", "abs_")
            kind = op
    elif kind == "setindex":
        if not t.shape or not t.shape[0]:
            return False
        idx = g.index_input((r.randint(1, 3),), t.shape[0], negative=True)
        value = {"bool": "True", "int32": "5", "int64": "5"}.get(t.dtype, "2.5")
        line, bound = f"{n}[{idx.name}] = {value}", max(t.bound, 5)
    else:  # index_add_
        if not t.shape or not t.shape[0] or not t.is_float:
            return False
        idx = g.index_input((r.randint(1, 4),), t.shape[0])
        src = g.new_input((idx.shape[0], *t.shape[1:]), t.dtype, capture=r.random() < 0.3)
        line, bound, exact = f"{n}.index_add_(0, {idx.name}, {src.name})", t.bound + 4 * src.bound, False
        if bound > LIMIT[t.dtype]:
            return False
    g.body.append(line)
    g.ops.append(f"{kind}@{_where(g, t)}")
    g.changed(t, bound, exact, grad)
    return True


def backward_inside(g: Generator) -> bool:
    """``loss.backward()`` inside the function (at most once), sometimes after zeroing grads."""
    if not g.grad_mode or getattr(g, "inside", False):
        return False
    v = g.choose(lambda v: v.grad and v.is_float and v.bound <= 100)
    if v is None:
        return False
    params = [p for p in g.pool if p.grad and p.name in g.cap_names]
    if params and g.r.random() < 0.5:
        p = g.r.choice(params).name
        g.body.append(f"{p}.grad.zero_() if {p}.grad is not None else None")
        g.ops.append("zero_grad")
    loss = g.r.choice((f"{v.name}.sum()", f"({v.name} * {v.name}).mean()", f"{v.name}.double().sum()"))
    g.body.append(f"{loss}.backward()")
    g.ops.append("backward_inside")
    g.inside = True
    return True


def emit_return(g: Generator) -> bool:
    """The return statement; True when the caller should run backward on the results."""
    r = g.r
    values = [v for v in g.pool if v.name.startswith("v")]
    outputs = [values[-1].name] if values else []
    for _ in range(r.choice((0, 0, 1, 1, 2))):
        outputs.append(r.choice(g.pool).name)
    if not outputs:
        outputs.append(r.choice(g.pool).name)
    r.shuffle(outputs)
    g.body.append(f"return {', '.join(outputs)}" + ("," if len(outputs) == 1 and r.random() < 0.2 else ""))
    return g.grad_mode and not getattr(g, "inside", False)
