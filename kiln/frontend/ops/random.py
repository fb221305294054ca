"""Random numbers: the distributions drawn from a ``Generator`` (see ``generator.py``).

Every draw is one ``random_bits`` primitive (Philox-4x32-10, see ``kiln.ir.primitives.random``)
followed by ordinary elementwise ops; the generator's state is a tensor ``[seed, offset]`` that
each draw reads and then advances in place by the number of 128-bit blocks it used. A traced
program therefore reads the state as an input and writes it back, and draws fresh numbers per
call as eager code does. The streams are kiln's own: a seed gives the same numbers on every
run and platform, but not the numbers PyTorch's (Mersenne Twister) generator gives.

>>> g = Generator().manual_seed(0)
>>> a = rand(3, generator=g); _ = g.manual_seed(0)
>>> bool((rand(3, generator=g) == a).all())
True
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.types import CPU, Device
from ...ir.types import device as parse_device
from .. import (
    dispatch,
    eager_random,  # noqa: F401 - installs the compiled draw behind the random_bits primitive
)
from ..autograd.grad_mode import no_grad
from ..dispatch import apply
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor, method
from .checks import check
from .creation import _dtype, _shape, out_dtype, placement, sizes_of, written
from .elementwise import add, cos, div, exp, floor_divide, log, lt, mul, neg, remainder, sin, sqrt, sub, where
from .generator import Generator, _generator
from .inplace import commit_inplace

__all__ = [
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal", "bernoulli",
    "multinomial",
]  # fmt: skip


# ----------------------------------------------------------------------------- uniform bits to floats
def _float_dtype(dtype, op: str) -> dt.DType:
    dtype = _dtype(dtype)
    if not dtype.is_floating_point:
        raise NotImplementedError(f"{op}: expected a floating point dtype, got {dtype.name}")
    return dtype


def _device_of(device) -> Device:
    return CPU if device is None else parse_device(device)


def _uniform(shape: tuple[int, ...], dtype: dt.DType, gen: Generator) -> Tensor:
    """Uniform on [0, 1) in ``dtype``: k / 2**b for a random b-bit integer k, so never 1.0.

    b is the significand's width (11 bits for float16, 24 for float32, 53 for float64), which
    makes every value exact and equally likely; float64 takes 27 + 26 bits from two words.
    """
    if shape and _on_arrays(gen):  # (numpy makes scalars of 0-d results)
        return make_tensor(_uniform_array(shape, dtype, gen), CPU, dtype)
    with no_grad():
        if dtype is dt.float64:
            high = floor_divide(gen.bits(shape), 1 << 5)
            low = floor_divide(gen.bits(shape), 1 << 6)
            k = add(mul(high, 1 << 26), low)
            return mul(apply(P["cast"], k, dtype=dtype), 2.0**-53)
        width = 11 if dtype is dt.float16 else 24
        k = floor_divide(gen.bits(shape), 1 << (32 - width))
        return mul(apply(P["cast"], k, dtype=dtype), 2.0**-width)


def _standard_normal(shape: tuple[int, ...], dtype: dt.DType, gen: Generator) -> Tensor:
    """Box-Muller: sqrt(-2 log(1 - u1)) cos(2 pi u2); 1 - u1 lies in (0, 1], so log never sees 0."""
    work = dt.float64 if dtype is dt.float64 else dt.float32  # float16 would lose the tails
    if shape and _on_arrays(gen):  # (numpy makes scalars of 0-d results)
        a, b = _uniform_array(shape, work, gen), _uniform_array(shape, work, gen)
        r = np.subtract(1.0, a, out=a)
        r = np.sqrt(np.multiply(np.log(r, out=r), -2.0, out=r), out=r)
        r *= np.cos(np.multiply(b, 2.0 * math.pi, out=b), out=b)
        return make_tensor(r if dtype is work else r.astype(dtype.np), CPU, dtype)
    with no_grad():
        u1, u2 = _uniform(shape, work, gen), _uniform(shape, work, gen)
        radius = sqrt(mul(log(sub(1.0, u1)), -2.0))
        z = mul(radius, cos(mul(u2, 2.0 * math.pi)))
        return apply(P["cast"], z, dtype=dtype) if dtype is not work else z


# An eager draw from kiln's generator on the CPU runs on the arrays (12 dispatches fewer: randn(16, 64)
# took 59 us, now 30); traces and profiles record the ops, with the same values, and a subclass of
# Generator may draw its bits its own way.
def _on_arrays(gen: Generator) -> bool:
    return (
        type(gen) is Generator
        and gen.device is CPU
        and not ((_jit.tracing and _jit.current.get() is not None) or dispatch.profiling_ops)
    )


def _uniform_array(shape: tuple[int, ...], dtype: dt.DType, gen: Generator) -> np.ndarray:
    """``_uniform``'s values as a fresh array, by the same integer arithmetic (so exactly them)."""
    if dtype is dt.float64:
        k = (gen.bits_array(shape) >> 5) << 26
        k += gen.bits_array(shape) >> 6
        return np.multiply(k.astype(np.float64), 2.0**-53)
    width = 11 if dtype is dt.float16 else 24
    k = (gen.bits_array(shape) >> (32 - width)).astype(dtype.np)
    return np.multiply(k, 2.0**-width, out=k)


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    return t.requires_grad_(True) if requires_grad else t


