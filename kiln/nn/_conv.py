"""Convolution as pad + sliding windows + one matmul over the whole batch (im2col); for 3x3
stride-1 convolutions with enough channels, by Winograd's minimal filtering (``_winograd``); for a
small filter, by the ``conv`` primitive (``_direct``), which compiled programs run without windows.

``kiln.unfold_windows(..., batch_inner=True)`` turns the padded input (N, C, *S) into windows laid
out (C, *K, N, *O); that reshapes for free to (groups, C/groups * prod(K), N * prod(O)), and a
matmul with the weight reshaped to (groups, O/groups, C/groups * prod(K)) gives the output as
(O, N, *O) in memory, returned as an (N, O, *O) view. Multiplying the whole batch at once (rather
than each sample) matters most for the backward: the weight's gradient is then one matmul whose
inner dimension is N * prod(O) (every sample's positions), not N matmuls of prod(O) each (as
small as 16 in ResNet's last stage) whose (N, O, C*K) results are summed afterwards.
Gradients, and gradients of gradients, come from the primitives. On plain eager CPU tensors (one
group) the im2col path runs as one autograd node on the arrays (``frontend/ops/conv_arrays.py``).

PyTorch's convolution node saves the input and the weight whenever it exists (whichever of input,
weight and bias requires grad), and its backward raises if either changed in place since. The
primitives here save copies (the padded input, its windows), so each path puts a check of the two
on its history (``conv_checked``; eager and traced alike, and a compiled backward checks them too).
"""

from __future__ import annotations

import functools
import math
from contextvars import ContextVar
from dataclasses import dataclass

import kiln
from kiln.frontend.autocast import LOWER, autocast_op
from kiln.frontend.autograd.checked import check_saved
from kiln.frontend.ops.conv_arrays import conv_eager
from kiln.frontend.ops.windows import convolve
from kiln.ir.primitives.convolution import DIRECT_MAX_INNER

from ._utils import batched, check_tensor, ntuple, pad_spec

__all__ = ["conv1d", "conv2d", "conv3d", "unfold", "fold"]

#: Tensors a convolution checks besides its own input and weight: a transposed convolution's input
#: and weight, which it computes as a convolution of copies of them (``_conv_transpose.py``).
also_saved: ContextVar[tuple] = ContextVar("kiln_conv_also_saved", default=())


