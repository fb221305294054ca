"""How tensors print: PyTorch's format, with ``kiln.`` where PyTorch writes ``torch.``.

>>> import kiln
>>> kiln.tensor([[1, 2], [3, 4]])
tensor([[1, 2],
        [3, 4]])
>>> kiln.tensor([1.0, 2.5, 1e-5])
tensor([1.0000e+00, 2.5000e+00, 1.0000e-05])
>>> kiln.tensor([], dtype=kiln.int64).reshape(0, 3)
tensor([], size=(0, 3), dtype=kiln.int64)

The rules, as PyTorch's: floats print with ``precision`` decimals, or as ``1.`` when every
finite value is an integer, or in scientific notation when the finite nonzero magnitudes span
more than a factor 1000, exceed 1e8 or fall below 1e-4; columns are right-aligned to the widest
value; more than ``threshold`` elements are summarized with ``...`` keeping ``edgeitems`` at
each end of every dimension; a suffix names the device when not the CPU, the dtype when it is
not one a reader would infer (the default float, int64, bool), and the autograd state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from ..ir import dtypes as dt
from ..ir.types import CPU


@dataclasses.dataclass
class PrintOptions:
    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: bool | None = None  # None: decide from the values, as PyTorch does


PRINT_OPTS = PrintOptions()
_PROFILES = {
    "default": PrintOptions(),
    "short": PrintOptions(precision=2, edgeitems=2),
    "full": PrintOptions(threshold=math.inf),
}


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None, profile=None, sci_mode=None):
    """PyTorch's ``set_printoptions``: change how tensors print (``profile``: default, short, full)."""
    if profile is not None:
        for field in dataclasses.fields(PrintOptions):
            setattr(PRINT_OPTS, field.name, getattr(_PROFILES[profile], field.name))
    for name, value in (("precision", precision), ("threshold", threshold), ("edgeitems", edgeitems),
                        ("linewidth", linewidth)):  # fmt: skip
        if value is not None:
            setattr(PRINT_OPTS, name, value)
    PRINT_OPTS.sci_mode = sci_mode


@contextlib.contextmanager
def printoptions(**options):
    """Change the print options inside a ``with`` block only."""
    saved = dataclasses.replace(PRINT_OPTS)
    set_printoptions(**options)
    try:
        yield
    finally:
        for field in dataclasses.fields(PrintOptions):
            setattr(PRINT_OPTS, field.name, getattr(saved, field.name))


class _Formatter:
    """Chooses one format for all elements (fixed, integer-valued or scientific) and the width."""

    def __init__(self, values: np.ndarray, floating: bool) -> None:
        self.floating = floating
        self.int_mode, self.sci_mode, self.width = True, False, 1
        flat = values.reshape(-1)
        if not floating:
            self.width = max((len(str(v)) for v in flat.tolist()), default=1)
            return
        finite = flat[np.isfinite(flat) & (flat != 0)]
        if finite.size == 0:
            return
        magnitudes = np.abs(finite.astype(np.float64))
        low, high = magnitudes.min(), magnitudes.max()
        self.int_mode = bool(np.all(finite == np.ceil(finite)))
        opts = PRINT_OPTS
        self.sci_mode = (
            (high / low > 1000.0 or high > 1.0e8 or low < 1.0e-4) if opts.sci_mode is None else opts.sci_mode
        )
        numbers = finite.astype(np.float64).tolist()
        if self.sci_mode:
            self.width = max(len(f"{v:.{opts.precision}e}") for v in numbers)
        elif self.int_mode:
            self.width = max(len(f"{v:.0f}") + 1 for v in numbers)  # + 1 for the trailing "."
        else:
            self.width = max(len(f"{v:.{opts.precision}f}") for v in numbers)

    def format(self, value) -> str:
        if not self.floating:
            text = str(value)
        elif self.sci_mode:
            text = f"{value:{self.width}.{PRINT_OPTS.precision}e}"
        elif self.int_mode:
            text = f"{value:.0f}" + ("" if math.isinf(value) or math.isnan(value) else ".")
        else:
            text = f"{value:.{PRINT_OPTS.precision}f}"
        return " " * (self.width - len(text)) + text


def _summarized(a: np.ndarray) -> np.ndarray:
    """The elements that will be shown: ``edgeitems`` at each end of every long dimension."""
    edge = PRINT_OPTS.edgeitems
    for axis, n in enumerate(a.shape):
        if n > 2 * edge:
            a = np.take(a, list(range(edge)) + list(range(n - edge, n)), axis=axis)
    return a


def _vector(a: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    per_line = max(1, (PRINT_OPTS.linewidth - indent) // (fmt.width + 2))
    edge = PRINT_OPTS.edgeitems
    if summarize and a.shape[0] > 2 * edge:
        items = [fmt.format(v) for v in a[:edge].tolist()] + [" ..."] + [fmt.format(v) for v in a[-edge:].tolist()]
    else:
        items = [fmt.format(v) for v in a.tolist()]
    lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested(a: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    if a.ndim == 0:
        return fmt.format(a.item())
    if a.ndim == 1:
        return _vector(a, indent, summarize, fmt)
    edge, n = PRINT_OPTS.edgeitems, a.shape[0]
    if summarize and n > 2 * edge:
        rows = [_nested(a[i], indent + 1, summarize, fmt) for i in range(edge)]
        rows += ["..."] + [_nested(a[i], indent + 1, summarize, fmt) for i in range(n - edge, n)]
    else:
        rows = [_nested(a[i], indent + 1, summarize, fmt) for i in range(n)]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(rows) + "]"


def array_str(a: np.ndarray, dtype: dt.DType, indent: int) -> str:
    """The bracketed values of ``a`` (no prefix or suffixes), aligned for ``indent`` columns."""
    if a.size == 0:
        return "[]"
    summarize = a.size > PRINT_OPTS.threshold
    fmt = _Formatter(_summarized(a) if summarize else a, dtype.is_floating_point)
    return _nested(a, indent, summarize, fmt)


def _with_suffixes(text: str, suffixes: list[str], indent: int) -> str:
    # PyTorch's line-length bookkeeping, quirks included, so that wrapped suffixes match.
    parts = [text]
    last_line = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_line + len(suffix) + 2 > PRINT_OPTS.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            last_line = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line += len(suffix) + 2
    return "".join(parts) + ")"


def tensor_repr(t) -> str:
    """``repr(tensor)``: PyTorch's text with ``kiln.`` dtypes (``grad_fn`` names are kiln's)."""
    t._value_access("printing a Tensor")
    name = type(t).__name__
    prefix = "tensor(" if name in ("Tensor", "Parameter") else f"{name}("
    indent = len(prefix)
    suffixes = []
    if t._device is not CPU:
        suffixes.append(f"device='{t._device}'")
    a = t._host()
    default = dt.get_default_dtype()
    if a.size == 0:
        if a.ndim != 1:
            suffixes.append(f"size={tuple(a.shape)}")
        if t._dtype is not default:
            suffixes.append(f"dtype={t._dtype!r}")
    elif t._dtype not in (default, dt.int64, dt.bool_):
        suffixes.append(f"dtype={t._dtype!r}")
    text = array_str(a, t._dtype, indent)
    if t.grad_fn is not None:
        node = t.grad_fn
        suffixes.append(f"grad_fn=<{node.name() if hasattr(node, 'name') else type(node).__name__}>")
    elif t._requires_grad:
        suffixes.append("requires_grad=True")
    return _with_suffixes(prefix + text, suffixes, indent)
