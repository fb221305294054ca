"""``torch.*`` math that kiln lacked under PyTorch's names: the spectral windows (``hann_window``...),
``histogram``, ``gradient``, ``nextafter``, ``mvlgamma``, the deprecated inclusive ``range``,
``poisson``/``binomial`` sampling, ``rsub``, ``fill``, and small predicates (``is_same_size``,
``is_signed``, ``typename``...), with ``frombuffer``.

``gradient`` and ``mvlgamma`` are written over kiln's differentiable ops, so they carry gradients and
compile. ``histogram``, ``nextafter``, ``poisson`` and ``binomial`` read the values with numpy (as
``histc`` and ``unique`` do): under ``kiln.compile`` the trace stops there with a reason naming the
op, and the call finishes eagerly. ``poisson`` and ``binomial`` draw their numpy stream's seed from
kiln's generator, so ``kiln.manual_seed`` makes them repeat (but not PyTorch's numbers).

This module sits on the public side, over the frontend and ``kiln.special``.
"""

from __future__ import annotations

import math
import warnings
from collections import namedtuple

import numpy as np

from . import special
from .frontend import ops
from .frontend.autograd.grad_mode import is_inference_mode_enabled
from .frontend.jit import state as _jit
from .frontend.ops.generator import _generator
from .frontend.ops.inplace import commit_inplace
from .frontend.ops.random import _random_below
from .frontend.tensor import Tensor, method
from .ir import dtypes as dt

__all__ = [
    "hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window", "histogram", "gradient",
    "nextafter", "mvlgamma", "range", "poisson", "binomial", "rsub", "fill", "is_same_size", "is_signed",
    "is_inference_mode_enabled", "typename", "frombuffer",
]  # fmt: skip

HistogramResult = namedtuple("histogram", ["hist", "bin_edges"])  # type: ignore[name-match]  # torch.return_types
_range = range  # the builtin, before this module's ``range`` hides it


# ----------------------------------------------------------------------------- windows
def _window(name: str, window_length: int, periodic: bool, dtype, device, requires_grad: bool, formula) -> Tensor:
    """``formula(n, N)`` over ``n = 0..N-1`` in float64, ``N = window_length + 1`` when ``periodic``
    (the symmetric window one longer, its last point dropped, as PyTorch and scipy do)."""
    dtype = dt.get_default_dtype() if dtype is None else dtype
    if not dtype.is_floating_point:
        raise RuntimeError(f"{name} expects floating point dtypes, got: {dtype.name}")
    if window_length < 0:
        raise RuntimeError(f"{name} requires non-negative window_length, got window_length={window_length}")
    if window_length <= 1:
        values = np.ones(window_length)
    else:
        size = window_length + 1 if periodic else window_length
        values = formula(np.arange(size, dtype=np.float64), size)[:window_length]
    return ops.tensor(values, dtype=dtype, device=device, requires_grad=requires_grad)


def _cosines(*coefficients: float):
    """``sum_k (-1)^k a_k cos(2 pi k n / (N - 1))``: the generalized cosine windows."""

    def formula(n, size):
        phase = 2 * np.pi * n / (size - 1)
        return sum((-1) ** k * a * np.cos(k * phase) for k, a in enumerate(coefficients))

    return formula


def hann_window(window_length: int, periodic: bool = True, *, dtype=None, layout=None, device=None,
                requires_grad: bool = False) -> Tensor:  # fmt: skip
    """``0.5 - 0.5 cos(2 pi n / (N - 1))``.

    >>> import kiln
    >>> kiln.hann_window(4)
    tensor([0.0000, 0.5000, 1.0000, 0.5000])
    """
    return _window("hann_window", window_length, periodic, dtype, device, requires_grad, _cosines(0.5, 0.5))


