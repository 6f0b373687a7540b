"""hvd.elastic for TensorFlow and Keras 3 on 2 ranks, one job (see the worker):
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

WORKER = Path(__file__).parent / "workers" / "elastic_worker.py"
CHECKS = ["sync", "epoch_numbering", "tensorflow_state", "keras_fit"]


def test_elastic_state_retry_and_fit():
    result = run_ranks(WORKER, 2, timeout=180)
    assert_ranks_ok(result, 2, CHECKS)