def rand(*sizes, size=None, generator=None, dtype=None, device=None, requires_grad: bool = False, layout=None,
         pin_memory: bool = False, out=None) -> Tensor:  # fmt: skip
    """Uniform samples on [0, 1); the default float dtype unless ``dtype`` says otherwise."""
    if layout is not None or pin_memory or out is not None:
        placement("rand", layout, pin_memory)
        if out is not None:
            made = rand(*sizes, size=size, generator=generator, dtype=out_dtype(out, dtype, "rand"), device=out.device)
            return written(out, made)
    dtype, device = _float_dtype(dtype, "rand"), _device_of(device)
    return _finish(_uniform(sizes_of(sizes, size, "rand"), dtype, _generator(generator, device)), requires_grad)


def randn(*sizes, size=None, generator=None, dtype=None, device=None, requires_grad: bool = False, layout=None,
          pin_memory: bool = False, out=None) -> Tensor:  # fmt: skip
    """Standard normal samples (Box-Muller over two uniforms)."""
    if layout is not None or pin_memory or out is not None:
        placement("randn", layout, pin_memory)
        if out is not None:
            made = randn(
                *sizes, size=size, generator=generator, dtype=out_dtype(out, dtype, "randn"), device=out.device
            )
            return written(out, made)
    dtype, device = _float_dtype(dtype, "randn"), _device_of(device)
    return _finish(
        _standard_normal(sizes_of(sizes, size, "randn"), dtype, _generator(generator, device)), requires_grad
    )


def rand_like(input: Tensor, *, generator=None, dtype=None, device=None, requires_grad: bool = False, layout=None,
              pin_memory: bool = False, memory_format=None) -> Tensor:  # fmt: skip
    placement("rand_like", layout, pin_memory, memory_format)
    return rand(tuple(input.shape), generator=generator, dtype=dtype or input._dtype,
                device=device or input._device, requires_grad=requires_grad)  # fmt: skip


def randn_like(input: Tensor, *, generator=None, dtype=None, device=None, requires_grad: bool = False, layout=None,
               pin_memory: bool = False, memory_format=None) -> Tensor:  # fmt: skip
    placement("randn_like", layout, pin_memory, memory_format)
    return randn(tuple(input.shape), generator=generator, dtype=dtype or input._dtype,
                 device=device or input._device, requires_grad=requires_grad)  # fmt: skip


# ----------------------------------------------------------------------------- integers
def _random_below(n: int, shape: tuple[int, ...], gen: Generator) -> Tensor:
    """int64 values uniform on [0, n), 0 < n <= 2**63.

    For n <= 2**16 one 32-bit word w maps to floor(w * n / 2**32) (multiply-shift): each value has
    probability within n / 2**32 <= 2**-16 (relative) of 1/n. Larger ranges take a 63-bit integer
    from two words, reduced modulo n: the relative bias is at most n / 2**63.
    """
    with no_grad():
        if n <= 1 << 16:
            return floor_divide(mul(gen.bits(shape), n), 1 << 32)
        wide = add(mul(floor_divide(gen.bits(shape), 2), 1 << 32), gen.bits(shape))
        return wide if n == 1 << 63 else remainder(wide, n)


def _randint(low: int, high: int, shape, dtype, gen: Generator, op: str = "random_") -> Tensor:
    if not low < high:
        raise RuntimeError(f"{op} expects 'from' to be less than 'to', but got from={low} >= to={high}")
    if high - low > 1 << 63:
        raise RuntimeError(f"{op}: the range [{low}, {high}) is wider than 2**63, which kiln cannot draw from")
    out = add(_random_below(high - low, shape, gen), low) if low else _random_below(high - low, shape, gen)
    return apply(P["cast"], out, dtype=dtype) if dtype is not dt.int64 else out


