"""Prescale/postscale follow Horovod's arithmetic exactly (tests/common/workers)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "scaling_worker.py"


@pytest.mark.parametrize("operations", ["", "mpi"])
def test_scale_factors_match_horovods_arithmetic(operations):
    env = {"HOROVODISH_CPU_OPERATIONS": operations} if operations else {}
    result = run_ranks(WORKER, 2, env=env, timeout=180)
    assert_ok(result)
    for rank in range(2):
        assert f"OK rank {rank} of 2" in result.stdout, result.stdout
