"""PyTorch training on real ranks: DistributedOptimizer, broadcasts, autograd of the
collectives, SyncBatchNorm and buffer strategies. One job per worker and world size;
each worker runs many checks against independent references and prints one OK line."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ok, run_ranks

WORKERS = Path(__file__).parent / "workers"


def _run(worker: str, np: int, env: dict[str, str] | None = None) -> str:
    result = run_ranks(WORKERS / worker, np, env=env, timeout=180)
    assert_ok(result)
    for rank in range(np):
        assert f"OK rank {rank} of {np}" in result.stdout, result.stdout
    return result.stdout


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
    _run(worker, 2, {"STAGE_THROUGH_HOST": "1"})


@pytest.mark.parametrize("np", [2, 3])
def test_collective_gradients(np):
    _run("autograd_worker.py", np)


@pytest.mark.parametrize("np", [2, 3])
def test_sync_batch_norm_and_buffer_strategies(np):
    _run("modules_worker.py", np)


@pytest.mark.parametrize("np", [2, 3])
def test_adasum_delta_optimizer(np):
    result = run_ranks(Path(__file__).parent / "workers" / "adasum_optimizer_worker.py", np)
    assert_ok(result)
    assert result.stdout.count("OK rank") == np, result.stdout


def test_elastic_state_and_retry():
    result = run_ranks(Path(__file__).parent / "workers" / "elastic_worker.py", 2)
    assert_ok(result)
    assert result.stdout.count("OK rank") == 2, result.stdout
