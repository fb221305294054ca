"""Random-number generators: Philox-4x32-10 streams whose state is a tensor.

A ``Generator``'s state is a tensor ``[seed, offset]``: each draw reads it with one
``random_bits`` primitive (see ``kiln.ir.primitives.random``) and then advances the offset in place
by the number of 128-bit blocks it used (one ``random_advance`` primitive over the draw's shape). A
traced program therefore reads the state as an input and writes it back, and draws fresh numbers
per call as eager code does; the advance follows a dynamic program's sizes as the draw does.
"""

from __future__ import annotations

import secrets

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.primitives.random import blocks_used
from ...ir.types import CPU, Device
from ...ir.types import device as parse_device
from ...runtime.devices import to_device
from ..autograd.grad_mode import no_grad
from ..dispatch import apply
from ..jit import state as _jit
from ..jit.layouts import writable
from ..tensor import Tensor, make_tensor
from .elementwise import floor_divide, remainder, where
from .inplace import commit_inplace

__all__ = ["Generator", "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state"]

DEFAULT_SEED = 67280421310721  # PyTorch's default seed, so that an unseeded program starts the same way
_U64 = 1 << 64


def _seed_value(seed) -> int:
    """A seed as PyTorch takes it: an int in [-2**63, 2**64), negative ones wrapped to 64 bits."""
    if isinstance(seed, Tensor):
        seed = seed.item()
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"manual_seed expected an int seed, got {type(seed).__name__}")
    seed = int(seed)
    if not -(1 << 63) <= seed < _U64:
        raise RuntimeError(f"manual_seed expected a seed in [-2**63, 2**64), got {seed}")
    return seed % _U64


class Generator:
    """A Philox-4x32-10 random stream: a 64-bit seed (the key) and an offset in 128-bit blocks.

    >>> Generator().manual_seed(7).initial_seed()
    7
    """

    def __init__(self, device="cpu") -> None:
        self.device: Device = parse_device(device)
        array = np.array([DEFAULT_SEED, 0], dtype=np.int64)
        #: The state ``[seed, offset]`` that ``random_bits`` reads: one tensor for the generator's
        #: whole life (updated in place), so that a tracer can treat it as an input and output.
        self.philox_state = make_tensor(to_device(array, self.device), self.device)

    def manual_seed(self, seed: int) -> Generator:
        """Restart the stream from ``seed`` (offset 0); returns the generator."""
        self._write(_seed_value(seed), 0)
        return self

    def seed(self) -> int:
        """Seed from the operating system's entropy; returns the new seed."""
        value = _fresh_seed("Generator.seed()")
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        # The state's seed word is the seed: draws advance only the offset, and every write of a
        # seed (manual_seed, set_state) writes it there, traced or not.
        return int(self._read("Generator.initial_seed()")[0]) % _U64

    def get_offset(self) -> int:
        """How many 128-bit blocks of the stream have been used since the seed."""
        return int(self._read("Generator.get_offset()")[1])

    def set_offset(self, offset: int) -> Generator:
        if offset < 0:
            raise ValueError(f"set_offset expected a non-negative offset, got {offset}")
        self._write(self.initial_seed(), int(offset))
        return self

    def get_state(self) -> Tensor:
        """The state as a uint8 CPU tensor of 16 bytes: seed then offset, little-endian 64-bit.

        Built from the state tensor with ops, so that a traced call reads the state it is called
        with (a copy of it: later draws do not change the result)."""
        with no_grad():
            return state_to_bytes(self.philox_state.to(CPU))

    def set_state(self, new_state: Tensor) -> Generator:
        """Restore a state from ``get_state()`` (uint8, 16 bytes) or an int64 tensor ``[seed, offset]``.

        The new state is written with ops (no values are read), so a traced call restores the
        state it computed, as checkpoint's recomputation does."""
        if not isinstance(new_state, Tensor):
            raise TypeError(f"set_state expected a kiln Tensor, got {type(new_state).__name__}")
        if new_state._dtype is dt.uint8 and tuple(new_state.shape) == (16,):
            with no_grad():
                words = bytes_to_state(new_state.detach())
        elif new_state._dtype is dt.int64 and tuple(new_state.shape) == (2,):
            words = new_state.detach()
        else:
            raise RuntimeError(
                f"set_state expected a uint8 tensor of 16 bytes or an int64 tensor of shape (2,), "
                f"got {new_state.dtype.name} of shape {tuple(new_state.shape)}"
            )
        self._commit(words.to(self.device), "set_state")
        return self

    def _read(self, what: str) -> np.ndarray:
        self.philox_state._value_access(what)  # a trace stops here rather than keep the value as a constant
        return np.asarray(self.philox_state._host())

    def _write(self, seed: int, offset: int) -> None:
        seed = seed - _U64 if seed >= 1 << 63 else seed  # the 64 bits as int64
        array = np.array([seed, offset], dtype=np.int64)
        self._commit(make_tensor(to_device(array, self.device), self.device), "manual_seed")

    def _commit(self, words: Tensor, op: str) -> None:
        if _jit.tracing:  # the state is an input the call overwrites: written back after each call
            _jit.touch(self.philox_state)
        with no_grad():
            commit_inplace(self.philox_state, words, op=op)

    def bits(self, shape: tuple[int, ...]) -> Tensor:
        """``shape`` random uint32 values (in int64), advancing the stream past them."""
        out = apply(P["random_bits"], self.philox_state, shape=shape)
        if out._data.size:  # (an op over the shape, not a constant: see random_advance)
            advanced = apply(P["random_advance"], self.philox_state, shape=shape)
            commit_inplace(self.philox_state, advanced, op="random draw")
        return out

    def bits_array(self, shape: tuple[int, ...]) -> np.ndarray:
        """``bits(shape)``'s array, the state advanced the same way, without the two dispatches: for
        an eager draw on the CPU outside traces and profiles (``random._on_arrays``)."""
        state = self.philox_state
        out = P["random_bits"].eager(np, state._data, shape=shape)
        if out.size:
            writable(state._data)[1] += blocks_used(shape)
            state._version[0] += 1
        return out

    def __repr__(self) -> str:
        seed = int(np.asarray(self.philox_state._host())[0]) % _U64  # (a repr is no value a graph uses)
        return f"<kiln.Generator device={self.device} seed={seed}>"