def randint(*args, generator=None, dtype=None, device=None, requires_grad: bool = False, layout=None,
            pin_memory: bool = False, out=None, **kwargs) -> Tensor:  # fmt: skip
    """``randint(high, size)`` or ``randint(low, high, size)``: integers on [low, high), int64 by default."""
    if layout is not None or pin_memory or out is not None:
        placement("randint", layout, pin_memory)
        if out is not None:
            dtype = out_dtype(out, dtype, "randint")
            return written(out, randint(*args, generator=generator, dtype=dtype, device=out.device, **kwargs))
    low, high, size = _randint_args(args, kwargs)
    dtype = dt.int64 if dtype is None else dt.as_dtype(dtype)
    device = _device_of(device)
    out = _randint(low, high, _shape(tuple(size), "randint"), dtype, _generator(generator, device))
    return _finish(out, requires_grad)


def _randint_args(args: tuple, kwargs: dict) -> tuple[int, int, tuple]:
    low, high, size = kwargs.pop("low", 0), kwargs.pop("high", None), kwargs.pop("size", None)
    if kwargs:
        raise TypeError(f"randint() got unexpected keyword arguments {sorted(kwargs)}")
    positional = list(args)
    if size is None and positional:
        size = positional.pop()
    if len(positional) == 2:
        low, high = positional
    elif len(positional) == 1:
        if high is None:
            high = positional[0]
        else:
            low = positional[0]
    elif positional or high is None or size is None:
        raise TypeError("randint() expects (high, size) or (low, high, size)")
    return _int_arg(low, "low"), _int_arg(high, "high"), tuple(size) if isinstance(size, list | tuple) else (size,)


def _int_arg(value, name: str) -> int:
    if isinstance(value, Tensor):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"randint(): argument '{name}' must be an int, got {type(value).__name__}")
    return int(value)


def randint_like(input: Tensor, *args, generator=None, dtype=None, device=None, requires_grad: bool = False,
                 layout=None, pin_memory: bool = False, memory_format=None):  # fmt: skip
    """``randint_like(input, high)`` or ``randint_like(input, low, high)``, with ``input``'s shape."""
    placement("randint_like", layout, pin_memory, memory_format)
    if len(args) not in (1, 2):
        raise TypeError("randint_like() expects (input, high) or (input, low, high)")
    low, high = (0, args[0]) if len(args) == 1 else args
    return randint(_int_arg(low, "low"), _int_arg(high, "high"), tuple(input.shape), generator=generator,
                   dtype=dtype or input._dtype, device=device or input._device, requires_grad=requires_grad)  # fmt: skip


def randperm(n: int, *, generator=None, dtype=None, device=None, requires_grad: bool = False, layout=None,
             pin_memory: bool = False, out=None) -> Tensor:  # fmt: skip
    """A random permutation of 0..n-1: the order that sorts n random 63-bit keys."""
    if layout is not None or pin_memory or out is not None:
        placement("randperm", layout, pin_memory)
        if out is not None:
            made = randperm(n, generator=generator, dtype=out_dtype(out, dtype, "randperm"), device=out.device)
            return written(out, made)
    n = _int_arg(n, "n")
    if n < 0:
        raise RuntimeError(f"randperm: n must be non-negative, got {n}")
    gen = _generator(generator, _device_of(device))
    with no_grad():
        keys = add(mul(floor_divide(gen.bits((n,)), 2), 1 << 32), gen.bits((n,)))
        order = apply(P["argsort"], keys, axis=0, descending=False)
    dtype = dt.int64 if dtype is None else dt.as_dtype(dtype)
    return _finish(apply(P["cast"], order, dtype=dtype) if dtype is not dt.int64 else order, requires_grad)


