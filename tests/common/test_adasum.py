"""Adasum on 2 and 4 ranks against numpy; a clear error on 3."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "adasum_worker.py"
POWER_OF_TWO_CHECKS = ["float_dtypes", "grouped_per_tensor", "parallel_average_orthogonal_add",
                       "rejects_integers"]


@pytest.mark.parametrize("np", [2, 3, 4])
def test_adasum(np):
    checks = POWER_OF_TWO_CHECKS if np & (np - 1) == 0 else ["rejects_a_non_power_of_two_world"]
    assert_ranks_ok(run_ranks(WORKER, np), np, checks)
