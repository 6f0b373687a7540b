"""The worker harness (tests/worker_support.py, multirank.assert_ranks_ok) on 2 real ranks:
every check runs after a failure, and the failure names each failed check and rank."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "harness_worker.py"
SCENARIOS = Path(__file__).parent / "scenario_worker.py"


def test_passing_checks_pass():
    result = run_ranks(WORKER, 2, args=["pass"], timeout=60)
    assert_ranks_ok(result, 2, checks=["agrees", "last"])


def test_a_failure_names_each_failed_check_and_rank_and_the_rest_still_run():
    result = run_ranks(WORKER, 2, args=["fail"], timeout=60)
    with pytest.raises(AssertionError) as failure:
        assert_ranks_ok(result, 2)
    message = str(failure.value).split("--- command ---")[0]
    assert "differs_on_rank_1 on rank 1: FAILED: second value: got [1. 2.], want [1. 3.]" \
        in message, message
    assert "differs_on_rank_1 on rank 0" not in message, message
    assert "raises_on_rank_0 on rank 0: FAILED: raised RuntimeError: boom" in message, message
    assert "last on rank" not in message, message  # ran after the failures, and passed
    assert "did not finish" not in message, message


def test_a_check_that_raises_while_the_others_wait_in_a_collective_ends_the_job():
    """Rank 0's check raises; ranks 1 and 2 wait in an allreduce for it. Rank 0 gives
    them worker_support.STRAGGLER_GRACE_S (5 s) to finish the check, then ends the job:
    it must not hang until run_ranks' timeout, and the error comes first."""
    start = time.monotonic()
    result = run_ranks(WORKER, 3, args=["hang"], timeout=90)
    elapsed = time.monotonic() - start
    assert result.returncode != 0, result.stdout
    assert elapsed < 30, f"the job took {elapsed:.0f} s to end:\n{result.stdout}"
    with pytest.raises(AssertionError) as failure:
        assert_ranks_ok(result, 3)
    message = str(failure.value).split("--- command ---")[0]
    assert message.startswith("checks failed:\n  rank 0 ended the job: check "
                              "raises_while_the_others_reduce raised"), message
    assert "raises_while_the_others_reduce on rank 0: FAILED: raised RuntimeError: " \
        "deliberate failure while the others reduce" in message, message
    for rank in (1, 2):
        assert f"raises_while_the_others_reduce on rank {rank}: missing" in message, message
        assert f"rank {rank} did not finish its checks" in message, message


def test_a_check_that_never_reported_is_missing():
    result = run_ranks(WORKER, 2, args=["pass"], timeout=60)
    with pytest.raises(AssertionError, match="never_ran on rank 0: missing"):
        assert_ranks_ok(result, 2, checks=["agrees", "never_ran"])


def test_close_takes_a_separate_absolute_tolerance_as_numpy_does():
    import worker_support
    try:
        assert worker_support.close([1.0], [1.0 + 1e-6], "relative", tol=1e-5, atol=0.0)
        assert not worker_support.close([0.0], [1e-7], "absolute", tol=1e-5, atol=1e-8)
        assert worker_support.close([0.0], [1e-9], "absolute", tol=1e-5, atol=1e-8)
        assert not worker_support.close([0.0], [1e-9], "exact")
    finally:
        worker_support._failures.clear()


def test_a_scenario_reports_its_comparisons_and_exits_1_if_one_failed():
    passed = run_ranks(SCENARIOS, 1, args=["compares", "1.0"], timeout=60)
    assert_ranks_ok(passed, 1, checks=["compares"])
    failed = run_ranks(SCENARIOS, 1, args=["compares", "2.0"], timeout=60)
    assert failed.returncode != 0, failed.stdout
    assert "CHECK compares rank 0/1: FAILED: one: got [1.], want [2.]" in failed.stdout, \
        failed.stdout


def test_a_scenario_s_exception_ends_the_rank_as_in_a_script():
    """Not caught nor reported as a check: the job ends as a user's failing script's."""
    result = run_ranks(SCENARIOS, 1, args=["raises"], timeout=60)
    assert result.returncode != 0, result.stdout
    assert "LookupError: deliberate failure in a scenario" in result.stdout, result.stdout
    assert "CHECK raises" not in result.stdout, result.stdout


def test_an_unknown_scenario_names_the_known_ones():
    result = run_ranks(SCENARIOS, 1, args=["nonesuch"], timeout=60)
    assert result.returncode != 0, result.stdout
    assert "SCENARIO one of: compares, raises, variants" in result.stdout, result.stdout


def test_a_worker_gets_the_mpi_variants_its_environment_asks_for():
    result = run_ranks(SCENARIOS, 1, args=["variants", "3.1"], timeout=60,
                       env={"HOROVODISH_TEST_MPI_VERSION": "3.1",
                            "HOROVODISH_TEST_NO_SHM_EXCHANGE": "1"})
    assert_ranks_ok(result, 1, checks=["variants"])
