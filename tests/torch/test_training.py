"""PyTorch training on real ranks: DistributedOptimizer, broadcasts, autograd of the
collectives, SyncBatchNorm and buffer strategies, Adasum, elastic state. One job per world
size runs many named checks against independent references, every one reported per rank
(tests/worker_support.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multirank import assert_ranks_ok, run_ranks

WORKERS = Path(__file__).parent / "workers"
CHECKS = [
    # optimizer_checks.py
    "equivalence", "gradient_identity", "branch_on_one_rank", "sparse", "sparse_adam",
    "sparse_on_some_ranks_in_the_first_step", "join_before_the_first_step",
    "parameter_order_differs_between_ranks", "rebuilt_optimizer_on_one_rank", "muon",
    "errors", "parameter_names", "one_runtime_attribute", "untracked_parameters",
    "broadcast_optimizer_state",
    "scheduler_built_before_wrapping", "learned_order", "learned_order_follows_use",
    "overlap_with_backward", "flat_bucket_views", "changed_graph", "reordered_backward",
    "backward_twice_before_step",
    # autograd_checks.py
    "allreduce_gradients", "allgather_gradients", "grouped_allgather_gradients",
    "broadcast_gradients", "alltoall_gradients", "reducescatter_gradients",
    "grouped_reducescatter_gradients", "no_grad_paths",
    # modules_checks.py
    "sync_batch_norm", "buffer_strategies", "optimizer_buffer_sync"]


@pytest.mark.parametrize("np", [2, 3])
def test_optimizer_collective_gradients_and_sync_batch_norm(np):
    """Equivalence with one process on the whole batch (SGD, Adam, AdamW, accumulation,
    Sum, predivide, groups, compression, sparse, a one-rank branch, a sparse gradient on
    one rank in the first step, a rank that joins before it), errors, Muon,
    broadcast_optimizer_state, fewer negotiation cycles once the order is learned; the
    gradient of every collective; SyncBatchNorm and buffer strategies."""
    result = run_ranks(WORKERS / "training_worker.py", np, timeout=300)
    assert_ranks_ok(result, np, CHECKS)


def test_host_staged_path_that_cuda_tensors_take():
    """Every tensor copied to host memory and its result copied back, as for a CUDA
    tensor (see workers/torch_staging.stage_every_tensor): the same checks must hold."""
    result = run_ranks(WORKERS / "training_worker.py", 2, env={"STAGE_THROUGH_HOST": "1"},
                       timeout=300)
    assert_ranks_ok(result, 2, [*CHECKS, "staged_through_host"])


@pytest.mark.parametrize("np", [2, 3])
def test_adasum_delta_optimizer(np):
    result = run_ranks(WORKERS / "adasum_optimizer_worker.py", np)
    # GradScaler on CPU tensors arrived in torch 2.3: the worker checks it where it exists.
    scaled = ["overflow_on_one_rank_skips_every_rank"] if hasattr(torch.amp, "GradScaler") \
        else []
    checks = [*scaled, "follows_the_delta_rule", "ranks_agree"] if np & (np - 1) == 0 \
        else ["rejects_a_non_power_of_two_world"]
    assert_ranks_ok(result, np, checks)


def test_elastic_state_and_retry():
    result = run_ranks(WORKERS / "elastic_worker.py", 2)
    assert_ranks_ok(result, 2, ["commit_and_restore", "run_retries_after_a_failure",
                                "kept_in_place", "failure_inside_step"])
