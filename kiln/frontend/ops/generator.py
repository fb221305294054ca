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

from ...ir.primitives import P
from ...ir.types import CPU, Device
from ...ir.types import device as parse_device
from ...runtime.devices import to_device
from ..dispatch import apply
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor
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
        self._initial_seed = DEFAULT_SEED
        array = np.array([DEFAULT_SEED, 0], dtype=np.int64)
        #: The state ``[seed, offset]`` that ``random_bits`` reads: one tensor for the generator's
        #: whole life (updated in place), so that a tracer can treat it as an input and output.
        self.philox_state = make_tensor(to_device(array, self.device), self.device)

    def manual_seed(self, seed: int) -> Generator:
        """Restart the stream from ``seed`` (offset 0); returns the generator."""
        seed = _seed_value(seed)
        self._initial_seed = seed
        self._write(seed, 0)
        return self

    def seed(self) -> int:
        """Seed from the operating system's entropy; returns the new seed."""
        if _jit.tracing:  # a fresh seed per call is Python randomness a graph would freeze
            _jit.unsafe("Generator.seed() draws a seed from the operating system on every call")
        value = secrets.randbits(64)
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        return self._initial_seed

    def get_offset(self) -> int:
        """How many 128-bit blocks of the stream have been used since the seed."""
        return int(self._read()[1])

    def set_offset(self, offset: int) -> Generator:
        if offset < 0:
            raise ValueError(f"set_offset expected a non-negative offset, got {offset}")
        self._write(self._initial_seed, int(offset))
        return self

    def get_state(self) -> Tensor:
        """The state as a uint8 CPU tensor of 16 bytes: seed then offset, little-endian 64-bit."""
        words = self._read().astype("<i8")
        return make_tensor(words.view(np.uint8).copy(), CPU)

    def set_state(self, new_state: Tensor) -> Generator:
        """Restore a state from ``get_state()`` (uint8, 16 bytes) or an int64 tensor ``[seed, offset]``."""
        if not isinstance(new_state, Tensor):
            raise TypeError(f"set_state expected a kiln Tensor, got {type(new_state).__name__}")
        new_state._value_access("Generator.set_state() (the new state's values become Python ints)")
        host = np.ascontiguousarray(new_state._host())
        if host.dtype == np.uint8 and host.shape == (16,):
            seed, offset = (int(w) for w in host.view("<i8"))
        elif host.dtype == np.int64 and host.shape == (2,):
            seed, offset = (int(w) for w in host)
        else:
            raise RuntimeError(
                f"set_state expected a uint8 tensor of 16 bytes or an int64 tensor of shape (2,), "
                f"got {new_state.dtype.name} of shape {tuple(new_state.shape)}"
            )
        self._initial_seed = seed % _U64
        self._write(seed, offset)
        return self

    def _read(self) -> np.ndarray:
        return np.asarray(self.philox_state._host())

    def _write(self, seed: int, offset: int) -> None:
        seed = seed - _U64 if seed >= 1 << 63 else seed  # the 64 bits as int64
        array = np.array([seed, offset], dtype=np.int64)
        if _jit.tracing:  # the state is an input the call overwrites: written back after each call
            _jit.touch(self.philox_state)
        commit_inplace(self.philox_state, make_tensor(to_device(array, self.device), self.device), op="manual_seed")

    def bits(self, shape: tuple[int, ...]) -> Tensor:
        """``shape`` random uint32 values (in int64), advancing the stream past them."""
        out = apply(P["random_bits"], self.philox_state, shape=shape)
        if out._data.size:  # (an op over the shape, not a constant: see random_advance)
            advanced = apply(P["random_advance"], self.philox_state, shape=shape)
            commit_inplace(self.philox_state, advanced, op="random draw")
        return out

    def __repr__(self) -> str:
        return f"<kiln.Generator device={self.device} seed={self._initial_seed}>"


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


def manual_seed(seed: int) -> Generator:
    """Seed every device's default generator; returns the CPU one (as ``torch.manual_seed``)."""
    seed = _seed_value(seed)
    for gen in _defaults.values():
        gen.manual_seed(seed)
    return default_generator


def seed() -> int:
    """Seed the default generators from the operating system's entropy; returns the seed."""
    value = secrets.randbits(64)
    manual_seed(value)
    return value


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state() -> Tensor:
    return default_generator.get_state()


def set_rng_state(new_state: Tensor) -> None:
    default_generator.set_state(new_state)
