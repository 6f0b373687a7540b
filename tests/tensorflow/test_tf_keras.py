"""DistributedGradientTape and Keras 3 training on 2 ranks, against one process on the
whole batch: the tape's gradients, model.fit weights and logged loss, MetricAverageCallback,
the learning-rate callbacks, backward_passes_per_step (its state kept out of the
optimizer's), load_model, checkpoints and resuming from one on rank 0 alone. Then, in the
same job, hvd.elastic for TensorFlow and Keras (workers/elastic_checks.py):
(a) TensorFlowState and run(): a failure inside tf.function after an uncommitted update;
the retry resumes at the last commit and ends where numpy does;
(b) model.fit with KerasState and the three callbacks: failures mid-epoch and between an
epoch's last batch and its commit; each retry resumes at the last committed epoch and
batch, runs only what remained of the epoch, and ends with the same weights on every
rank as plain Keras on the global batches;
(c) sync() gives every rank rank 0's variables, optimizer state and attributes, and a
commit from before the optimizer's first step restores."""
from __future__ import annotations

from pathlib import Path

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "keras_worker.py"
CHECKS = ["distributed_gradient_tape", "fit", "resume", "aggregation_state", "lr_callbacks",
          "aggregation", "value_collectives",
          # hvd.elastic
          "sync", "epoch_numbering", "tensorflow_state", "keras_fit"]


def test_tape_fit_callbacks_aggregation_and_elastic_state():
    result = run_ranks(WORKER, 2, timeout=420)
    assert_ranks_ok(result, 2, CHECKS)
