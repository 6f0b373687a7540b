"""Collectives past 2**31 elements and 2**31 bytes on every CPU backend
(tests/common/workers/large_tensor_worker.py); about 10 GiB of memory at 2 ranks."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "large_tensor_worker.py"
CHECKS = ["allreduce_out_and_in_place", "broadcast_in_place", "allgather_past_two_gib",
          "reducescatter_past_two_gib", "alltoall_past_two_gib"]


# What each backend carries itself (its enabled()); the rest of its job goes to MPI's
# backend, which the first case checks in full.
CARRIED = {"mpi": CHECKS, "ring": ["allreduce_out_and_in_place", "reducescatter_past_two_gib"],
           "shm": ["allreduce_out_and_in_place"]}


@pytest.mark.parametrize("operations", ["mpi", "ring", "shm"])
def test_every_collective_past_two_to_the_31(operations):
    env = {"HOROVODISH_CPU_OPERATIONS": operations}
    checks = CARRIED[operations]
    assert_ranks_ok(run_ranks(WORKER, 2, args=checks, env=env, timeout=600), 2, checks)
