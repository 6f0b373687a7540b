"""Collectives in tf.compat.v1 graphs run by a Session (Horovod's graph mode), on 1, 2 and 3
ranks against numpy: gradients (the broadcast's once hung every rank), Horovod's error
types, in-place broadcasts, broadcast_global_variables, barrier, sparse averages."""
from __future__ import annotations

from pathlib import Path

import pytest
from multirank import assert_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "graph_worker.py"


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_graph_mode_collectives(np_):
    result = run_ranks(WORKER, np_, timeout=150)
    assert_ok(result)
    for rank in range(np_):
        assert f"OK graph rank {rank} of {np_}" in result.stdout, result.stdout