# ----------------------------------------------------------------------------- state as bytes
_BYTE_SCALES = np.array([1 << (8 * k) for k in range(8)], dtype=np.int64)  # byte k of a word: w // 256**k % 256


def state_to_bytes(state: Tensor) -> Tensor:
    """The int64 state ``[seed, offset]`` as 16 uint8 bytes, each word little-endian (ops only)."""
    scales = make_tensor(_BYTE_SCALES, state._device)
    # floor division and a positive modulus read a negative word in two's complement, as its bytes
    words = remainder(floor_divide(state.reshape(2, 1), scales), 256)
    return apply(P["cast"], words, dtype=dt.uint8).reshape(16)


def bytes_to_state(data: Tensor) -> Tensor:
    """16 uint8 bytes (two little-endian 64-bit words) as the int64 state ``[seed, offset]`` (ops only)."""
    b = apply(P["cast"], data, dtype=dt.int64).reshape(2, 8)
    low = (b[:, :7] * make_tensor(_BYTE_SCALES[:7], data._device)).sum(1)  # < 2**56: no overflow
    top = b[:, 7]
    top = where(top >= 128, top - 256, top)  # the sign byte, so that the sum stays within int64
    return low + top * (1 << 56)


default_generator = Generator()
_defaults: dict[Device, Generator] = {CPU: default_generator}


def _generator(generator: Generator | None, device: Device) -> Generator:
    if generator is None:
        gen = _defaults.get(device)
        if gen is None:  # a device's default generator starts from the CPU one's seed
            gen = _defaults[device] = Generator(device).manual_seed(default_generator.initial_seed())
        return gen
    if not isinstance(generator, Generator):
        raise TypeError(f"expected a kiln.Generator, got {type(generator).__name__}")
    if generator.device is not device:
        raise RuntimeError(f"Expected a '{device.type}' device type for generator but found '{generator.device.type}'")
    return generator


def _fresh_seed(caller: str) -> int:
    """A seed from the operating system's entropy; a traced call stops (a graph would replay the seed
    its trace drew on every call)."""
    if _jit.tracing:
        _jit.unsafe(f"{caller} draws a seed from the operating system on every call")
    return secrets.randbits(64)


def manual_seed(seed: int) -> Generator:
    """Seed every device's default generator; returns the CPU one (as ``torch.manual_seed``)."""
    seed = _seed_value(seed)
    for gen in _defaults.values():
        gen.manual_seed(seed)
    return default_generator


def seed() -> int:
    """Seed the default generators from the operating system's entropy; returns the seed."""
    value = _fresh_seed("kiln.seed()")
    manual_seed(value)
    return value


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state() -> Tensor:
    return default_generator.get_state()


def set_rng_state(new_state: Tensor) -> None:
    default_generator.set_state(new_state)
