"""TensorFlow collectives on real ranks under the launcher, against numpy references.

One launch per world size runs every check (TensorFlow's import alone takes seconds):
each collective x dtype, eagerly and in tf.function; their gradients; mismatch errors
that name the tensor; IndexedSlices; compression; variables; objects; join; process sets.
Then the same ops in tf.compat.v1 graphs run by a Session (Horovod's graph mode,
workers/graph_checks.py): gradients (the broadcast's once hung every rank), Horovod's
error types, in-place broadcasts, broadcast_global_variables, barrier, sparse averages,
the legacy optimizer, a session.run interrupted by an alarm.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "collectives_worker.py"
CHECKS = ["use_before_init", "collectives", "gradients", "eager_tape_over_tf_function",
          "second_order", "mismatch", "sparse_and_compression", "variables_and_objects",
          "process_set", "results_kept_across_calls", "odd_sized_groups", "tape_flat_buckets",
          "gradients_outside_the_set",
          # graph mode
          "broadcast_gradient", "reducescatter_gradient", "errors", "variables",
          "sparse_average", "legacy_optimizer", "legacy_optimizer_accumulates", "interrupt"]


# 1 rank (the size-1 paths) and 3 (uneven splits, odd sizes): 2 ranks take no path of
# their own here (the bench, examples and Keras tests run TensorFlow on 2), and a
# TensorFlow job costs seconds of imports per rank (CI time).
@pytest.mark.parametrize("np", [1, 3])
def test_collectives_gradients_and_errors(np):
    result = run_ranks(WORKER, np, timeout=300)
    assert_ranks_ok(result, np, CHECKS)
