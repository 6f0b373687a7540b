"""Faults while CUDA tensors travel through NCCL between two ranks on the one GPU (each
its own NCCL_HOSTID, distinct_hosts.py): a rank killed with NCCL allreduces in flight
leaves no one hanging inside NCCL (an elastic job goes on at one rank); a stalled rank
is named by the stall inspector, which ends the job; a rank frozen (SIGSTOP) with NCCL
allreduces in flight is named by the rank waiting for it, which ends the job. Each
within 60 s. Skipped without a GPU (conftest.py)."""
from __future__ import annotations

import re
import time
from pathlib import Path

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "gpu_faults_worker.py"
DISTINCT_HOSTS = Path(__file__).parent / "distinct_hosts.py"
NCCL = {"HOROVODISH_GPU_OPERATIONS": "nccl"}


def test_a_rank_killed_mid_collective_and_the_elastic_job_goes_on():
    start = time.monotonic()
    result = run_ranks(DISTINCT_HOSTS, 2, args=[WORKER, "killed_mid_collective"], env=NCCL,
                       launcher_args=["--min-np", "1"], timeout=120)
    assert time.monotonic() - start < 60, result.stdout
    assert re.search(r"generation 1 ended: rank 1 on \S+ was killed by SIGKILL",
                     result.stdout), result.stdout
    assert_ranks_ok(result, 1, ["killed_mid_collective"])


def test_a_stalled_rank_is_named_and_the_job_ends():
    start = time.monotonic()
    result = run_ranks(DISTINCT_HOSTS, 2, args=[WORKER, "stalls"], timeout=120, env={
        **NCCL, "HOROVODISH_STALL_CHECK_TIME_SECONDS": "2",
        "HOROVODISH_STALL_SHUTDOWN_TIME_SECONDS": "5"})
    assert time.monotonic() - start < 60, result.stdout
    assert result.returncode != 0, result.stdout
    assert "rank 1 has not submitted: allreduce.lonely_tensor" in result.stdout, \
        result.stdout


def test_a_rank_frozen_mid_collective_is_named_and_the_job_ends():
    start = time.monotonic()
    result = run_ranks(DISTINCT_HOSTS, 2, args=[WORKER, "freezes_mid_collective"],
                       timeout=120, env={**NCCL, "HOROVODISH_STALL_CHECK_TIME_SECONDS": "2",
                                         "HOROVODISH_STALL_SHUTDOWN_TIME_SECONDS": "5"})
    assert time.monotonic() - start < 60, result.stdout
    assert result.returncode != 0, result.stdout
    assert "by the stall inspector: rank 1 has taken no part in" in result.stdout, \
        result.stdout
