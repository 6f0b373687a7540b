"""PyTorch training on real ranks: DistributedOptimizer, broadcasts, autograd of the
collectives, SyncBatchNorm and buffer strategies. One job per worker and world size;
each worker runs many named checks against independent references, every one reported
per rank (tests/worker_support.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKERS = Path(__file__).parent / "workers"
CHECKS = {
    "optimizer_worker.py": [
        "equivalence", "gradient_identity", "branch_on_one_rank", "sparse", "sparse_adam",
        "sparse_on_some_ranks_in_the_first_step", "join_before_the_first_step",
        "parameter_order_differs_between_ranks", "rebuilt_optimizer_on_one_rank", "muon",
        "errors", "parameter_names", "untracked_parameters", "broadcast_optimizer_state",
        "scheduler_built_before_wrapping", "learned_order", "learned_order_follows_use",
        "overlap_with_backward", "flat_bucket_views", "changed_graph", "reordered_backward",
        "backward_twice_before_step"],
    "autograd_worker.py": [
        "allreduce_gradients", "allgather_gradients", "grouped_allgather_gradients",
        "broadcast_gradients", "alltoall_gradients", "reducescatter_gradients",
        "grouped_reducescatter_gradients", "no_grad_paths"],
    "modules_worker.py": ["sync_batch_norm", "buffer_strategies", "optimizer_buffer_sync"],
}


def _run(worker: str, np: int, env: dict[str, str] | None = None,
         extra: tuple[str, ...] = ()) -> None:
    result = run_ranks(WORKERS / worker, np, env=env, timeout=180)
    assert_ranks_ok(result, np, [*CHECKS[worker], *extra])


@pytest.mark.parametrize("np", [2, 3])
def test_distributed_optimizer(np):
    """Equivalence with one process on the whole batch (SGD, Adam, AdamW, accumulation,
    Sum, predivide, groups, compression, sparse, a one-rank branch, a sparse gradient on
    one rank in the first step, a rank that joins before it), errors, Muon,
    broadcast_optimizer_state, and fewer negotiation cycles once the order is learned."""
    _run("optimizer_worker.py", np)


@pytest.mark.parametrize("worker", ["optimizer_worker.py", "autograd_worker.py",
                                    "modules_worker.py"])
def test_host_staged_path_that_cuda_tensors_take(worker):
    """Every tensor copied to host memory and its result copied back, as for a CUDA
    tensor (see workers/torch_staging.stage_every_tensor): the same checks must hold."""
    _run(worker, 2, {"STAGE_THROUGH_HOST": "1"}, extra=("staged_through_host",))


@pytest.mark.parametrize("np", [2, 3])
def test_collective_gradients(np):
    _run("autograd_worker.py", np)


@pytest.mark.parametrize("np", [2, 3])
def test_sync_batch_norm_and_buffer_strategies(np):
    _run("modules_worker.py", np)


@pytest.mark.parametrize("np", [2, 3])
def test_adasum_delta_optimizer(np):
    result = run_ranks(WORKERS / "adasum_optimizer_worker.py", np)
    checks = ["overflow_on_one_rank_skips_every_rank", "follows_the_delta_rule",
              "ranks_agree"] if np & (np - 1) == 0 else ["rejects_a_non_power_of_two_world"]
    assert_ranks_ok(result, np, checks)


def test_elastic_state_and_retry():
    result = run_ranks(WORKERS / "elastic_worker.py", 2)
    assert_ranks_ok(result, 2, ["commit_and_restore", "run_retries_after_a_failure",
                                "kept_in_place", "failure_inside_step"])