def hamming_window(window_length: int, periodic: bool = True, alpha: float = 0.54, beta: float = 0.46, *,
                   dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:  # fmt: skip
    return _window("hamming_window", window_length, periodic, dtype, device, requires_grad, _cosines(alpha, beta))


def blackman_window(window_length: int, periodic: bool = True, *, dtype=None, layout=None, device=None,
                    requires_grad: bool = False) -> Tensor:  # fmt: skip
    return _window("blackman_window", window_length, periodic, dtype, device, requires_grad,
                   _cosines(0.42, 0.5, 0.08))  # fmt: skip


def bartlett_window(window_length: int, periodic: bool = True, *, dtype=None, layout=None, device=None,
                    requires_grad: bool = False) -> Tensor:  # fmt: skip
    """The triangle ``1 - |2 n / (N - 1) - 1|``."""
    return _window("bartlett_window", window_length, periodic, dtype, device, requires_grad,
                   lambda n, size: 1 - np.abs(2 * n / (size - 1) - 1))  # fmt: skip


def kaiser_window(window_length: int, periodic: bool = True, beta: float = 12.0, *, dtype=None, layout=None,
                  device=None, requires_grad: bool = False) -> Tensor:  # fmt: skip
    """``I0(beta sqrt(1 - (2 n / (N - 1) - 1)^2)) / I0(beta)``."""
    return _window("kaiser_window", window_length, periodic, dtype, device, requires_grad,
                   lambda n, size: np.i0(beta * np.sqrt(1 - (2 * n / (size - 1) - 1) ** 2)) / np.i0(beta))  # fmt: skip


# ----------------------------------------------------------------------------- value-dependent results
def _values_of(input: Tensor, op: str) -> np.ndarray:
    if _jit.tracing:
        _jit.unsafe(f"{op} has no compiled form (kiln computes it with numpy from the values)")
    return input.detach()._host()


def _made(array: np.ndarray, like: Tensor, dtype: dt.DType) -> Tensor:
    return ops.tensor(np.ascontiguousarray(array), dtype=dtype, device=like.device)


@method("histogram")
def histogram(input: Tensor, bins=100, *, range=None, weight: Tensor | None = None,  # noqa: A002 - PyTorch's name
              density: bool = False) -> HistogramResult:  # fmt: skip
    """Counts (or summed ``weight``) of ``input``'s elements in ``bins`` equal bins over ``range``
    (the data's min and max by default), or between the edges of a 1-D tensor ``bins``; the last bin
    includes its right edge. ``density`` divides by the total and the bin widths. Both results
    have ``input``'s (floating) dtype."""
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"\"histogramdd\" not implemented for '{input.dtype.name.capitalize()}'")
    values = _values_of(input, "histogram").reshape(-1).astype(np.float64)
    if isinstance(bins, Tensor):
        if bins.ndim != 1 or bins.numel() < 1:
            raise RuntimeError(f"torch.histogram: bins tensor should have one dimension and at least 1 element, "
                               f"but got {bins.ndim} dimensions and {bins.numel()} elements")  # fmt: skip
        edges = _values_of(bins, "histogram").astype(np.float64)
        if np.any(np.diff(edges) < 0):
            raise RuntimeError("torch.histogram: bin edges must be increasing")
    else:
        if int(bins) <= 0:
            raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
        lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
        if range is not None:
            lo, hi = float(range[0]), float(range[1])
            if lo > hi:
                raise RuntimeError(f"torch.histogramdd: min should not exceed max, but got min {lo:g} max {hi:g} "
                                   "for dimension 0")  # fmt: skip
        if lo == hi:  # PyTorch (and numpy) widen an empty range to one of width 1
            lo, hi = lo - 0.5, hi + 0.5
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise RuntimeError(f"torch.histogram: range of [{lo}, {hi}] is not finite")
        edges = np.linspace(lo, hi, int(bins) + 1).astype(input.dtype.np).astype(np.float64)
    weights = None if weight is None else _values_of(weight, "histogram").reshape(-1).astype(np.float64)
    if weight is not None and weights is not None and weights.size != values.size:
        raise RuntimeError(f"torch.histogram: if weight tensor is provided it should have the same shape as the input "
                           f"tensor, got {list(weight.shape)} and {list(input.shape)}")  # fmt: skip
    counts, _ = np.histogram(values, edges, weights=weights, density=False)
    if density:
        total = counts.sum()
        counts = counts / (np.diff(edges) * total) if total else np.full(counts.shape, np.nan)
    return HistogramResult(_made(counts, input, input.dtype), _made(edges, input, input.dtype))


