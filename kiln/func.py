"""``kiln.func``: function transforms in the style of ``torch.func``.

``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``, ``jacfwd`` and ``hessian`` are written over
kiln's tape-based autograd: a transformed function makes the differentiated arguments require
grad, runs the function, and asks autograd for the derivative. When grad mode is on, results stay
built with ``create_graph``, so transforms nest (``grad(grad(f))``) and an outer ``backward()``
sees through them (a gradient penalty through parameters in a closure); results that depend on
no tensor of the caller's that requires grad are handed back detached, as PyTorch's are.

``vmap`` is a loop: it calls the function once per index of the mapped dimension and stacks the
results. That is slower than PyTorch's batching rules but gives the same values for any function
(random ones included, each slice drawing in turn), and it composes with the transforms above
(``vmap(grad(f))`` is per-example gradients).

``functional_call(module, params, args)`` runs a module with some of its parameters and buffers
replaced by the given tensors, and restores them afterwards.

>>> import kiln
>>> from kiln.func import grad, vmap
>>> grad(lambda x: (x ** 3).sum())(kiln.tensor([1.0, 2.0]))
tensor([ 3., 12.])
>>> vmap(lambda row: row.sum())(kiln.ones(3, 2))
tensor([2., 2., 2.])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .frontend import ops
from .frontend.autograd import grad as _autograd_grad
from .frontend.autograd import is_grad_enabled
from .frontend.autograd.grad_mode import enable_grad
from .frontend.tensor import Tensor

__all__ = ["grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "vmap", "functional_call"]


# ----------------------------------------------------------------------------- pytrees (tuples, lists, dicts)
def _leaves(tree) -> list:
    if isinstance(tree, tuple | list):
        return [leaf for item in tree for leaf in _leaves(item)]
    if isinstance(tree, dict):
        return [leaf for item in tree.values() for leaf in _leaves(item)]
    return [tree]


def _rebuild(tree, leaves):
    """``tree`` with its leaves replaced, in order, by the items of the iterator ``leaves``."""
    if isinstance(tree, tuple | list):
        return type(tree)(_rebuild(item, leaves) for item in tree)
    if isinstance(tree, dict):
        return {k: _rebuild(v, leaves) for k, v in tree.items()}
    return next(leaves)


def _map(fn, tree):
    return _rebuild(tree, iter([fn(leaf) for leaf in _leaves(tree)]))


# ----------------------------------------------------------------------------- grad and friends
def _argnums(argnums, nargs: int, fn: str) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums:
        raise RuntimeError(f"{fn}: argnums must be non-empty")
    for n in nums:
        if not isinstance(n, int) or not -nargs <= n < nargs:
            raise RuntimeError(f"{fn}: Got argnums={argnums} but only {nargs} positional inputs")
    return tuple(n % nargs for n in nums)


def _track(tree, fn: str):
    """A copy of every tensor leaf of ``tree`` that requires grad, on the caller's graph if it is on one."""

    def leaf(t):
        if not isinstance(t, Tensor):
            raise RuntimeError(f"{fn}: expected the differentiated arguments to be tensors, got {type(t).__name__}")
        if not t.is_floating_point():
            raise RuntimeError(f"{fn}: only floating point tensors can be differentiated, got {t.dtype.name}")
        if t.requires_grad and is_grad_enabled():
            return ops.view(t, tuple(t.shape))
        return t.detach().requires_grad_(True)

    return _map(leaf, tree)


