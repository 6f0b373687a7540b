"""DistributedGradientTape and Keras 3 training on 2 ranks, against one process on the
whole batch: the tape's gradients, model.fit weights and logged loss, MetricAverageCallback,
the learning-rate callbacks, backward_passes_per_step (its state kept out of the
optimizer's), load_model, checkpoints and resuming from one on rank 0 alone."""
from __future__ import annotations

from pathlib import Path

from multirank import assert_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "keras_worker.py"


def test_tape_fit_callbacks_and_aggregation():
    result = run_ranks(WORKER, 2, timeout=420)
    assert_ok(result)
    for rank in range(2):
        assert f"OK keras rank {rank} of 2" in result.stdout, result.stdout
