"""Negotiation on real ranks (tests/common/workers/negotiation_worker.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "negotiation_worker.py"
CHECKS = ["records_gathered_through_mpi", "changing_dims_and_splits_ride_the_cache"]


@pytest.mark.parametrize("np", [2, 3])
def test_records_and_changing_dims_and_splits(np):
    assert_ranks_ok(run_ranks(WORKER, np, timeout=120), np, CHECKS)