@method("multinomial")
def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *, generator=None) -> Tensor:
    """Indices of categories drawn with the (unnormalized) weights in each row of ``input``.

    ``input`` is 1-D (one distribution) or 2-D (one per row); the result is int64 of shape
    ``(num_samples,)`` or ``(rows, num_samples)``. With replacement, each draw inverts the
    cumulative weights at a uniform point; without, categories are drawn one at a time and
    removed (so ``num_samples`` must not exceed the number of nonzero weights).
    """
    from . import cat, cumsum, narrow, one_hot, reshape  # noqa: PLC0415 - defined in modules that import this one
    from . import sum as sum_  # noqa: PLC0415

    if input.ndim not in (1, 2) or not input._dtype.is_floating_point:
        raise RuntimeError(f"multinomial: expected a 1-D or 2-D floating point tensor of weights, got "
                           f"{input.ndim}-D {input._dtype.name}")  # fmt: skip
    k = input.shape[-1]
    if num_samples <= 0 or (not replacement and num_samples > k):
        raise RuntimeError(f"multinomial: cannot sample {num_samples} samples from {k} categories"
                           f"{'' if replacement else ' without replacement'}")  # fmt: skip
    gen = _generator(generator, input._device)
    with no_grad():
        w = reshape(apply(P["cast"], input.detach(), dtype=dt.float64), (-1, k))
        # checks on values: they raise in every compiled call as they do eagerly (no values read)
        check(apply(P["logical_and"], w >= 0, w.isfinite()), RuntimeError,
              "multinomial: probability tensor contains either inf, nan or element < 0")  # fmt: skip
        check((w > 0).sum(1) >= (1 if replacement else num_samples), RuntimeError,
              f"multinomial: a row has fewer nonzero weights than the {num_samples} samples "
              "to draw without replacement (or none at all)")  # fmt: skip

        def draw(w: Tensor, count: int) -> Tensor:  # inverse CDF: how many cumulative weights lie <= u
            cdf = cumsum(w, 1)
            u = mul(_uniform((w.shape[0], count), dt.float64, gen), narrow(cdf, 1, k - 1, 1))
            below = sum_(reshape(cdf, (w.shape[0], 1, k)) <= reshape(u, (w.shape[0], count, 1)), 2)
            return where(below < k, below, k - 1)  # rounding in the cumulative sum must not overshoot

        if replacement:
            out = draw(w, num_samples)
        else:
            picks = []
            for _ in range(num_samples):
                picks.append(draw(w, 1))
                w = mul(w, sub(1.0, apply(P["cast"], one_hot(reshape(picks[-1], (-1,)), k), dtype=dt.float64)))
            out = cat(picks, 1)
    return reshape(out, (num_samples,)) if input.ndim == 1 else out


# ----------------------------------------------------------------------------- parameterized draws
def _zero_gradient(value: Tensor, name: str, *params) -> Tensor:
    """``value`` as a function of ``params`` whose gradient is zero, as PyTorch defines it for
    ``normal`` and ``bernoulli`` (the samples are not reparameterized)."""
    from .creation import zeros_like  # noqa: PLC0415

    tensors = [p for p in params if isinstance(p, Tensor) and p._requires_grad]
    if not tensors:
        return value
    from ..autograd.function import Function  # noqa: PLC0415 - function.py imports the ops

    class Sampling(Function):
        @staticmethod
        def forward(ctx, v, *ps):
            return v.detach()  # the same memory, outside the graph (and, when traced, the same value)

        @staticmethod
        def backward(ctx, g):
            return (None,) + tuple(zeros_like(p) for p in tensors)

    Sampling.__name__ = Sampling.__qualname__ = name  # grad_fn=<NormalBackward>, as PyTorch names it
    return Sampling.apply(value, *tensors)


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None, requires_grad: bool = False):
    """Samples of N(mean, std**2); ``mean`` and ``std`` are tensors (broadcast) or numbers.

    With two numbers, ``size`` gives the shape. Like PyTorch, the samples pass a zero gradient
    to ``mean`` and ``std``. ``std`` must be non-negative (checked for numbers only, so that a
    tensor's values are not read back).
    """
    if not isinstance(std, Tensor) and std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    tensors = [x for x in (mean, std) if isinstance(x, Tensor)]
    if not tensors:
        if size is None:
            raise TypeError("normal(): with a number for both mean and std, a size is required")
        z = randn(
            *(size if isinstance(size, list | tuple) else (size,)), generator=generator, dtype=dtype, device=device
        )
        return _finish(add(mul(z, std), mean), requires_grad)
    if size is not None:
        raise TypeError("normal(): size is only accepted when mean and std are numbers")
    like = tensors[0]
    out_dtype = dt.result_type(*tensors)
    out_dtype = out_dtype if out_dtype.is_floating_point else dt.get_default_dtype()
    shape = np.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    with no_grad():
        z = _standard_normal(tuple(shape), out_dtype, _generator(generator, like._device))
        value = add(mul(z, std), mean)
    return _zero_gradient(value, "Normal", mean, std)


@method("bernoulli")
def bernoulli(input: Tensor, p=None, *, generator=None) -> Tensor:
    """1 with probability ``input`` (or ``p``) and 0 otherwise, in ``input``'s dtype."""
    prob = input if p is None else p
    if not isinstance(prob, Tensor) and not 0 <= prob <= 1:
        raise RuntimeError(f"bernoulli expects p to be in [0, 1], but got p={prob}")
    work = dt.float64 if input._dtype is dt.float64 else dt.float32
    with no_grad():
        u = _uniform(tuple(input.shape), work, _generator(generator, input._device))
        hit = lt(u, prob)  # (no_grad: no detach, whose view of a tensor made in a trace costs a gather)
        value = apply(P["cast"], hit, dtype=input._dtype)
    return _zero_gradient(value, "Bernoulli", input) if p is None else value


