"""Outputs passed to the core API (tests/common/workers/core_outputs_worker.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "core_outputs_worker.py"
CHECKS = ["mismatched_outputs_raise_at_submit", "strided_output_alone",
          "strided_output_fused_with_a_runtime_owned_one", "broadcast_from_every_root"]


@pytest.mark.parametrize("operations,np", [("", 2), ("mpi", 2), ("", 3)])
def test_outputs_are_checked_and_strided_ones_filled(operations, np):
    env = {"HOROVODISH_CPU_OPERATIONS": operations} if operations else {}
    assert_ranks_ok(run_ranks(WORKER, np, env=env, timeout=120), np, CHECKS)
