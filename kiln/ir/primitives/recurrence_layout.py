"""Where each per-step quantity of a recurrence lies in the packed outputs of ``rnn_scan`` and
``rnn_scan_backward`` (``recurrence.py``), shared by their kernels, their VJP and the frontend.

``rnn_scan``'s output is (T, B, ``width``); row t (natural time order, whatever the direction) holds,
along the last axis, for step t:

- ``out``: the states after the step (h, and an LSTM's c, after the final states), each H wide; h is
  the step's output;
- ``final``: the direction's final states in the row of its last step (t = T - 1 forward, 0 in
  reverse) and zeros in every other row, so that a sum over time reads them with ops that keep T
  whole (a symbolic T cannot be sliced, nor can T + 1 be a size);
- ``prev``: the states before the step (the initial ones in the direction's first row);
- ``gates``: the gate activations (G H: an LSTM's i, f, g, o; a GRU's r, z, n; an RNN's output);
- ``extra`` (LSTM and GRU, H): an LSTM's tanh(c), a GRU's h W_hn^T + b_hn.

``rnn_scan_backward``'s output is (T, B, ``grad_width``): ``dz``, the gradient of each step's gate
pre-activations (G H); a GRU's ``dz_hh`` (G H), that of h W_hh^T + b_hh, which differs from ``dz`` in
the n block (the reset gate scales it); then ``initial``: the gradients of the initial states, in the
row of the direction's first step and zeros elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The gate blocks of each mode, stacked along the weights' dim 0 in PyTorch's order.
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
MODES = tuple(GATES)

Span = tuple[int, int]  # (start, size) along the last axis


@dataclass(frozen=True)
class ScanLayout:
    """The packed layouts of one direction of ``mode`` with hidden size ``hidden``."""

    mode: str
    hidden: int

    @property
    def gates(self) -> int:
        return GATES[self.mode]

    @property
    def states(self) -> int:
        """2 for an LSTM's (h, c), else 1."""
        return 2 if self.mode == "LSTM" else 1

    # The blocks the frontend reads, the output h and the final states, come first and side by side
    # (h, final h[, final c][, c]): their gradients are then one zero pad of adjacent pieces (the
    # simplifier joins pads that touch), not pads of the full width added together.
    def out(self, k: int) -> Span:
        """State ``k`` (0: h, 1: c) after each step."""
        return (0 if k == 0 else (1 + self.states) * self.hidden, self.hidden)

    def final(self, k: int) -> Span:
        return ((1 + k) * self.hidden, self.hidden)

    def prev(self, k: int) -> Span:
        return ((2 * self.states + k) * self.hidden, self.hidden)

    @property
    def gate_span(self) -> Span:
        return (3 * self.states * self.hidden, self.gates * self.hidden)

    @property
    def extra(self) -> Span | None:
        start, size = self.gate_span
        return None if self.mode.startswith("RNN") else (start + size, self.hidden)

    @property
    def parts(self) -> tuple[Span, ...]:
        """Every block of a row, in order along it: what ``rnn_scan_backward`` takes one cotangent
        of each of (or of all at once, packed)."""
        spans = [*(self.out(k) for k in range(self.states)), *(self.final(k) for k in range(self.states)),
                 *(self.prev(k) for k in range(self.states)), self.gate_span]  # fmt: skip
        return tuple(sorted(spans + ([] if self.extra is None else [self.extra])))

    @property
    def width(self) -> int:
        start, size = self.extra or self.gate_span
        return start + size

    # ------------------------------------------------------------------ rnn_scan_backward's output
    @property
    def dz(self) -> Span:
        return (0, self.gates * self.hidden)

    @property
    def dz_hh(self) -> Span:
        """A GRU's own block; the other modes' ``dz`` is their ``dz_hh``."""
        size = self.gates * self.hidden
        return (size, size) if self.mode == "GRU" else (0, size)

    def initial(self, k: int) -> Span:
        start, size = self.dz_hh
        return (start + size + k * self.hidden, self.hidden)

    @property
    def grad_width(self) -> int:
        start, size = self.initial(self.states - 1)
        return start + size