# ----------------------------------------------------------------------------- in-place fills
def _float_self(self: Tensor, op: str) -> dt.DType:
    if not self._dtype.is_floating_point:
        raise NotImplementedError(f"{op} expects a floating point tensor, got {self._dtype.name}")
    return self._dtype


def _gen_of(self: Tensor, generator) -> Generator:
    return _generator(generator, self._device)


@method("uniform_")
def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0, *, generator=None) -> Tensor:
    """Fill with samples uniform on [a, b)."""
    if not a <= b:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={a} > to={b}")
    with no_grad():
        u = _uniform(tuple(self.shape), _float_self(self, "uniform_"), _gen_of(self, generator))
        value = add(mul(u, b - a), a)
    return commit_inplace(self, value, op="uniform_")


@method("normal_")
def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> Tensor:
    if std < 0:
        raise RuntimeError(f"normal_ expects std >= 0.0, but found std {std}")
    with no_grad():
        z = _standard_normal(tuple(self.shape), _float_self(self, "normal_"), _gen_of(self, generator))
        value = add(mul(z, std), mean)
    return commit_inplace(self, value, op="normal_")


@method("bernoulli_")
def bernoulli_(self: Tensor, p=0.5, *, generator=None) -> Tensor:
    """Fill with 1 with probability ``p`` (a number or a tensor broadcast to ``self``), else 0."""
    if not isinstance(p, Tensor) and not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    work = dt.float64 if self._dtype is dt.float64 else dt.float32
    with no_grad():
        u = _uniform(tuple(self.shape), work, _gen_of(self, generator))
        value = apply(P["cast"], lt(u, p), dtype=self._dtype)
    return commit_inplace(self, value, op="bernoulli_")


@method("random_")
def random_(self: Tensor, *bounds: int, generator=None) -> Tensor:
    """Fill with integers: ``random_(from, to)`` on [from, to - 1], ``random_(to)`` on [0, to - 1],
    ``random_()`` on [0, 2**digits] for floats (every integer exact) and [0, max] for integers."""
    if len(bounds) > 2:
        raise TypeError(f"random_() takes at most 2 bounds (from, to), got {len(bounds)}")
    if len(bounds) == 2:
        low, high = bounds
    elif bounds:
        low, high = 0, bounds[0]
    elif self._dtype.is_floating_point:
        low, high = 0, (1 << (np.finfo(self._dtype.np).nmant + 1)) + 1
    else:
        low, high = 0, 2 if self._dtype is dt.bool_ else int(np.iinfo(self._dtype.np).max) + 1
    with no_grad():
        value = _randint(_int_arg(low, "from"), _int_arg(high, "to"), tuple(self.shape), self._dtype,
                         _gen_of(self, generator))  # fmt: skip
    return commit_inplace(self, value, op="random_")


@method("exponential_")
def exponential_(self: Tensor, lambd: float = 1.0, *, generator=None) -> Tensor:
    """Fill with Exp(lambd) samples: -log(1 - u) / lambd."""
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    with no_grad():
        u = _uniform(tuple(self.shape), _float_self(self, "exponential_"), _gen_of(self, generator))
        value = div(neg(log(sub(1.0, u))), lambd)
    return commit_inplace(self, value, op="exponential_")


@method("log_normal_")
def log_normal_(self: Tensor, mean: float = 1.0, std: float = 2.0, *, generator=None) -> Tensor:
    with no_grad():
        z = _standard_normal(tuple(self.shape), _float_self(self, "log_normal_"), _gen_of(self, generator))
        value = exp(add(mul(z, std), mean))
    return commit_inplace(self, value, op="log_normal_")


@method("cauchy_")
def cauchy_(self: Tensor, median: float = 0.0, sigma: float = 1.0, *, generator=None) -> Tensor:
    """Fill with Cauchy(median, sigma) samples: median + sigma tan(pi (u - 1/2))."""
    with no_grad():
        u = _uniform(tuple(self.shape), _float_self(self, "cauchy_"), _gen_of(self, generator))
        angle = mul(sub(u, 0.5), math.pi)
        value = add(mul(div(sin(angle), cos(angle)), sigma), median)
    return commit_inplace(self, value, op="cauchy_")
