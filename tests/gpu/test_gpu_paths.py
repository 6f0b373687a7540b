"""Every collective on CUDA tensors, stream-correct completion and DistributedOptimizer,
on NCCL at 1 rank, on NCCL between 2 and 4 ranks on the one GPU (each rank with its own
NCCL_HOSTID: distinct_hosts.py), host-staged (2 and 4 ranks), and host-staged through the
hierarchical allreduce (4 ranks as two hosts). Skipped without a GPU (conftest.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "gpu_worker.py"
DISTINCT_HOSTS = Path(__file__).parent / "distinct_hosts.py"
CHECKS = ["the_path_is_the_one_chosen", "allreduce_every_op_and_dtype",
          "grouped_in_place_and_owned_allreduce",
          "allgather_broadcast_alltoall_reducescatter", "completion_without_a_host_wait",
          "distributed_optimizer_matches_one_process"]


@pytest.mark.parametrize("np,path", [(1, "nccl"), (1, "default"), (2, "nccl"), (4, "nccl"),
                                     (2, "mpi"), (4, "mpi"), (4, "hierarchical")])
def test_cuda_tensors(np, path):
    """default: no variable set, where CuPy's NCCL loads: the NCCL path. NCCL at several
    ranks: each rank its own NCCL_HOSTID, so NCCL takes the ranks on one GPU for hosts.
    hierarchical: staged through the host, the ranks as two hosts of two (NCCL's own
    two levels need two GPUs a host, which one GPU cannot give)."""
    env = {} if path == "default" else {"HOROVODISH_GPU_OPERATIONS": path}
    checks = CHECKS
    if path == "hierarchical":
        env = {"HOROVODISH_GPU_OPERATIONS": "mpi", "HOROVODISH_HIERARCHICAL_ALLREDUCE": "1",
               "HOROVODISH_TEST_HOSTS": "2"}
        checks = [*CHECKS, "the_hierarchical_allreduce_is_the_one_chosen"]
    script, args = (DISTINCT_HOSTS, [WORKER]) if path == "nccl" and np > 1 else (WORKER, [])
    result = run_ranks(script, np, args=args, env=env,
                       timeout=float(os.environ.get("HOROVODISH_GPU_TEST_TIMEOUT", 240)))
    assert_ranks_ok(result, np, checks)
