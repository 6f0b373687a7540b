"""The shared-memory allreduce on 2 and 3 ranks against numpy (tests/common/workers)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "shm_worker.py"


@pytest.mark.parametrize("np", [2, 3])
def test_shared_memory_allreduce(np):
    result = run_ranks(WORKER, np, timeout=180)
    assert_ok(result)
    for rank in range(np):
        assert f"OK rank {rank} of {np}" in result.stdout, result.stdout
