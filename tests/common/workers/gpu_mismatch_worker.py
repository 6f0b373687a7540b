"""Device mismatches across ranks, through the core API on host memory (no GPU needed:
what is compared is the request's device string): a CPU tensor on rank 0 and a CUDA
one elsewhere, then NCCL on rank 0 and host staging elsewhere. Every rank's handle
fails naming the tensor, and the runtime goes on."""
from __future__ import annotations


import numpy as np

from worker_support import check, close, expect_error, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.errors import HorovodInternalError  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402


def _allreduce(name: str, device: str):
    value = np.ones(4, np.float32)
    return collectives.allreduce_async(value, np.empty_like(value), name, ReduceOp.SUM,
                                       device=device).wait()


def cpu_on_rank_0_cuda_elsewhere(rank: int, size: int) -> None:
    device = "cpu" if rank == 0 else "cuda/host"
    expect_error(lambda: _allreduce("mixed.devices", device), HorovodInternalError,
                 "'mixed.devices'", "device class", "cpu", "cuda", what="cpu vs cuda")


def nccl_on_rank_0_staged_elsewhere(rank: int, size: int) -> None:
    device = "cuda" if rank == 0 else "cuda/host"
    expect_error(lambda: _allreduce("mixed.paths", device), HorovodInternalError,
                 "'mixed.paths'", "HOROVODISH_GPU_OPERATIONS", what="nccl vs staged")


def the_runtime_goes_on(rank: int, size: int) -> None:
    close(_allreduce("after", "cuda/host"), np.full(4, float(size)), "staged sum")
    check(collectives.cuda_device.__doc__ is not None, "placement documented")


if __name__ == "__main__":
    api.init()
    run_checks([cpu_on_rank_0_cuda_elsewhere, nccl_on_rank_0_staged_elsewhere,
                the_runtime_goes_on], api.rank(), api.size())
    api.shutdown()
