"""SyncBatchNormalization (outputs, gradients, moving statistics, masks, model.fit) against
one process on the whole batch; PartialDistributedGradientTape/Optimizer (local layers keep
their own gradients, scaled or not) against each rank's own gradients, a local overflow under
mixed_float16 skipping the step on every rank, and the broadcast
callback's local_variables; the ``horovodish.keras`` module; Horovod's smaller names
(layout ops, broadcast_object_fn, ignore_name_scope, use_generic_names) and the short
tensor listing of a tf.function error; on 3 ranks."""
from __future__ import annotations

from pathlib import Path

import pytest
from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "layers_worker.py"
CHECKS = ["keras_module", "horovod_names", "partial_tape", "partial_optimizer",
          "aggregation_after_failure", "local_overflow_under_mixed_precision",
          "sync_batch_norm"]


# 3 ranks only: an uneven split of every batch, and every path 2 ranks take (a TensorFlow
# job costs seconds of imports per rank: CI time).
@pytest.mark.parametrize("np_", [3])
def test_sync_batch_norm_local_layers_and_keras_module(np_):
    result = run_ranks(WORKER, np_, timeout=240)
    assert_ranks_ok(result, np_, CHECKS)
