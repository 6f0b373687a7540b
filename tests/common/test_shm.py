"""The shared-memory allreduce on 2 and 3 ranks against numpy (tests/common/workers)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "shm_worker.py"
CHECKS = ["window_opens", "every_dtype_op_and_layout", "fast_and_slow_readers_back_to_back",
          "failed_pack_fails_every_rank", "failed_copy_out_fails_its_rank_only",
          "in_place_many_tensors_a_piece", "failed_describe_fails_every_rank",
          "in_place_through_the_backend_interface",
          "chosen_from_the_threshold_for_groups_and_single_tensors", "pieces"]


@pytest.mark.parametrize("np", [2, 3])
def test_shared_memory_allreduce(np):
    assert_ranks_ok(run_ranks(WORKER, np, timeout=180), np, CHECKS)
