"""``kiln.autograd.functional``: derivatives of whole functions, as ``torch.autograd.functional``.

``vjp``, ``jvp``, ``jacobian``, ``hessian``, ``hvp`` and ``vhp`` take a function of tensors and
the point to differentiate at; the inputs are detached copies made to require grad, so the
caller's tensors are untouched. ``jvp`` (and the forward-mode strategies) use the double-vjp
trick: J v is the gradient, with respect to u, of the vector-Jacobian product u^T J. Jacobians
are built one output element at a time (``vectorize=True`` is accepted and loops the same way).
With ``create_graph=True`` the results stay attached to the graph of the inputs, so they can be
differentiated again.

>>> import kiln
>>> from kiln.autograd.functional import jacobian
>>> jacobian(lambda x: x ** 2, kiln.tensor([1.0, 2.0]))
tensor([[2., 0.],
        [0., 4.]])
"""

from __future__ import annotations

from ..frontend import ops
from ..frontend.autograd import enable_grad, grad
from ..frontend.tensor import Tensor

__all__ = ["vjp", "jvp", "jacobian", "hessian", "hvp", "vhp"]


# ----------------------------------------------------------------------------- argument handling
def _as_tuple(x, what: str, fn: str) -> tuple[bool, tuple]:
    """(was it a tuple or list, its tensors as a tuple), checking every element is a tensor."""
    is_tuple = isinstance(x, tuple | list)
    items = tuple(x) if is_tuple else (x,)
    for i, t in enumerate(items):
        if not isinstance(t, Tensor):
            where = f"{what}[{i}]" if is_tuple else what
            raise TypeError(f"The {where} given to {fn} must be a Tensor or a tuple of Tensors, got {type(t).__name__}")
    return is_tuple, items


def _unpack(is_tuple: bool, items):
    return tuple(items) if is_tuple else items[0]


def _prepare(inputs: tuple, create_graph: bool) -> tuple:
    """Inputs that require grad: views of the caller's tensors when the result must stay attached to
    them (create_graph), detached copies otherwise."""
    out = []
    for t in inputs:
        if create_graph and t.requires_grad:
            out.append(ops.view(t, tuple(t.shape)))  # a new tensor on the caller's graph
        else:
            out.append(t.detach().requires_grad_(True))
    return tuple(out)


def _check_v(v: tuple, reference: tuple, what: str, fn: str) -> None:
    if len(v) != len(reference):
        raise RuntimeError(f"{fn}: v has {len(v)} tensors but the {what} has {len(reference)}")
    for i, (a, b) in enumerate(zip(v, reference, strict=True)):
        if tuple(a.shape) != tuple(b.shape):
            raise RuntimeError(
                f"{fn}: entry {i} of v has shape {list(a.shape)}, expected the shape of the {what}'s entry: {list(b.shape)}"
            )


def _default_v(outputs: tuple, fn: str) -> tuple:
    if len(outputs) != 1 or outputs[0].numel() != 1:
        raise RuntimeError(
            f"{fn}: the function returned {'several tensors' if len(outputs) != 1 else f'a tensor of shape {list(outputs[0].shape)}'}; "
            "v can be left out only when it returns a single tensor with one element"
        )
    return (ops.ones_like(outputs[0]),)


def _grads(outputs: tuple, inputs: tuple, v: tuple, create_graph: bool, strict: bool, fn: str) -> tuple:
    """The vjp with ``v``, with zeros for inputs the outputs do not depend on (errors if strict)."""
    pairs = [(o, g) for o, g in zip(outputs, v, strict=True) if o.requires_grad]
    if not pairs:
        result: tuple = (None,) * len(inputs)
    else:
        result = grad([o for o, _ in pairs], list(inputs), [g for _, g in pairs], retain_graph=True,
                      create_graph=create_graph, allow_unused=True)  # fmt: skip
    out = []
    for i, (t, g) in enumerate(zip(inputs, result, strict=True)):
        if g is None:
            if strict:
                raise RuntimeError(
                    f"{fn}: the output of the function is independent of input {i}, which strict=True does not allow"
                )
            g = ops.zeros_like(t)
        out.append(g)
    return tuple(out)


