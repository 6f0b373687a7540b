"""TensorFlow collectives on real ranks under the launcher, against numpy references.

One launch per world size runs every check (TensorFlow's import alone takes seconds):
each collective x dtype, eagerly and in tf.function; their gradients; mismatch errors
that name the tensor; IndexedSlices; compression; variables; objects; join; process sets.
Then the same ops in tf.compat.v1 graphs run by a Session (Horovod's graph mode,
workers/graph_checks.py): gradients (the broadcast's once hung every rank), Horovod's
error types, in-place broadcasts, broadcast_global_variables, barrier, sparse averages,
the legacy optimizer, a session.run interrupted by an alarm. At 3 ranks, last, Keras
layers across ranks (workers/layers_checks.py): SyncBatchNormalization (outputs,
gradients, moving statistics, masks, model.fit) against one process on the whole batch;
PartialDistributedGradientTape/Optimizer (local layers keep their own gradients, scaled
or not) against each rank's own gradients, a local overflow under mixed_float16
skipping the step on every rank, and the broadcast callback's local_variables; the
``horovodish.keras`` module; Horovod's smaller names (layout ops, broadcast_object_fn,
ignore_name_scope, use_generic_names) and the short tensor listing of a tf.function
error.
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
LAYERS_CHECKS = ["keras_module", "horovod_names", "partial_tape", "partial_optimizer",
                 "aggregation_after_failure", "local_overflow_under_mixed_precision",
                 "sync_batch_norm"]


# 1 rank (the size-1 paths) and 3 (uneven splits, odd sizes): 2 ranks take no path of
# their own here (the bench, examples and Keras tests run TensorFlow on 2), and a
# TensorFlow job costs seconds of imports per rank (CI time).
@pytest.mark.parametrize("np", [1, 3])
def test_collectives_gradients_and_errors(np):
    result = run_ranks(WORKER, np, timeout=360)
    assert_ranks_ok(result, np, [*CHECKS, *(LAYERS_CHECKS if np > 1 else [])])
