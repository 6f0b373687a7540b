"""Prescale/postscale follow Horovod's arithmetic exactly (tests/common/workers)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "scaling_worker.py"
CHECKS = ["single_tensor", "fused_group", "many_small_tensors", "in_place", "reducescatter",
          "alone_nothing_is_packed"]


@pytest.mark.parametrize("operations", ["", "mpi"])
def test_scale_factors_match_horovods_arithmetic(operations):
    env = {"HOROVODISH_CPU_OPERATIONS": operations} if operations else {}
    assert_ranks_ok(run_ranks(WORKER, 2, env=env, timeout=180), 2, CHECKS)


def test_one_rank_applies_the_scaling_alone(tmp_path: Path):
    """One rank: the same arithmetic, with no fusion buffer packed (timeline)."""
    env = {"HOROVODISH_TIMELINE": str(tmp_path / "timeline.json")}
    assert_ranks_ok(run_ranks(WORKER, 1, env=env, timeout=180), 1, CHECKS)