@method("nextafter")
def nextafter(input: Tensor, other) -> Tensor:
    """The next representable value after ``input`` toward ``other``, elementwise (floating point)."""
    other = other if isinstance(other, Tensor) else ops.tensor(other, dtype=input.dtype)
    dtype = dt.result_type(input, other)
    if not dtype.is_floating_point:
        raise RuntimeError(f"\"nextafter_cpu\" not implemented for '{dtype.name.capitalize()}'")
    a, b = (_values_of(t, "nextafter").astype(dtype.np) for t in (input, other))
    return _made(np.nextafter(a, b), input, dtype)


@method("nextafter_")
def nextafter_(self: Tensor, other) -> Tensor:
    return commit_inplace(self, nextafter(self, other), op="nextafter_")


def _seed_from(generator, device) -> int:
    """One 63-bit seed for numpy's stream, drawn from kiln's generator (which it advances)."""
    bits = _random_below(1 << 63, (1,), _generator(generator, device))
    return int(_values_of(bits, "random sampling")[0])


def poisson(input: Tensor, generator=None) -> Tensor:
    """Samples of Poisson distributions with rates ``input`` (floating, non-negative), in its dtype."""
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"\"poisson_cpu\" not implemented for '{input.dtype.name.capitalize()}'")
    rates = _values_of(input, "poisson").astype(np.float64)
    if np.any(rates < 0) or np.any(np.isnan(rates)):
        raise RuntimeError("invalid Poisson rate, expected rate to be non-negative")
    rng = np.random.default_rng(_seed_from(generator, input.device))
    return _made(rng.poisson(rates).astype(np.float64), input, input.dtype)


def binomial(count: Tensor, prob: Tensor, generator=None) -> Tensor:
    """Samples of binomial distributions with ``count`` trials of probability ``prob`` (broadcast)."""
    if not count.dtype.is_floating_point:
        raise RuntimeError(f"\"binomial_cpu\" not implemented for '{count.dtype.name.capitalize()}'")
    if prob.dtype is not count.dtype:
        raise RuntimeError(f"binomial: expected prob of count's dtype {count.dtype.name}, got {prob.dtype.name}")
    n = _values_of(count, "binomial").astype(np.float64)
    p = _values_of(prob, "binomial").astype(np.float64)
    if np.any(n < 0) or np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise RuntimeError("binomial: expected count >= 0 and 0 <= prob <= 1")
    rng = np.random.default_rng(_seed_from(generator, count.device))
    return _made(rng.binomial(n.astype(np.int64), p).astype(np.float64), count, count.dtype)


# ----------------------------------------------------------------------------- differentiable math
def _as_dims(dim, ndim: int) -> list[int]:
    dims = list(_range(ndim)) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    out = []
    for d in dims:
        if not -ndim <= d < ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {d})")
        out.append(d % ndim)
    if len(set(out)) != len(out):
        raise RuntimeError("torch.gradient expected each dimension to be given once")
    return out


def _uniform_derivative(f: Tensor, dim: int, h, edge_order: int) -> Tensor:
    n = f.shape[dim]

    def part(start: int, length: int) -> Tensor:
        return ops.narrow(f, dim, start, length)

    interior = (part(2, n - 2) - part(0, n - 2)) / (2 * h)
    if edge_order == 1:
        first, last = (part(1, 1) - part(0, 1)) / h, (part(n - 1, 1) - part(n - 2, 1)) / h
    else:
        first = (-1.5 * part(0, 1) + 2 * part(1, 1) - 0.5 * part(2, 1)) / h
        last = (0.5 * part(n - 3, 1) - 2 * part(n - 2, 1) + 1.5 * part(n - 1, 1)) / h
    return ops.cat([first, interior, last], dim)


