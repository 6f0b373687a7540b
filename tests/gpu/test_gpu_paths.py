"""Every collective on CUDA tensors, stream-correct completion and DistributedOptimizer,
on NCCL (1 rank: NCCL refuses two ranks on one GPU) and host-staged (2 and 4 ranks on
the one GPU). Skipped without a GPU (conftest.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "gpu_worker.py"
CHECKS = ["the_path_is_the_one_chosen", "allreduce_every_op_and_dtype",
          "grouped_in_place_and_owned_allreduce",
          "allgather_broadcast_alltoall_reducescatter", "completion_without_a_host_wait",
          "distributed_optimizer_matches_one_process"]


@pytest.mark.parametrize("np,path", [(1, "nccl"), (1, "default"), (2, "mpi"), (4, "mpi")])
def test_cuda_tensors(np, path):
    """default: no variable set, where CuPy's NCCL loads: the NCCL path."""
    env = {} if path == "default" else {"HOROVODISH_GPU_OPERATIONS": path}
    result = run_ranks(WORKER, np, env=env,
                       timeout=float(os.environ.get("HOROVODISH_GPU_TEST_TIMEOUT", 240)))
    assert_ranks_ok(result, np, CHECKS)
