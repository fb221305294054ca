"""kiln: an imperative, PyTorch-style deep-learning library with a tracing JIT.

>>> import kiln
>>> x = kiln.tensor([1.0, 2.0, 3.0], requires_grad=True)
>>> (x * x).sum().backward()
>>> x.grad
tensor([2., 4., 6.])
"""

import builtins as _builtins
import logging as _logging
import os as _os
import sys as _sys

# numpy's BLAS, OpenBLAS, keeps its idle threads spinning for 2^28 cycles (about 0.1 s) after each
# call, on the cores kiln's threads run the kernels between two matmuls on (ResNet-18's training
# step: ~400 preemptions a step). 2^20 cycles (~0.4 ms) still covers back-to-back matmuls. OpenBLAS
# reads this when it loads, so it applies only when kiln is imported before numpy; a value the
# user set is kept. See runtime/threads.py.
if "numpy" not in _sys.modules:
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from . import autograd, cuda
from .frontend.autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .frontend.formatting import printoptions, set_printoptions
from .frontend.ops import *  # noqa: F403
from .frontend.tensor import Size, Tensor
from .ir.dtypes import (
    DType as dtype,
)  # fmt: skip
from .ir.dtypes import (
    bool_ as bool,  # noqa: A001 - kiln.bool is PyTorch's name
)
from .ir.dtypes import (
    float16,
    float32,
    float64,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    promote_types,
    set_default_dtype,
    uint8,
)
from .ir.dtypes import result_type as _result_type
from .ir.types import Device
from .ir.types import device as device
from .runtime.threads import get_num_threads, set_num_threads

float = float32  # noqa: A001
double = float64
half = float16
long = int64
int = int32  # noqa: A001
short = int16

__version__ = "0.1.0"

_logging.getLogger("kiln").addHandler(_logging.NullHandler())


def result_type(*tensors_or_numbers):
    """PyTorch's type promotion over tensors and Python numbers."""
    return _result_type(*tensors_or_numbers)


def is_tensor(obj) -> _builtins.bool:  # plain `bool` is kiln.bool, the dtype, in this module
    return isinstance(obj, Tensor)


# Last: the libraries written against the public API above, as a user's library would be.
# isort: off
from . import data, jit, multiprocessing, nn, onnx, optim  # noqa: E402  (onnx imports the onnx package only when used)
from .jit import CompileOptions, CompileWarning, ExportedProgram, compile, explain, export, load_exported  # noqa: E402
from .jit import mark_dynamic  # noqa: E402
from .serialization import load, save  # noqa: E402
from . import distributed, profiler  # noqa: E402  (mpi4py is imported by init_process_group only)
from . import distributions, fft, func, linalg, special  # noqa: E402
from ._torch_aliases import *  # noqa: E402, F403  (det, inverse, svd, digamma, lgamma...: over linalg and special)
from ._torch_names import *  # noqa: E402, F403  (asarray, cosine_similarity, vmap...: over nn and func)
from ._torch_names_nn import *  # noqa: E402, F403  (conv2d, batch_norm, dropout, exp_...: nn.functional's, ATen's order)
from ._torch_names_math import *  # noqa: E402, F403  (hann_window, histogram, gradient, range...: `range` hides the builtin here)
from ._torch_names_views import *  # noqa: E402, F403  (view_copy, split_with_sizes, diagonal_scatter...)
from ._torch_names_linalg import *  # noqa: E402, F403  (lu, lu_solve, triangular_solve, cholesky_solve, qr...)
from ._torch_names_methods import *  # noqa: E402, F403  (put; and the methods fill_diagonal_, geometric_, map_...)
from ._torch_names_more import *  # noqa: E402, F403  (pi, inf, newaxis, can_cast, adjoint, set_anomaly_enabled...)
from . import accelerator, amp, backends, cpu, signal, sparse, testing, utils  # noqa: E402
from .backends import are_deterministic_algorithms_enabled, is_deterministic_algorithms_warn_only_enabled  # noqa: E402
from .backends import use_deterministic_algorithms  # noqa: E402
from . import compiler  # noqa: E402  (the compiler layer; torch.compiler's public names join it, from kiln.jit)

for _name in jit.TORCH_COMPILER_NAMES:
    setattr(compiler, _name, getattr(jit, _name))
del _name
from .amp import autocast, get_autocast_dtype, is_autocast_enabled, set_autocast_dtype, set_autocast_enabled  # noqa: E402
# isort: on


def __getattr__(name: str):
    if name == "bfloat16":  # made on first use: it needs ml_dtypes, which `import kiln` does not import
        from .ir.dtypes import bfloat16_dtype  # noqa: PLC0415

        return bfloat16_dtype()
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
