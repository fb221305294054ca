"""L-BFGS: quasi-Newton steps from a short history of gradient differences, with a closure.

The algorithm decides with Python numbers (convergence tests, the line search), so a step reads
values back from tensors: ``LBFGS.step`` runs eagerly and is not meant for ``kiln.compile``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import kiln

from .optimizer import Optimizer


def _cubic_minimum(x1, f1, g1, x2, f2, g2, bounds=None) -> float:
    """Minimizer of the cubic through (x1, f1, g1) and (x2, f2, g2), clamped to ``bounds``."""
    low, high = bounds if bounds is not None else (min(x1, x2), max(x1, x2))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 * d1 - g1 * g2
    if d2_square < 0:  # no real minimizer: bisect
        return (low + high) / 2.0
    d2 = d2_square**0.5
    if x1 <= x2:
        at = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        at = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(at, low), high)


def _strong_wolfe(evaluate, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """A step ``t`` along ``d`` meeting the strong Wolfe conditions: bracket, then zoom (More-Thuente style).

    ``evaluate(t)`` returns (loss, flat gradient) at x + t d. Returns (loss, grad, t, evaluations).
    """
    d_norm = float(d.abs().max())
    f_new, g_new = evaluate(t)
    evals, ls_iter = 1, 0
    gtd_new = float(g_new.dot(d))
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g, gtd
    done = False
    while ls_iter < max_ls:
        sufficient_decrease = not (f_new > f + c1 * t * gtd or (ls_iter > 1 and f_new >= f_prev))
        if sufficient_decrease and abs(gtd_new) <= -c2 * gtd:
            bracket, done = [[t, f_new, g_new, gtd_new]], True
            break
        if not sufficient_decrease or gtd_new >= 0:  # a minimizer lies between the last two trials
            bracket = [[t_prev, f_prev, g_prev, gtd_prev], [t, f_new, g_new, gtd_new]]
            break
        # Extrapolate: a cubic step kept between a little and ten times past the current point.
        t_next = _cubic_minimum(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(t + 0.01 * (t - t_prev), t * 10))
        t_prev, f_prev, g_prev, gtd_prev = t, f_new, g_new, gtd_new
        t = t_next
        f_new, g_new = evaluate(t)
        evals, ls_iter = evals + 1, ls_iter + 1
        gtd_new = float(g_new.dot(d))
    if ls_iter == max_ls:
        bracket = [[0.0, f, g, gtd], [t, f_new, g_new, gtd_new]]
    low, high = (0, 1) if bracket[0][1] <= bracket[-1][1] else (1, 0)
    insufficient_progress = False
    while not done and ls_iter < max_ls:
        (t0, f0, _, gtd0), (t1, f1, _, gtd1) = bracket
        if abs(t1 - t0) * d_norm < tolerance_change:
            break
        t = _cubic_minimum(t0, f0, gtd0, t1, f1, gtd1)
        top, bottom = max(t0, t1), min(t0, t1)
        eps = 0.1 * (top - bottom)
        # A trial too close to an end of the bracket is pushed inside, unless progress was made.
        if min(top - t, t - bottom) < eps:
            if insufficient_progress or t >= top or t <= bottom:
                t = top - eps if abs(t - top) < abs(t - bottom) else bottom + eps
                insufficient_progress = False
            else:
                insufficient_progress = True
        else:
            insufficient_progress = False
        f_new, g_new = evaluate(t)
        evals, ls_iter = evals + 1, ls_iter + 1
        gtd_new = float(g_new.dot(d))
        point = [t, f_new, g_new, gtd_new]
        if f_new > f + c1 * t * gtd or f_new >= bracket[low][1]:
            bracket[high] = point
            low, high = (0, 1) if bracket[0][1] <= bracket[1][1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high][0] - bracket[low][0]) >= 0:
                bracket[high] = bracket[low]
            bracket[low] = point
    t, f_new, g_new, _ = bracket[low]
    return f_new, g_new, t, evals


class LBFGS(Optimizer):
    """PyTorch's ``torch.optim.LBFGS``: ``step(closure)`` runs up to ``max_iter`` iterations.

    The closure clears the gradients, computes the loss, calls ``backward()`` and returns the loss.
    Only one parameter group is supported (as in PyTorch).

    >>> w = kiln.tensor([3.0], requires_grad=True)
    >>> opt = LBFGS([w], line_search_fn="strong_wolfe")
    >>> def closure():
    ...     opt.zero_grad()
    ...     loss = ((w - 1.0) ** 2).sum()
    ...     loss.backward()
    ...     return loss
    >>> _ = opt.step(closure)
    >>> round(w.item(), 4)
    1.0
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1.0,
        max_iter: int = 20,
        max_eval: int | None = None,
        tolerance_grad: float = 1e-7,
        tolerance_change: float = 1e-9,
        history_size: int = 100,
        line_search_fn: str | None = None,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        if line_search_fn not in (None, "strong_wolfe"):
            raise RuntimeError("only 'strong_wolfe' is supported")
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval, tolerance_grad=tolerance_grad,
                        tolerance_change=tolerance_change, history_size=history_size,
                        line_search_fn=line_search_fn)  # fmt: skip
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]

    def _flat_grad(self) -> kiln.Tensor:
        return kiln.cat([kiln.zeros(p.numel(), dtype=p.dtype, device=p.device) if p.grad is None
                         else p.grad.reshape(-1) for p in self._params])  # fmt: skip

    def _add_direction(self, t: float, d: kiln.Tensor) -> None:
        offset = 0
        with kiln.no_grad():
            for p in self._params:
                n = p.numel()
                p.add_(d[offset : offset + n].reshape(p.shape) * t)
                offset += n

    def _evaluate_at(self, closure, start, d):
        """(loss, flat grad) at start + t d, leaving the parameters at ``start``."""

        def evaluate(t):
            self._add_direction(t, d)
            with kiln.enable_grad():
                loss = float(closure())
            grad = self._flat_grad()
            with kiln.no_grad():
                for p, value in zip(self._params, start, strict=True):
                    p.copy_(value)
            return loss, grad

        return evaluate

    def _direction(self, state, grad, history_size: int) -> kiln.Tensor:
        """Two-loop recursion: the inverse-Hessian approximation applied to -grad."""
        y = grad - state["prev_flat_grad"]
        s = state["d"] * state["t"]
        ys = float(y.dot(s))
        if ys > 1e-10:  # skip pairs that would break positive definiteness
            if len(state["old_dirs"]) == history_size:
                for key in ("old_dirs", "old_stps", "ro"):
                    state[key].pop(0)
            state["old_dirs"].append(y)
            state["old_stps"].append(s)
            state["ro"].append(1.0 / ys)
            state["H_diag"] = ys / float(y.dot(y))
        dirs, steps, ro = state["old_dirs"], state["old_stps"], state["ro"]
        alphas = [0.0] * len(dirs)
        q = -grad
        for i in range(len(dirs) - 1, -1, -1):
            alphas[i] = float(steps[i].dot(q)) * ro[i]
            q = q - dirs[i] * alphas[i]
        r = q * state["H_diag"]
        for i in range(len(dirs)):
            beta = float(dirs[i].dot(r)) * ro[i]
            r = r + steps[i] * (alphas[i] - beta)
        return r

    def step(self, closure: Callable[[], Any]) -> Any:  # type: ignore[override]
        """Run up to ``max_iter`` iterations; returns the closure's first loss."""
        if closure is None:
            raise RuntimeError("LBFGS.step requires a closure that reevaluates the model and returns the loss")
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        with kiln.enable_grad():
            orig_loss = closure()
        loss = float(orig_loss)
        evals = 1
        state["func_evals"] += 1
        grad = self._flat_grad()
        if float(grad.abs().max()) <= tolerance_grad:
            return orig_loss
        iteration = 0
        while iteration < max_iter:
            iteration += 1
            state["n_iter"] += 1
            with kiln.no_grad():
                if state["n_iter"] == 1:
                    d = -grad
                    state.update(old_dirs=[], old_stps=[], ro=[], H_diag=1.0)
                else:
                    d = self._direction(state, grad, group["history_size"])
            state["prev_flat_grad"], prev_loss = grad.detach().clone(), loss
            # The first step is scaled so it moves no coordinate by more than lr.
            t = min(1.0, float(1.0 / grad.abs().sum())) * lr if state["n_iter"] == 1 else lr
            gtd = float(grad.dot(d))
            state["d"], state["t"] = d, t
            if gtd > -tolerance_change:  # not a descent direction
                break
            ls_evals = 0
            if group["line_search_fn"] == "strong_wolfe":
                start = [p.detach().clone() for p in self._params]
                evaluate = self._evaluate_at(closure, start, d)
                loss, grad, t, ls_evals = _strong_wolfe(evaluate, t, d, loss, grad, gtd)
                state["t"] = t
                self._add_direction(t, d)
                converged = float(grad.abs().max()) <= tolerance_grad
            else:
                self._add_direction(t, d)
                converged = False
                if iteration != max_iter:
                    with kiln.enable_grad():
                        loss = float(closure())
                    grad = self._flat_grad()
                    converged = float(grad.abs().max()) <= tolerance_grad
                    ls_evals = 1
            evals += ls_evals
            state["func_evals"] += ls_evals
            if iteration == max_iter or evals >= max_eval or converged:
                break
            if float((d * t).abs().max()) <= tolerance_change or abs(loss - prev_loss) < tolerance_change:
                break
        state["prev_loss"] = loss
        return orig_loss
