"""``random_bits`` on a compiled kernel (``codegen/llvm/philox_call.py``) rather than numpy's arrays.

Importing this installs ``bits`` as the primitive's draw (``ir/primitives/random.install_bits``):
eager draws (``kiln.rand``, dropout) and compiled programs' ``random_bits`` externs run the kernel
once it is ready. It compiles once per process (then from the disk cache of compiled kernels) in
``eager_kernels``' background thread and cache, under its switch (``KILN_EAGER_KERNELS=0`` keeps
numpy, ``=sync`` compiles in the caller's thread); numpy draws until it is ready, the same bits.

Why: numpy's Philox makes 100 array calls a draw, each a pass over the draw's memory: a CNN's
dropout mask (32 x 784) took 0.2 ms of its 2.6 ms compiled step on a quiet machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import numpy as np

from ..ir.primitives import random
from . import eager_kernels

#: The eager-kernel cache's name of the kernel (its warnings say it).
NAME = "random bits"
#: The kernel as the cache hands it out (a module constant: a subscripted ``Callable`` costs 0.7 us a call).
_Draw = Callable[[int, int, int], np.ndarray]


def _compile() -> eager_kernels.Entry:
    from ..codegen.llvm.philox_call import Philox  # noqa: PLC0415 - the code generator loads only when first needed

    start = time.perf_counter()
    try:
        kernel = Philox.build()
    except Exception as error:  # noqa: BLE001 - any failure leaves the draws on numpy, said once
        return eager_kernels.Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
    return eager_kernels.Entry(program=cast(Callable[[list], list], kernel), seconds=time.perf_counter() - start)


#: Draws made on numpy before the kernel is asked for: a model's initialization draws its weights a few
#: dozen times, once, and loading the kernel then (the code generator's imports, the disk cache or LLVM:
#: 60-90 ms of the interpreter in the eager-kernel thread) slowed the first compiled call that overlapped
#: it (a CNN's warm first call 71-77 -> 123-170 ms); a training loop's dropout asks for it from its
#: ``MIN_DRAWS``-th draw on and gains 0.2 ms a step.
MIN_DRAWS = 64
_draws = 0


def bits(seed: int, offset: int, n: int) -> np.ndarray | None:
    """The ``n`` elements of the draw from ``[seed, offset]`` on the kernel, or None (numpy's to draw)."""
    global _draws
    if not eager_kernels.enabled():
        return None
    if _draws < MIN_DRAWS:
        _draws += 1  # (two threads may both count one draw: it only moves the kernel a draw later)
        return None
    # Not ``shared`` though compiled programs' random_bits externs call it too (a dropout in a training
    # step): numpy's draw is the same bits, so a trace need not compile it (~43 ms of LLVM) beside its
    # program; the program's first calls queue it and draw on numpy until it is ready.
    entry = eager_kernels.ready(NAME, (NAME,), _compile)
    return None if entry is None else cast(_Draw, entry.program)(seed, offset, n)


random.install_bits(bits)
