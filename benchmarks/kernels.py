"""Memory-bound kernels, compiled: tanh-GELU (next to the machine's copy bandwidth), row softmax, LayerNorm.

Every implementation runs in this one process on the same float32 data, with the same thread
count: kiln (``kiln.compile`` of the functional op), numpy, PyTorch eager, ``torch.compile`` and
``jax.jit`` (each skipped when not installed). kiln's answer is checked once against a float64
numpy computation of the same formula.

"copy" is ``dst.copy_(src)`` in PyTorch (``np.copyto`` without torch) into a preallocated
``dst``, large enough (2 x 256 MB) to stream from memory rather than cache: the machine's copy
bandwidth with these threads. Its time is reported scaled to the GELU case's bytes, so that
kiln/copy is the inverse of kiln's share of the copy bandwidth. GB/s count bytes read plus bytes
written (8 bytes per float32 element for every implementation).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

import kiln

from .common import (
    KILN,
    Result,
    Target,
    Timing,
    close,
    kiln_compile,
    optional_import,
    side_by_side,
    torch_compile_or_why,
)

GELU_4M = "GELU tanh, 4M f32"
GELU_16M = "GELU tanh, 16M f32"
SOFTMAX = "row softmax, 4096x1024 f32"
LAYERNORM = "LayerNorm, 4096x1024 f32"
COPY = "copy"
COPY_ELEMENTS = {False: 64 << 20, True: 16 << 20}  # float32 elements copied, by `quick`
SIZES = {  # case -> (full shape, --quick shape)
    GELU_4M: ((4 << 20,), (256 << 10,)),
    GELU_16M: ((16 << 20,), (1 << 20,)),
    SOFTMAX: ((4096, 1024), (256, 1024)),
    LAYERNORM: ((4096, 1024), (256, 1024)),
}
EPS = 1e-5  # LayerNorm's
TOLERANCE = {"gelu": (1e-5, 1e-6), "softmax": (1e-5, 1e-8), "layernorm": (1e-4, 1e-5)}  # (rtol, atol) vs float64

TARGETS = [
    Target("gelu", GELU_4M, "torch", max_ratio=1 / 3),
    Target("gelu", GELU_4M, COPY, max_ratio=1 / 0.85),  # >= 85% of copy bandwidth
    Target("gelu", GELU_16M, "torch", max_ratio=1 / 3),
    Target("softmax", SOFTMAX, "torch", max_ratio=1.0),
    Target("layernorm", LAYERNORM, "torch", max_ratio=1.0),
]
C = math.sqrt(2 / math.pi)


def _data(shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- the formulas
def gelu_numpy(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(C * (x + 0.044715 * (x * x * x))))  # x * x * x: numpy's x**3 is slow


def softmax_numpy(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layernorm_numpy(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w + b


# ----------------------------------------------------------------------------- implementations
def _builders(
    kind: str, arrays: tuple[np.ndarray, ...], kiln_fn: Callable, numpy_fn: Callable, torch_fn, jax_fn
) -> dict[str, Callable | str]:
    """``{impl: builder}`` of one kernel; each builder returns the no-argument call to time."""
    torch = optional_import("torch")
    jax = optional_import("jax")

    def kiln_impl():
        f = kiln_compile(kiln_fn)
        args = [kiln.from_numpy(a.copy()) for a in arrays]
        return lambda: f(*args)

    builders: dict[str, Callable | str] = {KILN: kiln_impl, "numpy": lambda: lambda: numpy_fn(*arrays)}
    if torch is None:
        builders["torch"] = builders["torch.compile"] = "torch is not installed"
    else:
        targs = [torch.from_numpy(a.copy()) for a in arrays]
        builders["torch"] = lambda: lambda: torch_fn(torch, *targs)
        why = torch_compile_or_why(torch)
        builders["torch.compile"] = why or (lambda: _bind(torch.compile(lambda *a: torch_fn(torch, *a)), targs))
    if jax is None:
        builders["jax.jit"] = "jax is not installed"
    else:

        def jax_impl():
            h = jax.jit(lambda *a: jax_fn(jax, *a))
            jargs = [jax.numpy.asarray(a) for a in arrays]
            return lambda: h(*jargs).block_until_ready()

        builders["jax.jit"] = jax_impl
    return builders


def _bind(f: Callable, args: list) -> Callable[[], object]:
    return lambda: f(*args)


def _verify(expected: np.ndarray, kind: str) -> Callable[[Callable], str]:
    rtol, atol = TOLERANCE[kind]
    return lambda call: close(call().numpy(), expected, rtol=rtol, atol=atol)


def _copy_builder(elements: int) -> Callable[[], Callable[[], object]]:
    """A copy of ``elements`` float32 into a preallocated buffer: torch's (threaded) when installed, else numpy's."""
    torch = optional_import("torch")

    def build():
        src = np.ones(elements, dtype=np.float32)
        if torch is not None:
            s, d = torch.from_numpy(src), torch.ones(elements, dtype=torch.float32)
            return lambda: d.copy_(s)
        dst = np.ones_like(src)  # written once: its pages exist before the timing
        return lambda: np.copyto(dst, src)

    return build


def _bandwidth(nbytes: int) -> Callable[[str, Timing], str]:
    return lambda impl, t: f"{nbytes / t.median_ns:.1f} GB/s"


# ----------------------------------------------------------------------------- workloads
def _gelu_case(case: str, quick: bool, with_copy: bool) -> list[Result]:
    shape = SIZES[case][quick]
    x = _data(shape, scale=3.0)
    builders = _builders(
        "gelu", (x,),
        lambda a: kiln.nn.functional.gelu(a, approximate="tanh"),
        gelu_numpy,
        lambda torch, a: torch.nn.functional.gelu(a, approximate="tanh"),
        lambda jax, a: jax.nn.gelu(a, approximate=True),
    )  # fmt: skip
    traffic = 2 * x.nbytes  # read + write
    if with_copy:
        builders[COPY] = _copy_builder(COPY_ELEMENTS[quick])
    params = {"shape": list(shape), "dtype": "float32", "bytes_moved": traffic}
    expected = gelu_numpy(x.astype(np.float64))
    results = side_by_side(
        "gelu", case, builders, quick=quick, verify=_verify(expected, "gelu"), params=params,
        notes=_bandwidth(traffic),
    )  # fmt: skip
    return _percent_of_copy(results, traffic, 8 * COPY_ELEMENTS[quick]) if with_copy else results


def _percent_of_copy(results: list[Result], traffic: int, copy_traffic: int) -> list[Result]:
    """The copy's time scaled to this case's bytes, and kiln's share of the copy bandwidth in its note."""
    copy = next((r for r in results if r.impl == COPY and r.timing), None)
    if copy is None:
        return results
    t, scale = copy.timing, traffic / copy_traffic
    scaled = Timing(t.median_ns * scale, t.q1_ns * scale, t.q3_ns * scale, t.repeats, t.inner)
    note = f"{copy_traffic / t.median_ns:.1f} GB/s; a {copy_traffic >> 21} MB copy, time scaled to {traffic >> 20} MB"
    out = []
    for r in results:
        if r.impl == COPY:
            r = Result(r.workload, r.case, r.impl, scaled, note, {**r.params, "copy_bytes_moved": copy_traffic})
        elif r.impl == KILN and r.timing:
            share = scaled.median_ns / r.timing.median_ns
            r = Result(r.workload, r.case, r.impl, r.timing, f"{r.note}, {share:.0%} of copy", r.params, r.check)
        out.append(r)
    return out


