"""Prescale/postscale follow Horovod's arithmetic exactly (tests/common/workers)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "scaling_worker.py"
CHECKS = ["single_tensor", "fused_group", "many_small_tensors", "reducescatter"]


@pytest.mark.parametrize("operations", ["", "mpi"])
def test_scale_factors_match_horovods_arithmetic(operations):
    env = {"HOROVODISH_CPU_OPERATIONS": operations} if operations else {}
    assert_ranks_ok(run_ranks(WORKER, 2, env=env, timeout=180), 2, CHECKS)
