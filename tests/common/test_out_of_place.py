"""Out-of-place allreduce on each backend, 1 to 3 ranks (tests/common/workers)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "out_of_place_worker.py"
CHECKS = ["into_given_output", "into_runtime_blocks", "a_result_reduced_again",
          "with_scale_factors_and_average"]


@pytest.mark.parametrize("np, env", [
    (1, {}),
    (2, {"HOROVODISH_CPU_OPERATIONS": "mpi"}),
    (2, {"HOROVODISH_CPU_OPERATIONS": "ring"}),
    (3, {"HOROVODISH_CPU_OPERATIONS": "ring"}),
    (3, {"HOROVODISH_CPU_OPERATIONS": "mpi"}),
], ids=["1-rank", "2-mpi", "2-ring", "3-ring", "3-mpi"])
def test_out_of_place_allreduce(np, env):
    assert_ranks_ok(run_ranks(WORKER, np, env=env, timeout=120), np, CHECKS)
