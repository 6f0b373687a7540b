"""Collectives in tf.compat.v1 graphs run by a Session (Horovod's graph mode), on 1 and 3
ranks against numpy: gradients (the broadcast's once hung every rank), Horovod's error
types, in-place broadcasts, broadcast_global_variables, barrier, sparse averages."""
from __future__ import annotations

from pathlib import Path

import pytest
from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "graph_worker.py"
CHECKS = ["broadcast_gradient", "reducescatter_gradient", "errors", "variables",
          "sparse_average", "legacy_optimizer", "legacy_optimizer_accumulates", "interrupt"]


# 1 rank (the size-1 paths) and 3 (uneven, odd): 2 ranks take no path of their own here,
# and a TensorFlow job costs seconds of imports per rank (CI time).
@pytest.mark.parametrize("np_", [1, 3])
def test_graph_mode_collectives(np_):
    result = run_ranks(WORKER, np_, timeout=150)
    assert_ranks_ok(result, np_, CHECKS)
