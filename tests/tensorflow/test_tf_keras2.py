"""The Keras adapter under tf_keras (Keras 2, TF_USE_LEGACY_KERAS=1) on 2 ranks, against
one process on the whole batch (tests/tensorflow/workers/keras2_worker.py): model.fit with
Keras 2's optimizers and OptimizerV2, the get_gradients path, backward_passes_per_step,
sparse gradients as they are and as dense, the broadcast, metric-average and learning-rate
callbacks, load_model with custom objects, SyncBatchNormalization, the refusal of a Keras
3 optimizer, and hvd.elastic's checks (workers/elastic_checks.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "keras2_worker.py"
CHECKS = ["keras_is_tf_keras", "fit_matches_one_process", "get_gradients_path",
          "aggregation", "sparse_as_dense", "lr_callbacks", "load_model", "sync_batch_norm",
          "refuses_a_keras3_optimizer",
          # hvd.elastic
          "sync", "epoch_numbering", "tensorflow_state", "keras_fit"]


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                    reason="tf_keras is not installed")
def test_keras2_through_tf_keras():
    result = run_ranks(WORKER, 2, env={"TF_USE_LEGACY_KERAS": "1"}, timeout=420)
    assert_ranks_ok(result, 2, CHECKS)