def _detach_unless_attached(tree, tracked):
    """Detach the results whose graph reaches no leaf but the transform's own copies: nothing outside
    can differentiate them (PyTorch hands back plain tensors then). Results that depend on the
    caller's tensors that require grad (a nested transform, parameters in a closure) stay attached."""
    own = {id(t) for t in _leaves(tracked) if isinstance(t, Tensor) and t.grad_fn is None}
    leaves = [t for t in _leaves(tree) if isinstance(t, Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    stack = [t.grad_fn for t in leaves]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) not in own:
            return tree
        stack.extend(edge[0] for edge in node.next_edges if edge is not None)
    return _map(lambda t: t.detach() if isinstance(t, Tensor) else t, tree)


def _split_aux(out, has_aux: bool, fn: str):
    if not has_aux:
        return out, None
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise RuntimeError(f"{fn}(f, has_aux=True): f must return a pair (output, aux), got {type(out).__name__}")
    return out[0], out[1]


def _differentiate(outputs: list, grad_outputs: list, inputs: list) -> list:
    live = [(o, g) for o, g in zip(outputs, grad_outputs, strict=True) if o.requires_grad]
    if not live:
        return [ops.zeros_like(t) for t in inputs]
    grads = _autograd_grad([o for o, _ in live], inputs, [g for _, g in live], retain_graph=True,
                           create_graph=is_grad_enabled(), allow_unused=True)  # fmt: skip
    return [ops.zeros_like(t) if g is None else g for t, g in zip(inputs, grads, strict=True)]


def grad_and_value(func, argnums=0, has_aux: bool = False):
    """A function returning ``(gradient, value)`` of ``func`` (which returns one element) with
    respect to the arguments ``argnums``; with ``has_aux``, ``((gradient), (value, aux))``."""

    def wrapper(*args, **kwargs):
        nums = _argnums(argnums, len(args), "grad_and_value")
        args = list(args)
        with enable_grad():
            for n in nums:
                args[n] = _track(args[n], "grad")
            out, aux = _split_aux(func(*args, **kwargs), has_aux, "grad")
            if not isinstance(out, Tensor) or out.numel() != 1:
                shape = list(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise RuntimeError(
                    f"grad(f)(*args): Expected f(*args) to return a tensor with one element, got {shape}"
                )
            targets = [args[n] for n in nums]
            flat = _differentiate([out], [ops.ones_like(out)], _leaves(targets))
        grads = _detach_unless_attached(_rebuild(targets, iter(flat)), targets)
        out = _detach_unless_attached(out, targets)
        result = grads[0] if isinstance(argnums, int) else tuple(grads)
        return (result, (out, aux)) if has_aux else (result, out)

    return wrapper


def grad(func, argnums=0, has_aux: bool = False):
    """A function returning the gradient of ``func`` with respect to argument ``argnums`` (a tuple
    of gradients for a tuple of argnums; ``(gradient, aux)`` with ``has_aux``)."""
    inner = grad_and_value(func, argnums, has_aux)

    def wrapper(*args, **kwargs):
        g, value = inner(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapper


def vjp(func, *primals, has_aux: bool = False):
    """``(func(*primals), vjp_fn)``; ``vjp_fn(cotangents)`` returns a tuple with the vector-Jacobian
    product for each primal."""
    with enable_grad():
        tracked = [_track(p, "vjp") for p in primals]
        out, aux = _split_aux(func(*tracked), has_aux, "vjp")
    outputs = _leaves(out)
    for o in outputs:
        if not isinstance(o, Tensor):
            raise RuntimeError(f"vjp(f, *primals): f must return tensors, got {type(o).__name__}")

    def vjp_fn(cotangents):
        cts = _leaves(cotangents)
        if len(cts) != len(outputs):
            raise RuntimeError(f"vjp_fn: expected {len(outputs)} cotangents (one per output), got {len(cts)}")
        for o, c in zip(outputs, cts, strict=True):
            if tuple(o.shape) != tuple(c.shape):
                raise RuntimeError(f"vjp_fn: a cotangent has shape {list(c.shape)}, its output {list(o.shape)}")
        with enable_grad():
            flat = _differentiate(outputs, cts, _leaves(tracked))
        return tuple(_detach_unless_attached(_rebuild(tracked, iter(flat)), tracked))

    out_plain = _detach_unless_attached(out, tracked)
    return (out_plain, vjp_fn, aux) if has_aux else (out_plain, vjp_fn)


def jvp(func, primals, tangents, *, strict: bool = False, has_aux: bool = False):
    """``(func(*primals), J @ tangents)``: the Jacobian-vector product, by the double-vjp trick
    (J v is the gradient with respect to u of u^T J, seeded with v)."""
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise RuntimeError("jvp(f, primals, tangents): Expected primals and tangents to be tuples")
    if len(primals) != len(tangents):
        raise RuntimeError(f"jvp: got {len(primals)} primals but {len(tangents)} tangents")
    for p, t in zip(_leaves(list(primals)), _leaves(list(tangents)), strict=True):
        if tuple(p.shape) != tuple(t.shape):
            raise RuntimeError(f"jvp: a tangent has shape {list(t.shape)}, its primal {list(p.shape)}")
    with enable_grad():
        tracked = [_track(p, "jvp") for p in primals]
        out, aux = _split_aux(func(*tracked), has_aux, "jvp")
        outputs = _leaves(out)
        dummies = [ops.zeros_like(o).requires_grad_(True) for o in outputs]
        transposed = _differentiate(outputs, dummies, _leaves(tracked))
        live = [(g, v) for g, v in zip(transposed, _leaves(list(tangents)), strict=True) if g.requires_grad]
        products: Sequence  # the gradients (None: no dependence), then with zeros for the Nones
        if live:
            products = _autograd_grad([g for g, _ in live], dummies, [v for _, v in live], retain_graph=True,
                                      create_graph=is_grad_enabled(), allow_unused=True)  # fmt: skip
        else:
            products = (None,) * len(outputs)
    if strict and any(p is None for p in products):
        raise RuntimeError("jvp: an output of the function does not depend on the primals (strict=True)")
    products = [ops.zeros_like(o) if p is None else p for o, p in zip(outputs, products, strict=True)]
    result = _detach_unless_attached(_rebuild(out, iter(products)), tracked)
    out = _detach_unless_attached(out, tracked)
    return (out, result, aux) if has_aux else (out, result)


def _jacobian(func, argnums, has_aux: bool, fn: str, by_columns: bool):
    def wrapper(*args):
        nums = _argnums(argnums, len(args), fn)
        args = list(args)
        with enable_grad():
            for n in nums:
                args[n] = _track(args[n], fn)
            out, aux = _split_aux(func(*args), has_aux, fn)
            inputs = [args[n] for n in nums]
            flat_in = _leaves(inputs)
            outputs = _leaves(out)
            blocks = (_columns if by_columns else _rows)(outputs, flat_in)
        per_output = []
        for i, o in enumerate(outputs):
            row = iter(ops.reshape(blocks[i][j], tuple(o.shape) + tuple(t.shape)) for j, t in enumerate(flat_in))
            tree = _rebuild(inputs, row)
            per_output.append(tree[0] if isinstance(argnums, int) else tuple(tree))
        result = _detach_unless_attached(_rebuild(out, iter(per_output)), inputs)
        return (result, aux) if has_aux else result

    return wrapper


def _rows(outputs: list, inputs: list) -> list:
    """blocks[i][j]: d output i / d input j as (output numel, input numel), one backward per output element."""
    blocks = []
    for o in outputs:
        flat = ops.reshape(o, (-1,))
        rows: list[list] = [[] for _ in inputs]
        for k in range(flat.numel()):
            for j, g in enumerate(_differentiate([flat[k]], [ops.ones_like(flat[k])], inputs)):
                rows[j].append(ops.reshape(g, (-1,)))
        blocks.append(
            [ops.stack(r) if r else ops.zeros((0, t.numel()), dtype=t.dtype) for r, t in zip(rows, inputs, strict=True)]
        )
    return blocks


def _columns(outputs: list, inputs: list) -> list:
    """The same blocks a column at a time: J e_k as the gradient of u^T J e_k with respect to u."""
    dummies = [ops.zeros_like(o).requires_grad_(True) for o in outputs]
    transposed: Sequence = _autograd_grad(
        outputs, inputs, dummies, retain_graph=True, create_graph=True, allow_unused=True
    )
    transposed = [ops.zeros_like(t) if g is None else g for t, g in zip(inputs, transposed, strict=True)]
    blocks: list[list] = [[] for _ in outputs]
    for t, gt in zip(inputs, transposed, strict=True):
        columns: list[list] = [[] for _ in outputs]
        flat = ops.reshape(gt, (-1,))
        for k in range(t.numel()):
            for i, c in enumerate(_differentiate([flat[k]], [ops.ones_like(flat[k])], dummies)):
                columns[i].append(ops.reshape(c, (-1,)))
        for i, o in enumerate(outputs):
            blocks[i].append(ops.stack(columns[i], -1) if columns[i] else ops.zeros((o.numel(), 0), dtype=o.dtype))
    return blocks


def jacrev(func, argnums=0, *, has_aux: bool = False, chunk_size=None):
    """The Jacobian of ``func`` with respect to ``argnums`` by reverse mode: for each output, a tensor
    of shape ``output.shape + input.shape`` (a tuple over argnums for a tuple of argnums)."""
    return _jacobian(func, argnums, has_aux, "jacrev", by_columns=False)


def jacfwd(func, argnums=0, has_aux: bool = False, *, randomness: str = "error"):
    """The Jacobian of ``func`` a column at a time (Jacobian-vector products by the double-vjp trick)."""
    return _jacobian(func, argnums, has_aux, "jacfwd", by_columns=True)


def hessian(func, argnums=0):
    """The Hessian of ``func`` (returning one element): ``jacfwd(jacrev(func))``."""
    return jacfwd(jacrev(func, argnums), argnums)


# ----------------------------------------------------------------------------- vmap
def _dims_for(in_dims, args) -> list:
    if isinstance(in_dims, int) or in_dims is None:
        return [_map(lambda _: in_dims, a) for a in args]
    if not isinstance(in_dims, tuple | list) or len(in_dims) != len(args):
        raise ValueError(
            f"vmap: in_dims must be an int, None, or a tuple with one entry per positional argument; "
            f"got in_dims={in_dims!r} for {len(args)} arguments"
        )
    out = []
    for d, a in zip(in_dims, args, strict=True):
        out.append(_map(lambda _, d=d: d, a) if isinstance(d, int) or d is None else _broadcast_dims(d, a))
    return out


def _broadcast_dims(dims, arg):
    if isinstance(dims, tuple | list) and isinstance(arg, tuple | list) and len(dims) == len(arg):
        return type(arg)(_map(lambda _, d=d: d, a) if isinstance(d, int) or d is None else _broadcast_dims(d, a)
                         for d, a in zip(dims, arg, strict=True))  # fmt: skip
    if isinstance(dims, dict) and isinstance(arg, dict):
        return {k: _broadcast_dims(dims[k], v) if not (isinstance(dims[k], int) or dims[k] is None)
                else _map(lambda _, d=dims[k]: d, v) for k, v in arg.items()}  # fmt: skip
    raise ValueError(f"vmap: in_dims {dims!r} does not match the structure of its argument")


def vmap(func, in_dims=0, out_dims=0, randomness: str = "error", *, chunk_size=None):
    """Map ``func`` over dimension ``in_dims`` of its arguments (None: not mapped) and stack the
    results along ``out_dims``. It loops over the batch (see the module's docstring)."""

    def wrapper(*args, **kwargs):
        dims = _dims_for(in_dims, args)
        leaves, leaf_dims = _leaves(list(args)), _leaves(dims)
        sizes = set()
        for leaf, d in zip(leaves, leaf_dims, strict=True):
            if d is None:
                continue
            if not isinstance(leaf, Tensor):
                raise ValueError(
                    f"vmap: in_dim={d} was given for an input that is not a tensor ({type(leaf).__name__})"
                )
            if not -leaf.ndim <= d < max(leaf.ndim, 1) or leaf.ndim == 0:
                raise ValueError(f"vmap: in_dim={d} is out of range for a tensor of shape {list(leaf.shape)}")
            sizes.add(leaf.shape[d])
        if not sizes:
            raise ValueError("vmap: at least one input must be mapped over (got in_dims that map no tensor)")
        if len(sizes) > 1:
            raise ValueError(
                f"vmap: Expected all tensors to have the same size in the mapped dimension, got sizes {sorted(sizes)}"
            )
        (size,) = sizes
        results = []
        for i in range(size):
            sliced = [leaf if d is None else ops.select(leaf, d, i) for leaf, d in zip(leaves, leaf_dims, strict=True)]
            results.append(func(*_rebuild(list(args), iter(sliced)), **kwargs))
        return _stack_results(results, out_dims, size)

    return wrapper


def _stack_results(results: list, out_dims, size: int):
    if size == 0:
        raise ValueError("vmap: the mapped dimension has size 0, so there is no result to stack")
    structure = results[0]
    per_result = [_leaves(r) for r in results]
    n = len(per_result[0])
    out_leaf_dims = _leaves(_map(lambda _: out_dims, structure)) if isinstance(out_dims, int) else _leaves(out_dims)
    if len(out_leaf_dims) != n:
        raise ValueError(f"vmap: out_dims={out_dims!r} does not match the {n} outputs of the function")
    stacked = []
    for k in range(n):
        column = [leaves[k] for leaves in per_result]
        if not isinstance(column[0], Tensor):
            raise ValueError(f"vmap: the function must return tensors, got {type(column[0]).__name__}")
        d = out_leaf_dims[k]
        stacked.append(ops.stack(column, d) if d is not None else column[0])
    return _rebuild(structure, iter(stacked))


# ----------------------------------------------------------------------------- functional_call
def functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None, *, tie_weights: bool = True,
                    strict: bool = False):  # fmt: skip
    """Call ``module(*args, **kwargs)`` with the named parameters and buffers replaced by the given
    tensors (``{"layer.weight": w, ...}``), restoring the module's own afterwards."""
    dicts = (
        parameter_and_buffer_dicts
        if isinstance(parameter_and_buffer_dicts, tuple | list)
        else (parameter_and_buffer_dicts,)
    )
    replacements: dict = {}
    for d in dicts:
        if not isinstance(d, Mapping):
            raise TypeError(f"functional_call: expected a dict of name -> tensor, got {type(d).__name__}")
        for k in d:
            if k in replacements:
                raise ValueError(f"functional_call: {k!r} appeared in multiple dictionaries")
        replacements.update(d)
    known = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    known |= {name for name, _ in module.named_buffers(remove_duplicate=False)}
    unexpected = sorted(set(replacements) - known)
    if unexpected:
        raise RuntimeError(f"functional_call: Unexpected key(s): {', '.join(map(repr, unexpected))}.")
    if strict:
        missing = sorted(known - set(replacements))
        if missing:
            raise RuntimeError(f"functional_call: Missing key(s): {', '.join(map(repr, missing))}.")
    saved = []
    try:
        for name, value in replacements.items():
            owner_path, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            store = "_parameters" if attr in owner.__dict__["_parameters"] else "_buffers"
            saved.append((owner.__dict__[store], attr, owner.__dict__[store][attr]))
            owner.__dict__[store][attr] = value
        args = () if args is None else args if isinstance(args, tuple) else (args,)
        return module(*args, **(kwargs or {}))
    finally:
        for store, attr, original in reversed(saved):
            store[attr] = original
