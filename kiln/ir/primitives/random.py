"""Counter-based random bits: Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy
as 1, 2, 3", SC 2011; the generator of Random123, cuRAND and JAX).

A counter-based generator is a pure function ``bits = philox(counter, key)``: block ``i`` of a
draw is the encryption of counter ``offset + i`` under the key made from the seed. Nothing is
sequential, so every element is computed independently (vectorized here, one thread per block
in a generated kernel), and the generator state is just two numbers, ``[seed, offset]``. That
state is an *input tensor* of ``random_bits``, not an attribute: a traced program reads it at
each call and the frontend advances the offset after each draw, so that compiled random ops
draw fresh numbers per call exactly as eager ones do.

``random_bits(state, shape=...)``: ``state`` is an int64 tensor ``[seed, offset]`` (the seed's
64 bits are the key, low word first; the offset counts 128-bit blocks already used). The result
holds uint32 values carried in int64 (kiln has no uint32 dtype): element ``k`` is word ``k % 4``
of block ``offset + k // 4``, so a draw of ``n`` elements uses ``ceil(n / 4)`` blocks, and
``random_advance(state, shape=...)`` is the state past them: ``[seed, offset + ceil(n / 4)]``. Both
take symbolic sizes, so one dynamic program draws and advances by each call's sizes.

The numpy kernel asks a compiled kernel first where one is installed (``install_bits``: the
frontend's ``eager_random``), which draws the same bits.

>>> import numpy as np
>>> [hex(int(w)) for w in philox4x32(np, np.zeros((4, 1), np.uint64), np.zeros(2, np.uint64))[:, 0]]
['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..dtypes import int64
from ..shapes import numel
from ..types import Dim, Sym, TensorType
from . import NOT_DIFFERENTIABLE, Kind, Primitive, Sample, register

# Philox-4x32 constants: the round multipliers and the Weyl sequence that bumps the key.
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF
ROUNDS = 10


def philox4x32(xp, counter, key, rounds: int = ROUNDS):
    """Philox-4x32 on a batch: ``counter`` is uint64 ``(4, n)`` holding 32-bit words and ``key``
    uint64 ``(2,)``; returns the ``(4, n)`` output words (uint64, < 2**32).

    Every product of two 32-bit words fits in uint64, so the high and low halves of the
    multiplication are exact. The rounds update four word arrays in place (twice as fast as
    allocating new ones at a million elements).
    """
    shift, mask = xp.uint64(32), xp.uint64(_MASK)
    m0, m1 = xp.uint64(_M0), xp.uint64(_M1)
    steps = xp.arange(rounds, dtype=xp.uint64)
    key = xp.asarray(key, dtype=xp.uint64)
    k0s = (key[0] + steps * xp.uint64(_W0)) & mask  # round r's key: bumped r times by the Weyl constants
    k1s = (key[1] + steps * xp.uint64(_W1)) & mask
    words = xp.array(counter, dtype=xp.uint64, copy=True)
    c0, c1, c2, c3 = words
    p0, p1 = xp.empty_like(c0), xp.empty_like(c0)
    for r in range(rounds):
        # (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0))
        xp.multiply(c0, m0, out=p0)
        xp.multiply(c2, m1, out=p1)
        xp.bitwise_xor(xp.right_shift(p1, shift, out=c0), c1, out=c0)
        xp.bitwise_xor(c0, k0s[r], out=c0)
        xp.bitwise_xor(xp.right_shift(p0, shift, out=c2), c3, out=c2)
        xp.bitwise_xor(c2, k1s[r], out=c2)
        xp.bitwise_and(p1, mask, out=c1)
        xp.bitwise_and(p0, mask, out=c3)
    return words


#: ``provider(seed, offset, n)``: the ``n`` elements of the draw from the state ``[seed, offset]`` (int64
#: words) as an int64 array, or None where it declines (the numpy kernel below runs); installed by a
#: layer above (``install_bits``: the frontend's ``eager_random``, a compiled kernel).
_bits: list[Callable[[int, int, int], np.ndarray | None]] = []


def install_bits(provider: Callable[[int, int, int], np.ndarray | None] | None) -> None:
    """Let ``random_bits``' numpy kernel ask ``provider`` first (None: numpy's arrays only)."""
    _bits[:] = [] if provider is None else [provider]


def _random_bits_eager(xp, state, *, shape: tuple[int, ...]):
    n, blocks = numel(shape), blocks_used(shape)
    if _bits and xp is np and state.__class__ is np.ndarray and n:
        seed, offset = state.tolist()
        drawn = _bits[0](seed, offset, n)
        if drawn is not None:
            return drawn.reshape(shape)
    seed, offset = state.astype(xp.uint64)  # two's complement: a negative int64 seed is its 64 bits
    mask, shift = xp.uint64(_MASK), xp.uint64(32)
    index = offset + xp.arange(blocks, dtype=xp.uint64)  # the 128-bit counter: offset + block, in words 0-1
    counter = xp.zeros((4, blocks), dtype=xp.uint64)
    counter[0], counter[1] = index & mask, index >> shift
    words = philox4x32(xp, counter, xp.stack([seed & mask, seed >> shift]))
    out = xp.empty((blocks, 4), dtype=xp.int64)
    out[...] = words.T  # element k is word k % 4 of block k // 4
    return out.reshape(-1)[:n].reshape(shape)


def _check_state(op: str, state: TensorType) -> None:
    if state.dtype is not int64 or state.shape != (2,):
        raise TypeError(f"{op}: expected the generator state as an int64 tensor of shape (2,) [seed, offset], "
                        f"got {state.dtype.name} of shape {state.shape}")  # fmt: skip


def _check_shape(op: str, shape) -> None:
    """A draw's shape: non-negative ints, or symbolic sizes (``Sym``) of a dynamic program, which
    the program binds to each call's sizes before a kernel runs."""
    if not isinstance(shape, tuple) or any(not _is_size(d) for d in shape):
        raise ValueError(f"{op}: expected a shape of non-negative ints or symbolic sizes, got {shape!r}")


