"""DistributedGradientTape and Keras 3 training on 2 ranks, against one process on the
whole batch: the tape's gradients, model.fit weights and logged loss, MetricAverageCallback,
the learning-rate callbacks, backward_passes_per_step (its state kept out of the
optimizer's), load_model, checkpoints and resuming from one on rank 0 alone."""
from __future__ import annotations

from pathlib import Path

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "keras_worker.py"
CHECKS = ["distributed_gradient_tape", "fit", "resume", "aggregation_state", "lr_callbacks",
          "aggregation", "value_collectives"]


def test_tape_fit_callbacks_and_aggregation():
    result = run_ranks(WORKER, 2, timeout=420)
    assert_ranks_ok(result, 2, CHECKS)