def _same_padding(kernel, dilation, stride, op: str) -> tuple[tuple[int, int], ...]:
    if any(s != 1 for s in stride):
        raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
    # PyTorch puts the odd element of the total padding on the right.
    totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
    return tuple((t // 2, t - t // 2) for t in totals)


def _padding(padding, kernel, dilation, stride, op: str) -> tuple[tuple[int, int], ...]:
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * len(kernel)
        if padding == "same":
            return _same_padding(kernel, dilation, stride, op)
        raise ValueError(f"{op}: padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
    pads = ntuple(padding, len(kernel), "padding", op)
    if any(p < 0 for p in pads):
        raise RuntimeError(f"{op}: negative padding is not supported, got {pads}")
    return tuple((p, p) for p in pads)


def _check_conv(x, weight, bias, groups: int, d: int, op: str) -> None:
    if weight.ndim != d + 2:
        raise RuntimeError(
            f"{op}: expected a {d + 2}-d weight (out_channels, in_channels/groups, *kernel), "
            f"got weight of size {list(weight.shape)}"
        )
    if not isinstance(groups, int) or groups < 1:
        raise RuntimeError(f"{op}: non-positive groups is not supported, got groups={groups}")
    out_channels, per_group = weight.shape[0], weight.shape[1]
    if out_channels % groups:
        raise RuntimeError(
            f"{op}: given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
            f"but got weight of size {list(weight.shape)} instead"
        )
    if x.shape[1] != per_group * groups:
        raise RuntimeError(
            f"{op}: given groups={groups}, weight of size {list(weight.shape)}, expected input{list(x.shape)} "
            f"to have {per_group * groups} channels, but got {x.shape[1]} channels instead"
        )
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        given = f"input {x.dtype}, weight {weight.dtype}" + ("" if bias is None else f", bias {bias.dtype}")
        raise RuntimeError(f"{op}: expected input, weight and bias of one dtype, got {given}")
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise RuntimeError(f"{op}: expected bias of shape [{out_channels}], got {list(bias.shape)}")


def _conv(input, weight, bias, stride, padding, dilation, groups, d: int, op: str):
    check_tensor(input, "input", op)
    check_tensor(weight, "weight", op)
    x, unbatched = batched(input, d, op)
    _check_conv(x, weight, bias, groups, d, op)
    kernel = tuple(weight.shape[2:])
    stride = ntuple(stride, d, "stride", op)
    dilation = ntuple(dilation, d, "dilation", op)
    pads = _padding(padding, kernel, dilation, stride, op)
    saved = (x, weight, *also_saved.get())
    winograd = _winograd_variant(x, weight, pads, stride, dilation, groups)
    if winograd is not None:
        return _finish(_winograd(x, weight, pads, winograd, saved), bias, unbatched, saved)
    _check_fits(tuple(s + lo + hi for s, (lo, hi) in zip(x.shape[2:], pads, strict=True)), kernel, dilation, op)
    im2col = functools.partial(_im2col, pads=pads, stride=stride, dilation=dilation, groups=groups, saved=saved[2:])
    if not _direct(x, weight, stride, groups):
        # one autograd node on plain eager CPU tensors (None: the ops must run); it checks x and weight
        out = conv_eager(x, weight, bias, kernel, stride, dilation, pads, im2col) if groups == 1 else None
        out = im2col(x, weight, bias) if out is None else conv_checked(out, saved[2:])
        return _finish(out, None, unbatched, saved)
    padded = kiln.pad(x, pad_spec(pads)) if any(p for pair in pads for p in pair) else x
    return _finish(conv_checked(convolve(padded, weight, stride, dilation), saved), bias, unbatched, saved)


def conv_checked(out, saved: tuple):
    """``out`` (new memory) whose backward first checks that ``saved`` did not change in place."""
    return check_saved(out, saved, "ConvolutionBackward") if saved else out


def _im2col(x, weight, bias, *, pads, stride, dilation, groups: int, saved: tuple = ()):
    """The convolution of (N, C, *S) ``x``, padded by ``pads``, by ``weight`` as one matmul of the
    windows (see the module docstring); plus ``bias`` if given. Its backward checks ``x``, ``weight``
    and ``saved`` for in-place changes."""
    saved = (x, weight, *saved)
    if any(p for pair in pads for p in pair):
        x = kiln.pad(x, pad_spec(pads))
    kernel = tuple(weight.shape[2:])
    cols = kiln.unfold_windows(x, kernel, stride, dilation, batch_inner=True)  # (C, *K, N, *O)
    n, c = x.shape[0], x.shape[1]
    out_spatial = tuple(cols.shape[2 + len(kernel) :])
    out_channels = weight.shape[0]
    cols = cols.reshape(groups, (c // groups) * math.prod(kernel), n * math.prod(out_spatial))
    w = weight.reshape(groups, out_channels // groups, -1)
    out = conv_checked(kiln.matmul(w, cols), saved).reshape(out_channels, n, *out_spatial).transpose(0, 1)
    return _finish(out, bias, False, saved)


def _finish(out, bias, unbatched: bool, saved: tuple):
    """The convolution ``out`` (N, O, *S) plus ``bias`` (O,) if given; unbatched again if the input was.
    Where only the bias requires grad, the sum's backward checks ``saved`` (``out``'s checks it otherwise)."""
    if bias is not None:
        checked = out.grad_fn is not None
        out = out + bias.reshape(bias.shape[0], *(1,) * (out.ndim - 2))
        out = out if checked else conv_checked(out, saved)
    return out.squeeze(0) if unbatched else out


def _direct(x, weight, stride, groups: int) -> bool:
    """Whether conv computes ``x`` (padded) by ``weight`` with the ``conv`` primitive: a dense 2-d
    unit-stride float32 or float64 convolution on the CPU (what its compiled kernel takes) with a
    window (a 1x1 convolution is a plain product, which BLAS runs faster: 1.2x for 64 channels,
    1.9x for 256) and a filter, C * prod(kernel), at most ``DIRECT_MAX_INNER`` long, as
    ``kiln.backends.cpu.direct_conv`` allows."""
    return (
        kiln.backends.cpu.direct_conv and groups == 1 and x.ndim == 4 and stride == (1, 1) and x.device.type == "cpu"
        and x.dtype in (kiln.float32, kiln.float64) and math.prod(weight.shape[2:]) > 1
        and math.prod(weight.shape[1:]) <= DIRECT_MAX_INNER
    )  # fmt: skip


@dataclass(frozen=True)
class Winograd:
    """Winograd's minimal filtering F(m x m, 3 x 3) (Lavin and Gray, 2015): each m x m output tile of
    a 3x3 convolution is ``A^T [(G g G^T) * (B^T d B)] A`` for the (m + 2) x (m + 2) input tile ``d``
    and the filter ``g``: (m + 2)^2 multiplications per channel pair where direct convolution has
    9 m^2. The matrices as ``tile_transform`` takes them (its rows): B^T, G, and A."""

    m: int
    input: tuple
    filter: tuple
    output: tuple

    @property
    def alpha(self) -> int:
        return self.m + 2


#: 2.25x fewer multiplications; float32 results within a few units of rounding of direct convolution.
F2 = Winograd(
    2,
    input=((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
    filter=((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1)),
    output=((1, 0), (1, 1), (1, -1), (0, -1)),
)
#: 4x fewer multiplications, and tiles of 2.25x the input (F2's are 4x); its transforms' larger
#: coefficients cost precision: float32 results about 1e-5 relative to the largest (direct: 3e-7).
F4 = Winograd(
    4,
    input=((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
           (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
    filter=((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
            (1 / 24, -1 / 12, 1 / 6), (0, 0, 1)),
    output=((1, 0, 0, 0), (1, 1, 1, 1), (1, -1, 1, -1), (1, 2, 4, 8), (1, -2, 4, -8), (0, 0, 0, 1)),
)  # fmt: skip
#: The fewest input and output channels for which Winograd's batched matmuls of (K, C) x (C, tiles)
#: beat im2col's one of (K, 9C) x (9C, positions): with fewer, the inner dimension C is too short.
WINOGRAD_MIN_CHANNELS = 16
#: The smallest output plane side F4 takes: on 8x8 planes (2x2 tiles of 4) its transforms, vectorized
#: across planes, cost more than its matmuls save (measured on ResNet-18's layers).
F4_MIN_SIDE = 16


def _out_size_3x3(x, pads) -> tuple[int, ...]:
    return tuple(s + lo + hi - 2 for s, (lo, hi) in zip(x.shape[2:], pads, strict=True))


def _winograd_variant(x, weight, pads, stride, dilation, groups: int) -> Winograd | None:
    """The Winograd variant conv2d takes (None: im2col): for 3x3 stride-1 undilated dense convolutions
    of float32 or float64 on the CPU with enough channels for its matmuls, as ``kiln.backends.cpu``
    allows; F4 on planes of at least ``F4_MIN_SIDE``. (An input smaller than the kernel goes to
    im2col, which raises the error.)"""
    cpu = kiln.backends.cpu
    if not (
        cpu.winograd and x.ndim == 4 and tuple(weight.shape[2:]) == (3, 3) and stride == (1, 1)
        and dilation == (1, 1) and groups == 1 and x.device.type == "cpu" and x.dtype in (kiln.float32, kiln.float64)
        and min(x.shape[1], weight.shape[0]) >= WINOGRAD_MIN_CHANNELS and min(_out_size_3x3(x, pads)) >= 1
    ):  # fmt: skip
        return None
    return F4 if cpu.winograd_f4 and min(_out_size_3x3(x, pads)) >= F4_MIN_SIDE else F2


def _winograd(x, weight, pads, w: Winograd, saved: tuple):
    """``conv2d(x, weight)`` (3x3, stride 1) by Winograd's F(m x m, 3 x 3): the input's tiles of m + 2
    at stride m and the filters transformed, alpha^2 batched matmuls (one per transform element) of
    the filters (K, C) by the tiles (C, N * tiles), and the products' m x m output tiles transformed
    back. The output is laid out (K, N, H, W) in memory, as im2col's. Its gradients are the same
    steps' adjoints: the tiles' VJPs are each other (``kiln/ir/primitives/tiles.py``). Its backward
    checks ``saved`` for in-place changes."""
    n, c = x.shape[:2]
    k = weight.shape[0]
    elements = w.alpha * w.alpha
    out_size = _out_size_3x3(x, pads)
    tiles = tuple(-(-o // w.m) for o in out_size)
    # pad to m * tiles + 2: a plane the tiles overhang gets more zeros, and its output is cropped
    pads = tuple((lo, hi + w.m * t - o) for (lo, hi), t, o in zip(pads, tiles, out_size, strict=True))
    if any(p for pair in pads for p in pair):
        x = kiln.pad(x, pad_spec(pads))
    v = kiln.tile_transform(x.transpose(0, 1), w.input, w.m)  # (alpha^2, C, N, th, tw)
    u = kiln.tile_transform(weight, w.filter, 1).reshape(elements, k, c)
    m = conv_checked(kiln.matmul(u, v.reshape(elements, c, -1)), saved).reshape(elements, k, n, *tiles)
    out = kiln.untile_transform(m, tuple(w.m * t for t in tiles), w.output, w.m)  # (K, N, m th, m tw)
    if tuple(out.shape[2:]) != out_size:
        out = out[:, :, : out_size[0], : out_size[1]]
    return out.transpose(0, 1)


def _check_fits(spatial, kernel, dilation, op: str) -> None:
    effective = tuple(dl * (k - 1) + 1 for k, dl in zip(kernel, dilation, strict=True))
    if any(s < e for s, e in zip(spatial, effective, strict=True)):
        raise RuntimeError(
            f"{op}: calculated padded input size per channel: {tuple(spatial)}. Kernel size (dilated): "
            f"{effective}. Kernel size can't be greater than actual input size"
        )


@autocast_op(LOWER)
@kiln.jit.composite("conv1d")
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> kiln.Tensor:
    """1-D convolution (cross-correlation) of (N, C, L) or (C, L) with weight (O, C/groups, k)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


@autocast_op(LOWER)
@kiln.jit.composite("conv2d")
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> kiln.Tensor:
    """2-D convolution of (N, C, H, W) or (C, H, W) with weight (O, C/groups, kh, kw).

    ``padding`` is an int, a pair, ``"valid"`` or ``"same"``; as ``torch.nn.functional.conv2d``.

    >>> import kiln
    >>> x, w = kiln.ones(1, 1, 3, 3), kiln.ones(1, 1, 2, 2)
    >>> conv2d(x, w).tolist()
    [[[[4.0, 4.0], [4.0, 4.0]]]]
    """
    return _conv(input, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


@autocast_op(LOWER)
@kiln.jit.composite("conv3d")
def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> kiln.Tensor:
    """3-D convolution of (N, C, D, H, W) with weight (O, C/groups, kd, kh, kw)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, 3, "conv3d")


def unfold(input, kernel_size, dilation=1, padding=0, stride=1) -> kiln.Tensor:
    """Sliding blocks of (N, C, H, W) as columns (N, C * kh * kw, L), as ``torch.nn.functional.unfold``."""
    if input.ndim != 4:
        raise NotImplementedError(f"unfold: only 4-d (batched image) input is supported, got shape {list(input.shape)}")
    kernel = ntuple(kernel_size, 2, "kernel_size", "unfold")
    pads = ntuple(padding, 2, "padding", "unfold")
    if any(pads):
        input = kiln.pad(input, pad_spec(tuple((p, p) for p in pads)))
    cols = kiln.unfold_windows(
        input, kernel, ntuple(stride, 2, "stride", "unfold"), ntuple(dilation, 2, "dilation", "unfold")
    )
    n, c = input.shape[0], input.shape[1]
    return cols.reshape(n, c * kernel[0] * kernel[1], -1)


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1) -> kiln.Tensor:
    """Columns (N, C * kh * kw, L) summed back into (N, C, *output_size): the adjoint of ``unfold``."""
    if input.ndim != 3:
        raise NotImplementedError(f"fold: only 3-d (batched) input is supported, got shape {list(input.shape)}")
    size = ntuple(output_size, 2, "output_size", "fold")
    kernel = ntuple(kernel_size, 2, "kernel_size", "fold")
    stride, dilation = ntuple(stride, 2, "stride", "fold"), ntuple(dilation, 2, "dilation", "fold")
    pads = ntuple(padding, 2, "padding", "fold")
    padded = tuple(s + 2 * p for s, p in zip(size, pads, strict=True))
    blocks = tuple(
        (s - dl * (k - 1) - 1) // st + 1 for s, k, st, dl in zip(padded, kernel, stride, dilation, strict=True)
    )
    n, ck, length = input.shape
    k = kernel[0] * kernel[1]
    if ck % k or length != math.prod(blocks):
        raise RuntimeError(
            f"fold: expected input of shape [N, C * {k}, {math.prod(blocks)}] for output_size {size}, kernel_size "
            f"{kernel}, got {list(input.shape)}"
        )
    out = kiln.fold_windows(input.reshape(n, ck // k, *kernel, *blocks), padded, kernel, stride, dilation)
    return out[:, :, pads[0] : pads[0] + size[0], pads[1] : pads[1] + size[1]]
