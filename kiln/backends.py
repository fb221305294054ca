"""``kiln.backends``: PyTorch's backend switches, accepted so that ported programs run.

kiln has no cuDNN, MKL-DNN or MPS: those flags are plain attributes a program may read and set, and
setting them changes nothing kiln computes (``cudnn.deterministic``: kiln's kernels already give
the same results from run to run). ``cpu.winograd``, ``cpu.winograd_f4`` and ``cpu.direct_conv`` are
kiln's own: how ``conv2d`` computes convolutions; ``cpu.eager_kernels`` too: whether eager heavy ops
run kiln's compiled kernels.
"""

from __future__ import annotations

import sys as _sys
from types import SimpleNamespace

from . import cuda as _cuda
from .frontend import eager_kernels as _eager_kernels
from .frontend.jit import state as _jit_state

cudnn = SimpleNamespace(enabled=True, benchmark=False, deterministic=False, allow_tf32=True,
                        is_available=lambda: False, version=lambda: None)  # fmt: skip
mkldnn = SimpleNamespace(enabled=True, is_available=lambda: False)


class _CPU(SimpleNamespace):
    """``kiln.backends.cpu``: kiln's own switches of its CPU kernels (see below), and
    ``eager_kernels``: whether heavy eager ops (convolutions and their gradients, pooling,
    normalizations, softmax, fused optimizer steps) run kiln's compiled kernels for them (default
    on; ``$KILN_EAGER_KERNELS=0`` off; ``kiln.frontend.eager_kernels``)."""

    @property
    def eager_kernels(self) -> bool:
        return _eager_kernels.enabled()

    @eager_kernels.setter
    def eager_kernels(self, enabled: bool) -> None:
        _eager_kernels.set_enabled(enabled)


#: kiln's own: how ``conv2d`` computes 3x3 stride-1 convolutions on the CPU, read when a call runs
#: (a compiled function reads them when it traces). ``winograd``: by Winograd's minimal filtering
#: (batched matmuls of 2.25x-4x fewer multiplications than im2col's) where it pays, else im2col;
#: ``winograd_f4``: F(4x4, 3x3) on planes of 16 and more, 4x fewer multiplications at a float32
#: error of about 1e-5 relative to the output's largest value, where F(2x2, 3x3) and im2col are
#: within a few roundings (as ``cudnn.allow_tf32`` in PyTorch trades precision for speed).
#: ``direct_conv``: 2-d unit-stride convolutions with a window and a small filter (C * kh * kw up to
#: 256, groups 1) by the ``conv`` primitive, which a compiled program runs as a loop nest over the
#: input in place; off, im2col.
cpu = _CPU(winograd=True, winograd_f4=True, direct_conv=True, get_cpu_capability=lambda: "default")
mps = SimpleNamespace(is_available=lambda: False, is_built=lambda: False)
opt_einsum = SimpleNamespace(enabled=False, strategy=None, is_available=lambda: False)
cuda = SimpleNamespace(
    matmul=SimpleNamespace(allow_tf32=False, allow_fp16_reduced_precision_reduction=True,
                           allow_bf16_reduced_precision_reduction=True),
    is_built=lambda: _cuda.is_available(),
    enable_flash_sdp=lambda enabled: None,
    enable_mem_efficient_sdp=lambda enabled: None,
    enable_math_sdp=lambda enabled: None,
)  # fmt: skip

_deterministic = {"mode": False, "warn_only": False}


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """``torch.use_deterministic_algorithms``: kept, and read back by ``are_deterministic_algorithms_enabled``.
    kiln's CPU kernels give the same results from run to run already, so no op changes under it. On
    the GPU an accumulating ``index_put`` (an embedding's gradient, ``scatter_add``) runs cupy's
    ``add.at``, whose atomic float adds may round differently from run to run: torch raises for such
    ops in this mode; kiln does not yet."""
    if not isinstance(mode, bool):
        raise TypeError(f"use_deterministic_algorithms expects a bool, but got {type(mode).__name__}")
    _deterministic.update(mode=mode, warn_only=bool(warn_only))


def are_deterministic_algorithms_enabled() -> bool:
    """Whether ``use_deterministic_algorithms(True)`` is in force. Read inside a ``kiln.compile`` trace,
    it is a guard: a compiled call made while it was the other value traces again."""
    return _read("mode")


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    return _read("warn_only")


def _read(which: str) -> bool:
    value = _deterministic[which]

    def changed() -> str | None:
        now = _deterministic[which]
        return None if now == value else f"use_deterministic_algorithms' {which} changed: {value} -> {now}"

    _jit_state.guard(lambda: (changed, [(f"deterministic algorithms' {which} == {value}", "guard")]))
    return value


# PyTorch's switches are submodules (``import torch.backends.cudnn as cudnn``, DCGAN's first lines):
# the same namespaces are registered under those names, so that import statement finds them.
for _name in ("cudnn", "mkldnn", "cpu", "mps", "opt_einsum", "cuda"):
    _sys.modules[f"{__name__}.{_name}"] = globals()[_name]
del _name
