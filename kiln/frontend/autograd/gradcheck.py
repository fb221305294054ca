"""Gradient checks against central finite differences (use float64 inputs)."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .api import grad


class GradcheckError(RuntimeError):
    pass


def _outputs(fn, inputs) -> tuple[Tensor, ...]:
    out = fn(*inputs)
    out = out if isinstance(out, tuple | list) else (out,)
    return tuple(o for o in out if isinstance(o, Tensor) and o._dtype.is_floating_point)


def _numeric_jacobians(fn, inputs, diff, eps):
    """jac[i][j]: d output j / d input i, as (input numel, output numel) numpy arrays.

    Runs with grad mode as the caller has it: ``fn`` may itself differentiate (a VJP, for
    gradgradcheck). The perturbations write the inputs' arrays directly, outside autograd.
    """
    base = _outputs(fn, inputs)
    jac = [[np.zeros((inputs[i].numel(), o.numel())) for o in base] for i in diff]
    for a, i in enumerate(diff):
        flat = inputs[i]._data.reshape(-1)  # a view: the input must be contiguous
        for k in range(flat.size):
            orig = flat[k].copy()
            flat[k] = orig + eps
            plus = [o._host().astype(np.float64).ravel() for o in _outputs(fn, inputs)]
            flat[k] = orig - eps
            minus = [o._host().astype(np.float64).ravel() for o in _outputs(fn, inputs)]
            flat[k] = orig
            for j in range(len(base)):
                jac[a][j][k] = (plus[j] - minus[j]) / (2 * eps)
    return jac


def _analytic_jacobians(fn, inputs, diff):
    outs = _outputs(fn, inputs)
    targets = [inputs[i] for i in diff]
    jac = [[np.zeros((t.numel(), o.numel())) for o in outs] for t in targets]
    from ..ops import zeros_like  # noqa: PLC0415

    for j, o in enumerate(outs):
        if not o._requires_grad:
            continue
        for m in range(o.numel()):
            seed = zeros_like(o)
            seed._data.reshape(-1)[m] = 1
            grads = grad(o, targets, seed, retain_graph=True, allow_unused=True)
            for a, g in enumerate(grads):
                if g is not None:
                    if tuple(g.shape) != tuple(targets[a].shape):
                        raise GradcheckError(f"gradient for input {diff[a]} has shape {tuple(g.shape)}, "
                                             f"expected {tuple(targets[a].shape)}")  # fmt: skip
                    jac[a][j][:, m] = g._host().astype(np.float64).ravel()
    return jac


def gradcheck(fn, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True) -> bool:  # fmt: skip
    """Compare ``fn``'s gradients with central differences for every input that requires grad.

    >>> import kiln
    >>> x = kiln.randn(3, dtype=kiln.float64, requires_grad=True)
    >>> gradcheck(kiln.tanh, (x,))
    True
    """
    inputs = tuple(inputs) if isinstance(inputs, tuple | list) else (inputs,)
    diff = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t._requires_grad]
    for i in diff:
        if inputs[i]._dtype.name != "float64":
            raise GradcheckError(f"gradcheck expects float64 inputs for accurate differences; input {i} is "
                                 f"{inputs[i]._dtype.name}")  # fmt: skip
        if not inputs[i].is_contiguous():
            raise GradcheckError(f"gradcheck expects contiguous inputs; input {i} is not")
    numeric = _numeric_jacobians(fn, inputs, diff, eps)
    analytic = _analytic_jacobians(fn, inputs, diff)
    for a, i in enumerate(diff):
        for j, (n, an) in enumerate(zip(numeric[a], analytic[a], strict=True)):
            if not np.allclose(an, n, rtol=rtol, atol=atol):
                bad = np.unravel_index(np.argmax(np.abs(an - n) - rtol * np.abs(n)), n.shape)
                message = (
                    f"Jacobian mismatch for output {j} with respect to input {i}: at (input element "
                    f"{bad[0]}, output element {bad[1]}) numerical {n[bad]:.6g} vs analytical {an[bad]:.6g} "
                    f"(atol={atol}, rtol={rtol})\nnumerical:\n{n}\nanalytical:\n{an}"
                )
                if raise_exception:
                    raise GradcheckError(message)
                return False
    return True


def gradgradcheck(fn, inputs, grad_outputs=None, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  raise_exception: bool = True) -> bool:  # fmt: skip
    """Check second derivatives: ``gradcheck`` of the function inputs -> vector-Jacobian products."""
    from ..ops import randn_like  # noqa: PLC0415

    inputs = tuple(inputs) if isinstance(inputs, tuple | list) else (inputs,)
    diff = [t for t in inputs if isinstance(t, Tensor) and t._requires_grad]
    if grad_outputs is None:
        grad_outputs = tuple(randn_like(o).requires_grad_() for o in _outputs(fn, inputs))
    n = len(inputs)

    def vjp(*args):
        outs = _outputs(fn, args[:n])
        primal = [args[i] for i in range(n) if isinstance(args[i], Tensor) and args[i]._requires_grad]
        grads = grad(outs, primal, args[n:], create_graph=True, allow_unused=True, materialize_grads=True)
        return tuple(grads)

    assert diff, "gradgradcheck needs at least one input with requires_grad=True"
    return gradcheck(vjp, inputs + tuple(grad_outputs), eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception)