def _call(func, inputs: tuple, is_tuple: bool, fn: str) -> tuple[bool, tuple]:
    with enable_grad():
        outputs = func(*inputs) if is_tuple else func(inputs[0])
    return _as_tuple(outputs, "output of the function", fn)


def _finish(x: Tensor, create_graph: bool) -> Tensor:
    return x if create_graph else x.detach()


# ----------------------------------------------------------------------------- vjp and jvp
def vjp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), v^T J)``: the vector-Jacobian product at ``inputs``."""
    in_tuple, inputs = _as_tuple(inputs, "inputs", "vjp")
    inputs = _prepare(inputs, create_graph)
    out_tuple, outputs = _call(func, inputs, in_tuple, "vjp")
    if v is None:
        v = _default_v(outputs, "vjp")
    else:
        v = _as_tuple(v, "v", "vjp")[1]
        _check_v(v, outputs, "output of the function", "vjp")
    grads = _grads(outputs, inputs, v, create_graph, strict, "vjp")
    return (_unpack(out_tuple, [_finish(o, create_graph) for o in outputs]),
            _unpack(in_tuple, [_finish(g, create_graph) for g in grads]))  # fmt: skip


def _jvp_of(outputs: tuple, inputs: tuple, v: tuple, create_graph: bool, strict: bool, fn: str) -> tuple:
    # u^T J is linear in u; its gradient with respect to u, seeded with v, is J v
    dummies = tuple(ops.zeros_like(o).requires_grad_(True) for o in outputs)
    with enable_grad():
        transposed = _grads(outputs, inputs, dummies, True, strict, fn)
    live = [(g, w) for g, w in zip(transposed, v, strict=True) if g.requires_grad]
    if not live:
        return tuple(ops.zeros_like(o) for o in outputs)
    result = grad([g for g, _ in live], list(dummies), [w for _, w in live], retain_graph=True,
                  create_graph=create_graph, allow_unused=True)  # fmt: skip
    out = []
    for i, (o, r) in enumerate(zip(outputs, result, strict=True)):
        if r is None:
            if strict:
                raise RuntimeError(f"{fn}: output {i} of the function does not depend on the inputs (strict=True)")
            r = ops.zeros_like(o)
        out.append(r)
    return tuple(out)


def jvp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), J v)``: the Jacobian-vector product at ``inputs``."""
    in_tuple, inputs = _as_tuple(inputs, "inputs", "jvp")
    inputs = _prepare(inputs, create_graph)
    if v is None:
        if len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError("jvp: v can be left out only when the input is a single tensor with one element")
        v = (ops.ones_like(inputs[0]),)
    else:
        v = _as_tuple(v, "v", "jvp")[1]
        _check_v(v, inputs, "input", "jvp")
    out_tuple, outputs = _call(func, inputs, in_tuple, "jvp")
    result = _jvp_of(outputs, inputs, v, create_graph, strict, "jvp")
    return (_unpack(out_tuple, [_finish(o, create_graph) for o in outputs]),
            _unpack(out_tuple, [_finish(r, create_graph) for r in result]))  # fmt: skip


# ----------------------------------------------------------------------------- jacobian and hessian
_STRATEGIES = ("reverse-mode", "forward-mode")