def run_gelu(quick: bool = False) -> list[Result]:
    """GELU on 4M float32 elements (with the copy bandwidth), then on 16M."""
    return _gelu_case(GELU_4M, quick, with_copy=True) + _gelu_case(GELU_16M, quick, with_copy=False)


def run_softmax(quick: bool = False) -> list[Result]:
    shape = SIZES[SOFTMAX][quick]
    x = _data(shape)
    builders = _builders(
        "softmax", (x,),
        lambda a: kiln.nn.functional.softmax(a, dim=-1),
        softmax_numpy,
        lambda torch, a: torch.softmax(a, dim=-1),
        lambda jax, a: jax.nn.softmax(a, axis=-1),
    )  # fmt: skip
    expected = softmax_numpy(x.astype(np.float64))
    params = {"shape": list(shape), "dtype": "float32", "dim": -1}
    return side_by_side(
        "softmax", SOFTMAX, builders, quick=quick, verify=_verify(expected, "softmax"), params=params,
        notes=_bandwidth(2 * x.nbytes),
    )  # fmt: skip


def _layernorm_jax(jax, x, w, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + EPS) * w + b


def run_layernorm(quick: bool = False) -> list[Result]:
    shape = SIZES[LAYERNORM][quick]
    x = _data(shape)
    rng = np.random.default_rng(1)
    w = (1 + 0.1 * rng.standard_normal(shape[-1])).astype(np.float32)
    b = (0.1 * rng.standard_normal(shape[-1])).astype(np.float32)
    normalized = (shape[-1],)
    builders = _builders(
        "layernorm", (x, w, b),
        lambda a, w_, b_: kiln.nn.functional.layer_norm(a, normalized, w_, b_, eps=EPS),
        layernorm_numpy,
        lambda torch, a, w_, b_: torch.nn.functional.layer_norm(a, normalized, w_, b_, eps=EPS),
        _layernorm_jax,
    )  # fmt: skip
    expected = layernorm_numpy(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))
    params = {"shape": list(shape), "dtype": "float32", "eps": EPS, "affine": True}
    return side_by_side(
        "layernorm", LAYERNORM, builders, quick=quick, verify=_verify(expected, "layernorm"), params=params,
        notes=_bandwidth(2 * x.nbytes),
    )  # fmt: skip
