"""Jobs of 2 and 3 processes started through ``python -m kiln.distributed.run`` (skipped without
mpi4py or mpiexec). Each worker script checks its results against numpy or against one process
training on the concatenated batches, raises on the first mismatch (failing the job), and prints
how many checks it passed."""

from __future__ import annotations

import pytest

from tests.distributed.launch import launch, passed

# checks per rank (rank 0 receives from every other rank; outside the pair rank 2 checks less)
COLLECTIVE_CHECKS = {2: {0: 45, 1: 44}, 3: {0: 47, 1: 45, 2: 43}}


@pytest.mark.parametrize("nproc", [2, 3])
def test_every_collective_against_numpy(nproc):
    done, _ = launch("collectives.py", nproc)
    for rank, checks in COLLECTIVE_CHECKS[nproc].items():
        passed(done, rank, checks)


def test_ddp_training_equals_one_process_on_the_concatenated_batches(tmp_path):
    done, _ = launch("ddp.py", 2, str(tmp_path))
    for rank in range(2):
        passed(done, rank, 45)
    assert (tmp_path / "ddp.kiln").exists()  # rank 0 saved the checkpoint the others loaded


def test_a_worker_that_raises_ends_the_job_with_its_traceback():
    done, seconds = launch("fails.py", 2, timeout=120)
    assert done.returncode != 0
    assert "[rank 1] ValueError: boom on rank 1" in done.stderr, done.stderr
    assert "should never get here" not in done.stdout
    assert seconds < 60, f"the job took {seconds:.0f} s to end"


def _gpus() -> int:
    try:
        import cupy
        from cupy.cuda import nccl  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no cupy, no NCCL, or no CUDA driver: no GPU test
        return 0


def test_nccl_backend_on_the_gpus():
    gpus = _gpus()
    if gpus == 0:
        pytest.skip("the NCCL backend needs cupy with NCCL and a CUDA GPU")
    done, _ = launch("nccl.py", gpus)
    for rank in range(gpus):
        passed(done, rank, 5)
