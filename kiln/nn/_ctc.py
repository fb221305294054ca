"""``ctc_loss``: connectionist temporal classification, the forward (alpha) recursion in log space.

The recursion runs over time on all sequences of the batch at once, over the extended label
sequence (a blank before, between and after the targets). Its gradient comes from autograd through
a log-sum-exp that stays finite where every term is -inf (unreachable states), so no nan leaks in.

The gradient is the true one with respect to ``log_probs``. PyTorch's backward instead reports
``softmax - posterior`` there (the gradient of the logits, assuming ``log_probs`` came from
``log_softmax``); through a ``log_softmax`` both give the same gradient for the logits.
"""

from __future__ import annotations

import math

import kiln

__all__ = ["ctc_loss"]


def _logsumexp(terms):
    """log(sum(exp(t))) over a list of equally shaped tensors; -inf (with a zero gradient) when all are -inf."""
    stacked = kiln.stack(terms, dim=0)
    top = stacked.amax(dim=0).detach()
    top = kiln.where(kiln.isfinite(top), top, 0.0)
    total = kiln.exp(stacked - top).sum(dim=0)
    positive = total > 0
    return kiln.where(positive, top + kiln.log(kiln.where(positive, total, 1.0)), -math.inf)


def _lengths(values, name: str) -> list[int]:
    if isinstance(values, kiln.Tensor):
        return [int(v) for v in values.reshape(-1).tolist()]
    return [int(v) for v in values]


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False) -> kiln.Tensor:  # fmt: skip
    """CTC loss of ``log_probs`` (T, N, C) (or unbatched (T, C)) for ``targets`` (N, S) or concatenated (sum S_n,)."""
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    batched = log_probs.ndim == 3
    lp = log_probs if batched else log_probs.unsqueeze(1)
    steps, n, classes = lp.shape
    in_lens, tgt_lens = _lengths(input_lengths, "input_lengths"), _lengths(target_lengths, "target_lengths")
    if len(in_lens) != n or len(tgt_lens) != n:
        raise RuntimeError(f"ctc_loss: expected {n} input and target lengths, got {len(in_lens)} and {len(tgt_lens)}")
    if any(t > steps for t in in_lens):
        raise RuntimeError(f"ctc_loss: an input length exceeds the input's {steps} time steps: {in_lens}")
    longest = max(tgt_lens) if tgt_lens else 0
    flat = targets.to(kiln.int64)
    if not batched:
        flat = flat.reshape(1, -1)
    if flat.ndim == 1:  # concatenated targets: cut and pad to (N, longest)
        rows, start = [], 0
        for length in tgt_lens:
            row = flat[start : start + length]
            rows.append(kiln.nn.functional.pad(row, (0, longest - length), value=blank))
            start += length
        padded = kiln.stack(rows) if rows else kiln.zeros(0, longest, dtype=kiln.int64)
    else:
        padded = flat[:, :longest]
    extended_len = 2 * longest + 1
    # Extended labels: blank at even positions, target k at position 2k + 1.
    ext = kiln.full((n, extended_len), blank, dtype=kiln.int64, device=lp.device)
    if longest:
        ext[:, 1::2] = padded
    # A skip from s - 2 is allowed onto a label that differs from the label two back.
    skip_ok = kiln.zeros((n, extended_len), dtype=kiln.bool, device=lp.device)
    if longest > 1:
        skip_ok[:, 3::2] = padded[:, 1:] != padded[:, :-1]
    neg_inf = kiln.full((n, 2), -math.inf, dtype=lp.dtype, device=lp.device)
    emit = kiln.gather(lp, 2, ext.unsqueeze(0).expand(steps, n, extended_len))  # (T, N, L)
    position = kiln.arange(extended_len, device=lp.device).reshape(1, -1)
    alpha = kiln.where(position < 2, emit[0], -math.inf)
    alphas = [alpha]
    for t in range(1, steps):
        stay = alpha
        step = kiln.cat([neg_inf[:, :1], alpha[:, :-1]], dim=1)
        skip = kiln.where(skip_ok, kiln.cat([neg_inf, alpha[:, :-2]], dim=1), -math.inf)
        alpha = _logsumexp([stay, step, skip]) + emit[t]
        alphas.append(alpha)
    history = kiln.stack(alphas, dim=0)  # (T, N, L)
    losses = []
    for b in range(n):
        if in_lens[b] == 0:
            losses.append(kiln.tensor(0.0 if tgt_lens[b] == 0 else math.inf, dtype=lp.dtype))
            continue
        last = history[in_lens[b] - 1, b]
        end = 2 * tgt_lens[b]
        finals = [last[end]] if tgt_lens[b] == 0 else [last[end], last[end - 1]]
        losses.append(-_logsumexp(finals))
    loss = kiln.stack(losses)
    if zero_infinity:
        loss = kiln.where(kiln.isinf(loss), 0.0, loss)
    if reduction == "none":
        return loss if batched else loss.reshape(())
    if reduction == "sum":
        return loss.sum()
    divisors = kiln.tensor([max(t, 1) for t in tgt_lens], dtype=lp.dtype, device=lp.device)
    return (loss / divisors).mean()
