"""Faults that used to pass silently (kiln issue 36, "Distributed"), on jobs of 2 and 3 processes:

- collectives and messages whose ranks pass different shapes, dtypes, ops or roots: every rank
  (the receiver, for a message) raises CollectiveMismatchError naming what each rank passed;
- a rank that ends early -- ``os._exit(0)``, a non-zero status, a signal, or its script ending
  while the others wait for it in a collective: the launcher stops the job, exits non-zero and
  names the rank and how it ended, within seconds.
"""

from __future__ import annotations

import pytest

from tests.distributed.launch import launch, passed

# checks per rank of workers/mismatch.py (rank 0 also receives the mismatched messages)
MISMATCH_CHECKS = {2: {0: 74, 1: 66}, 3: {0: 92, 1: 82, 2: 82}}


@pytest.mark.parametrize("nproc", [2, 3])
def test_mismatched_calls_raise_on_every_rank(nproc):
    done, _ = launch("mismatch.py", nproc, timeout=120)
    for rank, checks in MISMATCH_CHECKS[nproc].items():
        passed(done, rank, checks)
    for rank in range(nproc):  # one line per caught error: count and dtype mismatches among them
        assert f"rank {rank} all_reduce count: all_reduce: the ranks of the group called it" in done.stdout
        assert f"rank {rank} all_reduce dtype: all_reduce:" in done.stdout


@pytest.mark.parametrize("nproc", [2, 3])
def test_the_switch_turns_the_check_off(nproc):
    done, _ = launch("mismatch.py", nproc, "off", timeout=120)
    passed(done, nproc - 1, 2)  # 4 against 8 elements went through, unreduced tail and all


def test_an_uncaught_mismatch_fails_the_job():
    done, seconds = launch("mismatch_uncaught.py", 2, timeout=120)
    assert done.returncode != 0
    assert "CollectiveMismatchError: all_reduce: the ranks of the group called it" in done.stderr, done.stderr
    assert "rank 1: all_reduce of float32[8]" in done.stderr
    assert seconds < 60


def _stopped(done, nproc: int, how: str, seconds: float) -> None:
    """The launcher exited non-zero, naming the last rank and how it ended, and did not hang."""
    last = nproc - 1
    assert done.returncode != 0, f"exit 0\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert f"kiln.distributed.run: rank {last} {how}" in done.stderr, done.stderr
    assert f"  rank {last}: {how}" in done.stderr, done.stderr
    assert "passed 1 checks" not in done.stdout, done.stdout
    assert seconds < 30, f"the job took {seconds:.0f} s to end"


ENDINGS = {
    "exit0": "exited with status 0 before its script ended",
    "exit3": "exited with status 3",
    "sigkill": "killed by signal 9 (SIGKILL)",
    "sigterm": "killed by signal 15 (SIGTERM)",
}


@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("how", ENDINGS)
def test_a_rank_that_ends_while_others_wait_in_a_collective_stops_the_job(nproc, how):
    done, seconds = launch("ends.py", nproc, how, timeout=60)
    _stopped(done, nproc, ENDINGS[how], seconds)


@pytest.mark.parametrize("nproc", [2, 3])
def test_a_rank_that_exits_0_while_others_work_stops_the_job(nproc):
    done, seconds = launch("ends.py", nproc, "exit0", "busy", timeout=60)
    _stopped(done, nproc, ENDINGS["exit0"], seconds)
    for rank in range(nproc - 1):  # stopped by the launcher (SIGTERM) or by mpiexec's own cleanup
        stopped = (f"  rank {rank}: killed by signal 15 (SIGTERM)", f"  rank {rank}: stopped with the job")
        assert any(line in done.stderr for line in stopped), done.stderr


@pytest.mark.parametrize("nproc", [2, 3])
def test_a_peer_waiting_for_a_rank_whose_script_ended_is_told(nproc):
    done, seconds = launch("ends.py", nproc, "finish", timeout=60)
    assert done.returncode != 0
    told = (
        f"PeerEndedError: all_reduce (the ranks' check of their shapes and dtypes) cannot complete: rank {nproc - 1} "
    )
    assert told + "finished its script while this rank waits for it here" in done.stderr, done.stderr
    assert seconds < 30


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_that_end_at_different_times_after_their_last_collective_are_fine(nproc):
    done, _ = launch("ends.py", nproc, "late", timeout=60)
    for rank in range(nproc):
        passed(done, rank, 1)
