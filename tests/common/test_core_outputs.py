"""Outputs passed to the core API (tests/common/workers/core_outputs_worker.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "core_outputs_worker.py"


@pytest.mark.parametrize("operations", ["", "mpi"])
def test_outputs_are_checked_and_strided_ones_filled(operations):
    env = {"HOROVODISH_CPU_OPERATIONS": operations} if operations else {}
    result = run_ranks(WORKER, 2, env=env, timeout=120)
    assert_ok(result)
    for rank in range(2):
        assert f"OK rank {rank} of 2" in result.stdout, result.stdout
