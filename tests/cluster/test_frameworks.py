"""PyTorch and TensorFlow/Keras training across 2 hosts x 2 ranks equals one process on
the whole batch (workers/torch_worker.py, workers/tf_worker.py)."""
from __future__ import annotations

import pytest

from multirank import assert_ranks_ok

from .jobs import run_job


def test_torch_distributed_optimizer_and_collectives(cluster):
    pytest.importorskip("torch")
    result = run_job(cluster, "torch_worker.py", timeout=150)
    assert_ranks_ok(result, 4, ["check_distributed_optimizer", "check_collectives"])


def test_tensorflow_tape_and_keras_fit(cluster):
    pytest.importorskip("tensorflow")
    result = run_job(cluster, "tf_worker.py", timeout=240)
    assert_ranks_ok(result, 4, ["check_tape", "check_fit"])