def jacobian(func, inputs, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
             strategy: str = "reverse-mode"):  # fmt: skip
    """d func(inputs) / d inputs: for one input and one output a tensor of shape
    ``output.shape + input.shape``; a tuple over inputs, outputs, or both (``jac[i][j]`` is output i
    by input j) when they are tuples."""
    if strategy not in _STRATEGIES:
        raise ValueError(f'Expected strategy to be either "forward-mode" or "reverse-mode". Hint: got {strategy!r}.')
    in_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
    inputs = _prepare(inputs, create_graph)
    out_tuple, outputs = _call(func, inputs, in_tuple, "jacobian")
    rows = []
    for i, out in enumerate(outputs):
        per_input: list[list] = [[] for _ in inputs]
        flat = ops.reshape(out, (-1,))
        for k in range(flat.numel()):
            if out.requires_grad:
                grads = grad(flat[k], list(inputs), retain_graph=True, create_graph=create_graph, allow_unused=True)
            else:
                grads = (None,) * len(inputs)
            for j, (t, g) in enumerate(zip(inputs, grads, strict=True)):
                if g is None:
                    if strict:
                        raise RuntimeError(
                            f"jacobian: output {i} of the function is independent of input {j}, which strict=True "
                            "does not allow"
                        )
                    g = ops.zeros_like(t)
                per_input[j].append(g)
        blocks = []
        for j, t in enumerate(inputs):
            shape = tuple(out.shape) + tuple(t.shape)
            block = ops.reshape(ops.stack(per_input[j]), shape) if per_input[j] else ops.zeros(shape, dtype=t.dtype)
            blocks.append(_finish(block, create_graph))
        rows.append(_unpack(in_tuple, blocks))
    return _unpack(out_tuple, rows)


def hessian(func, inputs, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
            outer_jacobian_strategy: str = "reverse-mode"):  # fmt: skip
    """The matrix of second derivatives of a function returning one element: for one input a tensor
    of shape ``input.shape + input.shape``; ``hess[i][j]`` for tuple inputs."""
    in_tuple, inputs = _as_tuple(inputs, "inputs", "hessian")

    def gradient(*xs):
        out_tuple, outputs = _as_tuple(func(*xs), "output of the function", "hessian")
        if out_tuple or outputs[0].numel() != 1:
            raise RuntimeError(
                "hessian: the function given to hessian should return a single Tensor with one element, got "
                + ("a tuple" if out_tuple else f"a tensor of shape {list(outputs[0].shape)}")
            )
        return _grads(outputs, xs, (ops.ones_like(outputs[0]),), True, strict, "hessian")

    result = jacobian(gradient, inputs, create_graph=create_graph, strict=strict, strategy=outer_jacobian_strategy)
    # jacobian saw a tuple of inputs and a tuple of gradients: unwrap both for a single tensor input
    return result if in_tuple else result[0][0]


def vhp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), v^T H)`` for a function returning one element."""
    return _hessian_product(func, inputs, v, create_graph, strict, "vhp")


def hvp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), H v)`` for a function returning one element (H is symmetric where the
    function is twice continuously differentiable, so this is vhp's product)."""
    return _hessian_product(func, inputs, v, create_graph, strict, "hvp")


def _hessian_product(func, inputs, v, create_graph: bool, strict: bool, fn: str):
    in_tuple, inputs = _as_tuple(inputs, "inputs", fn)
    inputs = _prepare(inputs, create_graph)
    if v is None:
        if len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError(f"{fn}: v can be left out only when the input is a single tensor with one element")
        v = (ops.ones_like(inputs[0]),)
    else:
        v = _as_tuple(v, "v", fn)[1]
        _check_v(v, inputs, "input", fn)
    out_tuple, outputs = _call(func, inputs, in_tuple, fn)
    if out_tuple or outputs[0].numel() != 1:
        raise RuntimeError(f"{fn}: the function given to {fn} should return a single Tensor with one element")
    with enable_grad():
        first = _grads(outputs, inputs, (ops.ones_like(outputs[0]),), True, strict, fn)
    live = [(g, w) for g, w in zip(first, v, strict=True) if g.requires_grad]
    if live:
        second = grad([g for g, _ in live], list(inputs), [w for _, w in live], retain_graph=True,
                      create_graph=create_graph, allow_unused=True)  # fmt: skip
    else:
        second = (None,) * len(inputs)
    result = []
    for i, (t, s) in enumerate(zip(inputs, second, strict=True)):
        if s is None:
            if strict:
                raise RuntimeError(f"{fn}: the gradient is independent of input {i}, which strict=True does not allow")
            s = ops.zeros_like(t)
        result.append(_finish(s, create_graph))
    return _finish(outputs[0], create_graph), _unpack(in_tuple, result)
