"""Communication hooks and PowerSGD (tests/torch/workers/comm_hooks_worker.py): PowerSGD
at full rank equals the exact allreduce, the cast hooks equal Compression, bytes per step
drop by (rows * cols) / ((rows + cols) * rank) per matrix, and the digits example keeps
its test accuracy with PowerSGD of rank 1 to 4."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "comm_hooks_worker.py"
CHECKS = ["powersgd_at_full_rank_is_exact", "matches_ddp_powersgd_hook",
          "cast_hooks_equal_compression",
          "a_hook_of_ones_own", "bytes_per_step", "errors"]


@pytest.mark.parametrize("np, checks", [
    (2, [*CHECKS, "digits_accuracy_kept"]),
    (3, ["powersgd_at_full_rank_is_exact", "cast_hooks_equal_compression", "bytes_per_step"])],
    ids=["2-ranks-and-digits", "3-ranks"])
def test_comm_hooks(np, checks):
    assert_ranks_ok(run_ranks(WORKER, np, args=checks, timeout=300), np, checks)
