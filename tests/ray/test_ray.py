"""horovodish on a real Ray cluster (a local head with the machine's 2 CPUs): Horovod's
RayExecutor (every call, results against numpy and one process on the whole batch),
an elastic job whose actor is killed mid-training (final weights against a replay of
what survived), and the Ray Train backend and TorchTrainer training the main job's
model to its accuracy. The two-host cluster's tests are in
tests/cluster/test_ray_cluster.py."""
from __future__ import annotations

import os
import socket

from elastic_replay import (assert_each_sample_once_per_epoch, assert_matches_replay,
                            assert_resumed_after_a_kill_at_step_12, read)
from ray_cluster import run_driver


def test_executor_runs_every_call_on_every_rank(ray_head):
    """Imported as Horovod's scripts do (``from horovod.ray import RayExecutor``, the
    ranks' ``import horovod.torch``), through the compat alias."""
    from horovodish.compat import alias_path
    path = os.pathsep.join([alias_path(), os.environ.get("PYTHONPATH", "")])
    outcome = run_driver(ray_head.address, "executor", "--workers", "2", "--via-horovod",
                         env={"PYTHONPATH": path})
    assert outcome["problems"] == [], outcome["output"]
    here = socket.gethostname()
    assert [(p["rank"], p["host"], p["local_rank"], p["local_size"]) for p in
            outcome["places"]] == [(0, here, 0, 2), (1, here, 1, 2)], outcome


def test_more_workers_than_the_cluster_holds_time_out_in_start(ray_head):
    outcome = run_driver(ray_head.address, "infeasible", "--workers", "3")
    assert outcome["problems"] == [], outcome["output"]


def test_an_actor_killed_mid_training_and_the_job_goes_on(ray_head, tmp_path):
    """min_workers=1, max_workers=2: rank 1's actor SIGKILLs itself after step 12; the
    next generation (2 workers again, Ray has the slots) resumes from commit 2."""
    outcome = run_driver(ray_head.address, "elastic", str(tmp_path), timeout=400)
    assert outcome["problems"] == [] and outcome["generations"] == [2, 2], outcome
    assert_resumed_after_a_kill_at_step_12(tmp_path, (2, 2))


def test_new_slots_join_at_the_next_commit(ray_head, tmp_path):
    """A discovery (Horovod's interface, override_discovery=False) that gives 1 slot,
    then 2 once rank 0 has written so after step 8: the next commit ends generation 1
    and generation 2 runs on 2 workers from it, nothing rolled back."""
    outcome = run_driver(ray_head.address, "grow", str(tmp_path), timeout=400)
    assert outcome["problems"] == [] and outcome["generations"] == [1, 2], outcome
    schedule = read(tmp_path)
    first, second = schedule.generations
    assert (first.size, second.size) == (1, 2)
    assert schedule.rolled_back == 0 and second.resume_step > 8, second
    assert_each_sample_once_per_epoch(schedule, 1797)
    assert_matches_replay(tmp_path, schedule)


def test_ray_train_backend_trains_the_main_job(ray_head, tmp_path):
    outcome = run_driver(ray_head.address, "train-horovodish", "--storage", str(tmp_path))
    assert outcome["problems"] == [], outcome["output"]
    assert outcome["metrics"]["size"] == 2 and outcome["metrics"]["accuracy"] >= 0.95, outcome


def test_torch_trainer_scripts_that_call_hvd_init(ray_head, tmp_path):
    outcome = run_driver(ray_head.address, "train-torch", "--storage", str(tmp_path))
    assert outcome["problems"] == [], outcome["output"]
    assert outcome["metrics"]["size"] == 2 and outcome["metrics"]["accuracy"] >= 0.95, outcome


def test_horovod_0_21_names_of_the_executor_s_shape():
    """num_hosts x num_slots workers with cpus_per_slot/gpus_per_slot, the names
    Horovod's examples/ray/tensorflow2_mnist_ray.py still uses, are the current ones."""
    from horovodish.ray import RayExecutor
    executor = RayExecutor(RayExecutor.create_settings(), num_hosts=2, num_slots=4,
                           cpus_per_slot=8, use_gpu=True, gpus_per_slot=2)
    assert (executor.num_hosts, executor.num_workers_per_host, executor.cpus_per_worker,
            executor.gpus_per_worker) == (2, 4, 8, 2)


def test_elastic_ray_executor_with_gpus_through_the_alias(ray_head):
    """ElasticRayExecutor(use_gpu=True) as Horovod's examples/ray/pytorch_ray_elastic.py
    starts it: a slot per (logical) GPU, every worker seeing its node's GPUs in
    CUDA_VISIBLE_DEVICES (Horovod's rule), the collectives and the training run against
    their references."""
    from horovodish.compat import alias_path
    path = os.pathsep.join([alias_path(), os.environ.get("PYTHONPATH", "")])
    outcome = run_driver(ray_head.address, "elastic-executor", env={"PYTHONPATH": path},
                         timeout=300)
    assert outcome["problems"] == [], outcome["output"][-5000:]
