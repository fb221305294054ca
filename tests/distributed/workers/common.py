"""What every worker script shares: one thread, the process group, and a counter of checks."""

from __future__ import annotations

import numpy as np

import kiln
import kiln.distributed as dist


class Checks:
    def __init__(self, rank: int) -> None:
        self.count = 0
        self.rank = rank

    def close(self, actual, expected, rtol: float = 1e-6, atol: float = 1e-6, what: str = "") -> None:
        actual = actual.detach().numpy() if isinstance(actual, kiln.Tensor) else np.asarray(actual)
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=f"rank {self.rank}: {what}")
        self.count += 1

    def true(self, condition: bool, what: str) -> None:
        assert condition, f"rank {self.rank}: {what}"
        self.count += 1

    def report(self) -> None:
        print(f"rank {self.rank} passed {self.count} checks", flush=True)


def start() -> tuple[int, int, Checks]:
    kiln.set_num_threads(1)
    dist.init_process_group("mpi")
    return dist.get_rank(), dist.get_world_size(), Checks(dist.get_rank())


def data(rank: int, shape: tuple, dtype=np.float32) -> np.ndarray:
    """Rank ``rank``'s input: every process can make every rank's, to compute the expected result."""
    rng = np.random.default_rng(100 + rank)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-5, 6, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
