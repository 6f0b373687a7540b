"""Faults end the job cleanly: no hang, a non-zero exit, a message that says why."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from multirank import run_ranks

WORKER = Path(__file__).parent / "workers" / "faults_worker.py"


@pytest.mark.parametrize("scenario", ["killed", "raises"])
def test_a_rank_that_dies_ends_the_job(scenario):
    start = time.monotonic()
    result = run_ranks(WORKER, 3, args=[scenario], timeout=90)
    assert time.monotonic() - start < 60
    assert result.returncode != 0, result.stdout
    # The sums before the failure were right (a wrong one also ends the job, non-zero).
    assert "FAILED: sum at step" not in result.stdout, result.stdout
    if scenario == "raises":
        assert "deliberate failure on rank 1" in result.stdout
        assert "because rank 1 shut down" in result.stdout, result.stdout


def test_a_rank_that_fails_before_init_ends_the_job():
    """MPI starts at import: the failed rank used to wait in MPI_Finalize for the others,
    which waited for it in init(), for good."""
    start = time.monotonic()
    result = run_ranks(WORKER, 2, args=["raises_before_init"], timeout=90)
    assert time.monotonic() - start < 30, result.stdout
    assert result.returncode != 0, result.stdout
    assert "deliberate failure before init on rank 1" in result.stdout, result.stdout
    assert "rank 1 failed before horovodish.init() completed" in result.stdout


def test_stall_inspector_names_tensor_and_rank_then_ends_the_job():
    start = time.monotonic()
    result = run_ranks(WORKER, 2, args=["stalls"], timeout=90, env={
        "HOROVODISH_STALL_CHECK_TIME_SECONDS": "2",
        "HOROVODISH_STALL_SHUTDOWN_TIME_SECONDS": "5"})
    elapsed = time.monotonic() - start
    assert result.returncode != 0, result.stdout
    assert elapsed < 30, elapsed
    assert "rank 1 has not submitted: lonely_tensor" in result.stdout, result.stdout
    assert "stall inspector" in result.stdout


@pytest.mark.parametrize("scenario, where", [
    ("freezes", "negotiation"),
    ("freezes_mid_collective", "(negotiation|a shared-memory collective)")])
def test_a_frozen_rank_is_named_and_ends_the_job(scenario, where):
    """A rank stopped by SIGSTOP runs no cycle, so the stall inspector never hears of
    it: a rank waiting for it (in negotiation, or in a shared-memory allreduce's
    barrier) names it after the check time, ends the job after the shutdown time and
    kills it (mpirun's SIGTERM cannot end a stopped process: the job used to wait for
    it for good)."""
    start = time.monotonic()
    result = run_ranks(WORKER, 3, args=[scenario], timeout=90, env={
        "HOROVODISH_STALL_CHECK_TIME_SECONDS": "2",
        "HOROVODISH_STALL_SHUTDOWN_TIME_SECONDS": "4"})
    assert time.monotonic() - start < 30, result.stdout
    assert result.returncode != 0, result.stdout
    assert re.search(rf"rank 1 has taken no part in {where} for 2 s", result.stdout), \
        result.stdout
    # (The ranks' scripts may be ended before they print their own errors: the
    # launcher ends the job once the stopped rank is killed.)
    assert re.search(rf"shutting down: by the stall inspector: rank 1 has taken no part in "
                     rf"{where}", result.stdout), result.stdout


def test_a_rank_that_fails_while_others_add_a_process_set_ends_the_job():
    """Registration agrees through the runtime: it used to wait in a bare MPI call."""
    start = time.monotonic()
    result = run_ranks(WORKER, 2, args=["raises_before_add"], timeout=90)
    assert time.monotonic() - start < 30, result.stdout
    assert result.returncode != 0, result.stdout
    assert "because rank 1 shut down" in result.stdout, result.stdout
    assert "process_set.call.0" in result.stdout, result.stdout


def test_a_stall_inside_a_process_set_names_world_ranks():
    start = time.monotonic()
    result = run_ranks(WORKER, 3, args=["stalls_in_set"], timeout=90, env={
        "HOROVODISH_STALL_CHECK_TIME_SECONDS": "2",
        "HOROVODISH_STALL_SHUTDOWN_TIME_SECONDS": "5"})
    assert time.monotonic() - start < 30, result.stdout
    assert result.returncode != 0, result.stdout
    assert "rank 2 has not submitted: lonely_tensor" in result.stdout, result.stdout


@pytest.mark.parametrize("scenario", ["internal_error", "internal_error_caught"])
def test_a_runtime_failing_midway_ends_the_job(scenario):
    """Rank 1 is inside the data allreduce that rank 0's failed cycle never joins: only
    ending the job frees it. Rank 0 sees the error; the job exits non-zero, at once when
    rank 0's script ends, after the grace period when it catches the error and lingers."""
    start = time.monotonic()
    result = run_ranks(WORKER, 2, args=[scenario], timeout=90)
    elapsed = time.monotonic() - start
    assert result.returncode != 0, result.stdout
    assert elapsed < 40, elapsed
    assert "rank 0 got: horovodish was shut down after an internal error: " \
        "RuntimeError('injected runtime failure')" in result.stdout, result.stdout
    # (Not asserted: the "aborting the job" line. MPI_Abort kills the ranks, and the
    # launcher's forwarding sometimes loses their last lines; the exit code and the
    # time the job took are what show that it ended.)


@pytest.mark.parametrize("np", [2, 3])
def test_init_after_the_other_ranks_left_returns_and_a_collective_raises(np):
    """Rank 0's init() after the others shut down and exited: it used to wait for them
    in MPI_Comm_dup for ever. Now it returns, as Horovod's does in that state, and the
    next collective raises naming the ranks that left; the job ends with exit code 0."""
    start = time.monotonic()
    result = run_ranks(WORKER, np, args=["init_after_the_others_left"], timeout=60)
    assert time.monotonic() - start < 30, result.stdout
    assert result.returncode == 0, result.stdout
    left = ", ".join(str(r) for r in range(1, np))
    assert "RUNTIME STOPPED True" in result.stdout, result.stdout
    assert "INIT RETURNED" in result.stdout, result.stdout
    assert (f"COLLECTIVE RAISED: horovodish has been shut down because rank {left} shut "
            "down") in result.stdout, result.stdout
    assert f"init(): rank(s) {left} shut down" in result.stdout, result.stdout
    assert f"CHECK init_after_the_others_left rank 0/{np}: ok" in result.stdout, \
        result.stdout