def _coordinate_derivative(f: Tensor, dim: int, x: Tensor, edge_order: int) -> Tensor:
    """Second-order differences over the points ``x`` (numpy's and PyTorch's formulas)."""
    n = f.shape[dim]
    shape = [1] * f.ndim
    shape[dim] = -1
    x = ops.reshape(x.to(f.dtype), shape)

    def part(t: Tensor, start: int, length: int) -> Tensor:
        return ops.narrow(t, dim, start, length)

    dx = part(x, 1, n - 1) - part(x, 0, n - 1)
    dx1, dx2 = part(dx, 0, n - 2), part(dx, 1, n - 2)
    a = -dx2 / (dx1 * (dx1 + dx2))
    b = (dx2 - dx1) / (dx1 * dx2)
    c = dx1 / (dx2 * (dx1 + dx2))
    interior = a * part(f, 0, n - 2) + b * part(f, 1, n - 2) + c * part(f, 2, n - 2)
    if edge_order == 1:
        first = (part(f, 1, 1) - part(f, 0, 1)) / part(dx, 0, 1)
        last = (part(f, n - 1, 1) - part(f, n - 2, 1)) / part(dx, n - 2, 1)
    else:
        d1, d2 = part(dx, 0, 1), part(dx, 1, 1)
        first = (-(2 * d1 + d2) / (d1 * (d1 + d2)) * part(f, 0, 1) + (d1 + d2) / (d1 * d2) * part(f, 1, 1)
                 - d1 / (d2 * (d1 + d2)) * part(f, 2, 1))  # fmt: skip
        d1, d2 = part(dx, n - 3, 1), part(dx, n - 2, 1)
        last = (d2 / (d1 * (d1 + d2)) * part(f, n - 3, 1) - (d2 + d1) / (d1 * d2) * part(f, n - 2, 1)
                + (2 * d2 + d1) / (d2 * (d1 + d2)) * part(f, n - 1, 1))  # fmt: skip
    return ops.cat([first, interior, last], dim)


def gradient(input: Tensor, *, spacing=1, dim=None, edge_order: int = 1) -> tuple[Tensor, ...]:
    """Central differences of ``input`` along each dim of ``dim`` (all by default), one-sided of
    order ``edge_order`` (1 or 2) at the ends. ``spacing``: one number for every dim, one per dim,
    or one 1-D tensor of coordinates per dim. An integer input gives the default float dtype.

    >>> import kiln
    >>> kiln.gradient(kiln.tensor([1.0, 4.0, 9.0, 16.0]))
    (tensor([3., 4., 6., 7.]),)
    """
    if edge_order not in (1, 2):
        raise RuntimeError(f"torch.gradient only supports edge_order=1 and edge_order=2, got {edge_order}")
    dims = _as_dims(dim, input.ndim)
    if isinstance(spacing, Tensor) and spacing.ndim == 0:
        spacing = spacing.item()
    if not isinstance(spacing, (list, tuple)):
        spacing = [spacing] * len(dims)
    if len(spacing) != len(dims):
        raise RuntimeError(f"torch.gradient expected spacing to be unspecified, a scalar or it's spacing and dim "
                           f"arguments to have the same length, but got a spacing argument of length "
                           f"{len(spacing)} and a dim argument of length {len(dims)}.")  # fmt: skip
    if any(input.shape[d] < edge_order + 1 for d in dims):
        raise RuntimeError("torch.gradient expected each dimension size to be at least edge_order+1")
    f = input if input.dtype.is_floating_point else input.to(dt.get_default_dtype())
    out = []
    for d, h in zip(dims, spacing, strict=True):
        if isinstance(h, Tensor) and h.ndim == 1:
            if h.shape[0] != input.shape[d]:
                raise RuntimeError(f"torch.gradient expected each tensor to be on the same device and of size "
                                   f"{input.shape[d]} along dim {d}, got {h.shape[0]}")  # fmt: skip
            out.append(_coordinate_derivative(f, d, h, edge_order))
        else:
            out.append(_uniform_derivative(f, d, h.item() if isinstance(h, Tensor) else h, edge_order))
    return tuple(out)


@method("mvlgamma")
def mvlgamma(input: Tensor, p: int) -> Tensor:
    """The multivariate log-gamma of dimension ``p``:
    ``p (p - 1) / 4 log(pi) + sum_{i < p} lgamma(x - i / 2)``. As PyTorch's (and unlike
    ``special.multigammaln``, which raises), elements at or below ``(p - 1) / 2`` are not checked:
    they give what the sum gives (inf at the poles)."""
    if p < 1:
        raise RuntimeError("p has to be greater than or equal to 1")
    x = input if input.dtype.is_floating_point else input.to(dt.get_default_dtype())
    total = special.gammaln(x)
    for i in _range(1, p):
        total = total + special.gammaln(x - i / 2)
    return total + p * (p - 1) / 4 * math.log(math.pi)


