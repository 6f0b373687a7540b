"""Horovod import path (a shim): Horovod's ``horovod.runner.common.util.env``: this process's rank and size as its
launcher gave them, before ``init()`` (Horovod's test suites and some scripts decide
what to run from them)."""
from __future__ import annotations

import os

# (rank, size) variables: Horovod's own launcher (Gloo), Open MPI, then MPICH/PMI.
_PAIRS = (("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
          ("PMI_RANK", "PMI_SIZE"))


def get_env_rank_and_size() -> tuple[int, int]:
    """(rank, size) from the first launcher's pair of variables that is set; (0, 1)
    without a launcher. One variable of a pair without the other is a broken
    environment: RuntimeError naming both."""
    for rank_name, size_name in _PAIRS:
        rank, size = os.environ.get(rank_name), os.environ.get(size_name)
        if rank is not None and size is not None:
            return int(rank), int(size)
        if rank is not None or size is not None:
            raise RuntimeError(f"cannot tell this process's rank and size: only one of "
                               f"{rank_name} and {size_name} is set")
    return 0, 1
