"""``random_bits`` (Philox-4x32-10, ``ir/primitives/random.py``) as a compiled kernel on numpy arrays.

The primitive's numpy kernel runs each of the ten rounds as ten whole-array operations on uint64
words: 100 numpy calls whatever the draw's size, and four passes over the draw's memory each. A
CNN's dropout mask (32 x 784 elements) took 0.2 ms on a quiet machine, about a tenth of its
compiled training step; every compiled program reads its draws from this extern. ``Philox.build()``
compiles ``void f(ptr args, i64 begin, i64 end)`` over units of counter blocks, the compiled
kernels' ABI, so ``threads.parallel_for`` splits a large draw: each block's ten rounds in registers
(32-bit words, each product's high and low halves from one 64-bit multiply), its four words stored
as int64 (kiln has no uint32). Integer arithmetic only: the bits are the numpy kernel's, exactly.
The object code goes to the disk cache of compiled kernels like the products'.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir

from ...ir.primitives.random import _M0, _M1, _W0, _W1, ROUNDS
from ...runtime import threads
from ...runtime.frames import data_pointer
from . import engine
from .loops import I64, for_range, i64
from .recurrence_call import cached_objects

#: The i64 slots of ``args``: the seed (the key's two words), the first block's counter, the output's
#: address and its element count.
SLOTS = ("seed", "offset", "out", "n")  # (the output holds every word of the last block: 4 ceil(n / 4))
SYMBOL = "kiln_philox4x32_10"
_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_I32 = ir.IntType(32)
#: Blocks a unit of ``parallel_for``'s range holds.
UNIT_BLOCKS = 256
#: parallel_for's work "bytes" per element drawn: ten rounds of a few multiplies and xors cost about as
#: much as streaming 32 bytes (the 8 bytes each element writes are not what bounds it).
WORK_PER_ELEMENT = 32


def philox_ir() -> str:
    """LLVM IR of the draw of the blocks of units ``[begin, end)`` (``SLOTS``' args)."""
    module = ir.Module(name="kiln_philox")
    pointer = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [pointer, I64, I64]), SYMBOL)
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    params, begin, end = fn.args
    value = {name: builder.load(builder.gep(params, [i64(k)], inbounds=True, source_etype=I64), typ=I64, name=name)
             for k, name in enumerate(SLOTS)}  # fmt: skip
    out = builder.inttoptr(value["out"], pointer)
    blocks = builder.sdiv(builder.add(value["n"], i64(3)), i64(4))

    def clamp(x: ir.Value) -> ir.Value:
        return builder.select(builder.icmp_signed("<", x, blocks), x, blocks)

    first, stop = clamp(builder.mul(begin, i64(UNIT_BLOCKS))), clamp(builder.mul(end, i64(UNIT_BLOCKS)))
    seed = value["seed"]
    key = (builder.trunc(seed, _I32), builder.trunc(builder.lshr(seed, i64(32)), _I32))

    def words(block: ir.Value) -> list[ir.Value]:
        index = builder.add(value["offset"], block)  # the 128-bit counter: offset + block (mod 2^64), words 0-1
        c = [builder.trunc(index, _I32), builder.trunc(builder.lshr(index, i64(32)), _I32), _I32(0), _I32(0)]
        k0, k1 = key
        for r in range(ROUNDS):
            if r:
                k0, k1 = builder.add(k0, _I32(_W0)), builder.add(k1, _I32(_W1))
            p0 = builder.mul(builder.zext(c[0], I64), i64(_M0))
            p1 = builder.mul(builder.zext(c[2], I64), i64(_M1))
            hi0, lo0 = builder.trunc(builder.lshr(p0, i64(32)), _I32), builder.trunc(p0, _I32)
            hi1, lo1 = builder.trunc(builder.lshr(p1, i64(32)), _I32), builder.trunc(p1, _I32)
            c = [builder.xor(builder.xor(hi1, c[1]), k0), lo1, builder.xor(builder.xor(hi0, c[3]), k1), lo0]
        return c

    def store(block: ir.Value, word: int, x: ir.Value) -> None:
        element = builder.add(builder.mul(block, i64(4)), i64(word))
        builder.store(builder.zext(x, I64), builder.gep(out, [element], inbounds=True, source_etype=I64))

    with for_range(builder, first, stop, name="block") as block:
        for word, x in enumerate(words(block)):
            store(block, word, x)
    builder.ret_void()
    return str(module)


class Philox:
    """The compiled draw (or loaded from the disk cache): ``philox(seed, offset, n)`` -> int64 (n,)."""

    def __init__(self) -> None:
        # light: LLVM's unroller only copies the ten rounds (49 -> 43 ms of LLVM, the same 109 us a 200K draw)
        self._library = engine.Library(cached_objects([engine.LIGHT + philox_ir()]))  # the kernel lives while it does
        self._kernel = _KERNEL(self._library.address(SYMBOL))

    @classmethod
    def build(cls) -> Philox:
        return cls()

    def __call__(self, seed: int, offset: int, n: int) -> np.ndarray:
        """The ``n`` elements of the draw from the state ``[seed, offset]`` (int64 words, two's complement)."""
        blocks = -(-n // 4)
        out = np.empty(4 * blocks, dtype=np.int64)  # the last block's words past n too: one loop, no tail
        if n == 0:
            return out
        args = np.array([seed, offset, data_pointer(out) or 0, n], dtype=np.int64)
        units = -(-blocks // UNIT_BLOCKS)
        threads.parallel_for(self._kernel, args.ctypes.data, units, n * WORK_PER_ELEMENT, spin=True)
        return out[:n]