@method("mvlgamma_")
def mvlgamma_(self: Tensor, p: int) -> Tensor:
    return commit_inplace(self, mvlgamma(self, p), op="mvlgamma_")


def rsub(input: Tensor, other, *, alpha=1) -> Tensor:
    """``other - alpha * input``."""
    return ops.sub(other, input, alpha=alpha) if isinstance(other, Tensor) else ops.add(ops.mul(input, -alpha), other)


def fill(input: Tensor, value) -> Tensor:
    """A new tensor of ``input``'s shape and dtype holding ``value`` (a number or a 0-d tensor)."""
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"fill only supports 0-dimension value tensor but got tensor with {value.ndim} "
                               "dimensions.")  # fmt: skip
        return ops.expand(value.to(input.dtype), tuple(input.shape)).clone()
    return ops.full_like(input, value)


def range(start=0, end=None, step=1, *, dtype=None, layout=None, device=None, requires_grad: bool = False):  # noqa: A001
    """``torch.range``, deprecated: ``start, start + step, ...`` up to ``end`` *inclusive*, in the
    default float dtype unless ``dtype`` says otherwise (``arange`` excludes ``end``)."""
    if end is None:
        raise TypeError('range() missing 1 required positional arguments: "end"')
    warnings.warn("torch.range is deprecated and will be removed in a future release because its behavior is "
                  "inconsistent with Python's range builtin. Instead, use torch.arange, which produces values in "
                  "[start, end).", UserWarning, stacklevel=2)  # fmt: skip
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    dtype = dt.get_default_dtype() if dtype is None else dtype
    count = int(math.floor((end - start) / step)) + 1
    values = start + step * np.arange(count, dtype=np.float64)
    return ops.tensor(values, dtype=dtype, device=device, requires_grad=requires_grad)


# ----------------------------------------------------------------------------- predicates and buffers
def is_same_size(input: Tensor, other: Tensor) -> bool:
    return tuple(input.shape) == tuple(other.shape)


def is_signed(input: Tensor) -> bool:
    """Whether the dtype holds negative values (not bool, not uint8)."""
    return input.dtype.is_floating_point or (input.dtype is not dt.bool_ and input.dtype is not dt.uint8)


def typename(obj) -> str:
    """A tensor's legacy type name (``"torch.FloatTensor"``), else the object's class, module-qualified
    outside the builtins."""
    if isinstance(obj, Tensor):
        return obj.type()
    cls = obj if isinstance(obj, type) else type(obj)
    module = cls.__module__
    return cls.__qualname__ if module in (None, "builtins") else f"{module}.{cls.__qualname__}"


def frombuffer(buffer, *, dtype, count: int = -1, offset: int = 0, requires_grad: bool = False) -> Tensor:
    """A 1-D tensor over ``buffer``'s memory (no copy): writes through either show in the other.
    A read-only buffer gives a tensor that must not be written, as PyTorch warns."""
    itemsize = np.dtype(dtype.np).itemsize
    size = memoryview(buffer).nbytes
    if offset < 0 or offset >= size and size:
        raise ValueError(f"both buffer length ({size}) and offset ({offset}) must be positive and offset must be "
                         "less than buffer length")  # fmt: skip
    if count < 0 and (size - offset) % itemsize:
        raise ValueError(f"buffer length ({size - offset} after offset) must be a multiple of element size "
                         f"({itemsize})")  # fmt: skip
    if size == 0 or count == 0:
        raise ValueError(f"both buffer length ({size}) and count ({count}) must not be 0")
    array = np.frombuffer(buffer, dtype=dtype.np, count=count, offset=offset)
    if not array.flags.writeable:
        warnings.warn("The given buffer is not writable: kiln does not support non-writable tensors; writing "
                      "to this tensor is undefined behavior.", UserWarning, stacklevel=2)  # fmt: skip
    out = ops.from_numpy(array)
    return out.requires_grad_() if requires_grad else out
