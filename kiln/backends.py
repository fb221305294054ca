"""``kiln.backends``: PyTorch's backend switches, accepted so that ported programs run.

kiln has no cuDNN, MKL-DNN or MPS: the flags are plain attributes a program may read and set, and
setting them changes nothing kiln computes (``cudnn.deterministic``: kiln's kernels already give
the same results from run to run).
"""

from __future__ import annotations

from types import SimpleNamespace

from . import cuda as _cuda

cudnn = SimpleNamespace(enabled=True, benchmark=False, deterministic=False, allow_tf32=True,
                        is_available=lambda: False, version=lambda: None)  # fmt: skip
mkldnn = SimpleNamespace(enabled=True, is_available=lambda: False)
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