def _is_size(d) -> bool:
    return isinstance(d, Sym) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)


def _random_bits_infer(state: TensorType, *, shape: tuple[Dim, ...]) -> TensorType:
    _check_state("random_bits", state)
    _check_shape("random_bits", shape)
    return TensorType(shape, int64, state.device)


def _state_samples(rng):
    return [
        Sample((np.array([0, 0], dtype=np.int64),), {"shape": (4,)}, gradcheck=False),
        Sample((np.array([-1, 7], dtype=np.int64),), {"shape": (2, 3)}, gradcheck=False),
        Sample((np.array([42, 1 << 40], dtype=np.int64),), {"shape": ()}, gradcheck=False),
        Sample((np.array([5, 0], dtype=np.int64),), {"shape": (0, 3)}, gradcheck=False),
    ]


random_bits = register(Primitive(
    "random_bits", Kind.RANDOM, _random_bits_infer, _random_bits_eager, NOT_DIFFERENTIABLE,
    samples=_state_samples,
    doc="Philox-4x32-10 bits (uint32 values in int64) of `shape` from the state [seed, offset]; "
        "uses ceil(numel / 4) counter blocks starting at offset.",
))  # fmt: skip


# ----------------------------------------------------------------------------- advancing the state
def blocks_used(shape: tuple[int, ...]) -> int:
    """The 128-bit counter blocks a ``random_bits`` draw of ``shape`` uses: ``ceil(numel / 4)``."""
    return -(-numel(shape) // 4)


def _random_advance_eager(xp, state, *, shape: tuple[int, ...]):
    return state + xp.asarray([0, blocks_used(shape)], dtype=state.dtype)


def _random_advance_infer(state: TensorType, *, shape: tuple[Dim, ...]) -> TensorType:
    _check_state("random_advance", state)
    _check_shape("random_advance", shape)
    return TensorType((2,), int64, state.device)


# The advance is an op of the graph rather than the state plus a constant the tracer computed: in a
# dynamic program the blocks a draw uses follow the symbolic sizes (``ceil(3 * s0 / 4)``, which no
# product of the sizes spells), so its ``shape`` is an attribute the program binds per call, as it
# binds the draw's own.
random_advance = register(Primitive(
    "random_advance", Kind.RANDOM, _random_advance_infer, _random_advance_eager, NOT_DIFFERENTIABLE,
    samples=_state_samples,
    doc="The state [seed, offset] past a random_bits draw of `shape`: offset + ceil(numel / 4).",
))  # fmt: skip
