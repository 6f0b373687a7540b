"""horovodish on a real Spark cluster (local-cluster: separate executor JVMs):
``horovodish.spark.run`` with torch and with TensorFlow (values in rank order, against
numpy and one process on the whole batch), a raising rank failing the call with its
message, ``run_elastic`` going on from the last commit after a rank is killed (final
weights against a replay), and Spark's own TorchDistributor running a horovodish torch
script."""
from __future__ import annotations

import os
import pickle
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

import ray_spark_jobs as jobs
from elastic_replay import assert_resumed_after_a_kill_at_step_12

import horovodish.spark

SCRIPT = Path(__file__).parent / "workers" / "distributor_script.py"


def test_run_gives_every_rank_s_value_in_rank_order(spark):
    results = horovodish.spark.run(jobs.collectives_and_training, num_proc=2)
    assert jobs.collective_problems([places for places, _ in results]) == []
    for _, weights in results:
        np.testing.assert_allclose(weights, jobs.reference_weights(2), rtol=1e-10,
                                   atol=1e-12)


def test_run_with_tensorflow(spark):
    weights = horovodish.spark.run(jobs.tensorflow_training)  # num_proc: parallelism, 2
    assert len(weights) == 2
    for w in weights:
        np.testing.assert_allclose(w, jobs.reference_weights(2), rtol=1e-10, atol=1e-12)


def test_a_raising_rank_fails_the_call_with_its_message(spark):
    with pytest.raises(horovodish.spark.SparkJobError,
                       match=r"rank 1 failed: ValueError: rank 1 failed on purpose"):
        horovodish.spark.run(jobs.raise_on, args=(1,), num_proc=2)


def test_more_ranks_than_task_slots_fail_the_call(spark):
    """3 ranks on 2 executor cores: a barrier stage that cannot be scheduled whole.
    (The tests' Spark gives up on it at once; with Spark's defaults it retries for
    minutes, and the start timeout ends the wait: TimeoutError.)"""
    with pytest.raises((RuntimeError, TimeoutError),
                       match=r"Timed out waiting for Spark tasks|3 ranks need 3 task slots"):
        horovodish.spark.run(jobs.collectives, num_proc=3, start_timeout=20)


def test_run_elastic_goes_on_from_the_last_commit(spark, tmp_path):
    assert horovodish.spark.run_elastic(jobs.elastic_digits, args=(str(tmp_path), "--kill", "1", "12"),
                                        num_proc=2, reset_limit=1) == ["done", "done"]
    assert_resumed_after_a_kill_at_step_12(tmp_path, (2, 2))


def test_torch_distributor_runs_a_horovodish_script(spark, tmp_path):
    from pyspark.ml.torch.distributor import TorchDistributor
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        str(SCRIPT), str(tmp_path))
    results = [pickle.loads((tmp_path / f"rank{r}.pickle").read_bytes()) for r in range(2)]
    assert jobs.collective_problems(results) == []
    assert [r["LOCAL_RANK"] for r in results] == ["0", "0"]  # as TorchDistributor gives
    here = socket.gethostname()
    assert [(r["host"], r["local_rank"], r["local_size"]) for r in results] == \
        [(here, 0, 2), (here, 1, 2)]


def test_a_horovod_spark_run_script_through_the_compat_alias(spark):
    """``import horovod.spark; horovod.spark.run(fn)`` with fn's own ``import
    horovod.torch``: both resolve to horovodish through the alias."""
    from horovodish.compat import alias_path
    path = os.pathsep.join([alias_path(), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, alias_path())
    try:
        import horovod.spark
        results = horovod.spark.run(jobs.horovod_style, num_proc=2, env={"PYTHONPATH": path})
    finally:
        sys.path.remove(alias_path())
        for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
            del sys.modules[name]
    assert results == [(0, 2, [3.0, 3.0]), (1, 2, [3.0, 3.0])]
