"""Process sets on 3 ranks: collectives on a set that excludes a rank, dynamic add/remove."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "process_sets_worker.py"


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_process_sets(mode):
    result = run_ranks(WORKER, 3, args=[mode], timeout=120)
    assert_ok(result)
    for rank in range(3):
        assert f"OK rank {rank} of 3" in result.stdout, result.stdout


def test_init_and_shutdown_alternate_without_running_out_of_communicators():
    result = run_ranks(Path(__file__).parent / "workers" / "reinit_worker.py", 2,
                       timeout=180)
    assert_ok(result)
    for rank in range(2):
        assert f"OK rank {rank} of 2" in result.stdout, result.stdout


def test_init_with_a_list_of_ranks_and_a_rank_left_out():
    result = run_ranks(Path(__file__).parent / "workers" / "init_subset_worker.py", 3,
                       timeout=60)
    assert_ok(result)
    for rank in range(3):
        assert f"OK rank {rank}" in result.stdout, result.stdout
    assert "not in the list" in result.stdout
